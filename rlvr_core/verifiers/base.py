"""The verifier interface: one structured outcome per (response, gold) pair.

Why a structured outcome instead of a bool: the seeds lost weeks to verifiers that raised inside an
`except Exception: return False` (BUGZOO G-verifier-error) or hung (G-verifier-hang). Errors and
timeouts are their own statuses, counted and reported, never folded into "incorrect".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Callable, Protocol

from rlvr_core.core.registry import VERIFIERS


class Status(str, Enum):
    CORRECT = "correct"
    INCORRECT = "incorrect"
    NO_ANSWER = "no_answer"  # nothing extractable in the response
    ERROR = "error"  # the verifier itself failed: a bug to count, not a wrong answer
    TIMEOUT = "timeout"  # the verifier ran past its time limit and was killed


@dataclass(frozen=True)
class Outcome:
    status: Status
    reward: float
    extracted: str | None
    verifier: str
    version: str
    detail: str = ""  # why: the error message, which mode matched, …
    extra: dict[str, Any] = field(default_factory=dict)  # verifier-specific (e.g. per-instruction results)

    @property
    def correct(self) -> bool:
        return self.status is Status.CORRECT

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        return d


def shaped_reward(correct: bool, formatted: bool, format_reward: float = 0.0) -> float:
    """Reward with optional format shaping (off by default: `format_reward=0.0`).

    A correct answer earns 1.0 whatever its format. A wrong answer in the expected format earns
    `format_reward` (e.g. 0.1): a small push towards the format so a strict grader does not give
    zero signal to every sample of a model that has not learnt the format yet (BUGZOO
    G-verifier-format). Kept well below 1.0 so the format never pays as much as the answer.
    """
    if not 0.0 <= format_reward < 1.0:
        raise ValueError(f"format_reward must be in [0, 1), got {format_reward}")
    if correct:
        return 1.0
    return format_reward if formatted else 0.0


def error_outcome(name: str, version: str, exc: BaseException) -> Outcome:
    """The outcome for a verifier that raised: status error, reward 0, the message kept for the report."""
    return Outcome(Status.ERROR, 0.0, None, name, version, f"{type(exc).__name__}: {exc}")


def safe_verify(verifier: "Verifier", response: str, gold: Any) -> Outcome:
    """`verifier.verify` with any exception turned into an `error` outcome (never `incorrect`)."""
    try:
        return verifier.verify(response, gold)
    except Exception as exc:  # noqa: BLE001 — counted as an error, never folded into "incorrect"
        return error_outcome(getattr(verifier, "name", "?"), getattr(verifier, "version", "?"), exc)


class Verifier(Protocol):
    """`verify(response, gold)` → Outcome. `gold` is whatever the task's problem row carries.

    Two declarations every registered verifier makes (`register_verifier` refuses a class without them,
    so a new verifier cannot forget them):

    - `can_hang`: False only where no input can make `verify` run long (bounded regexes, no CAS, no
      code execution). Such a verifier may run in the calling process (`VerifierPool(workers=0)`); one
      that can hang (math, minerva, ifeval, code) always runs in killable worker processes.
    - `warm_up()`: do once whatever the first `verify` would do lazily (import sympy, load langdetect's
      profiles, probe the sandbox). The pool calls it in its forkserver and in every worker before the
      worker counts as ready, so no item's time limit pays for a first-use cost.

    Optional: `set_time_limit(seconds)`, the verifier's own limit on one item (math-verify's and
    sympy's interruptible work); the pool sets it to its timeout.
    """

    name: str
    version: str
    can_hang: bool

    def verify(self, response: str, gold: Any) -> Outcome: ...

    def warm_up(self) -> None: ...


def _declarations(name: str, factory: Callable[..., Verifier]) -> None:
    """What every registered verifier declares (checked as it registers, whichever way it does)."""
    if not isinstance(getattr(factory, "can_hang", None), bool):
        raise TypeError(f"verifier {name!r}: declare `can_hang = True` or `False` on the class "
                        "(False only if no input can make verify() run long; see Verifier)")
    if not callable(getattr(factory, "warm_up", None)):
        raise TypeError(f"verifier {name!r}: define `warm_up(self)` (load whatever verify() loads lazily, "
                        "or `pass`; see Verifier)")


# Verifiers are one kind of the project's one registry (rlvr_core/core/registry.py, which lists the built-in
# names): `@register_verifier(NAME)` is `@register("verifier", NAME)`; both check the declarations above.
VERIFIERS.check = _declarations
_REGISTRY = VERIFIERS
register_verifier: Callable[[str], Callable[[Callable[..., Verifier]], Callable[..., Verifier]]] = VERIFIERS.register
