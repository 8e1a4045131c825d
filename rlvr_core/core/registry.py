"""The one registry mechanism: everything a config chooses by name (advantage estimators, policy losses, loss
aggregations, KL estimators, verifiers, sampling and rollout engines, curriculum orderings) is registered
with a decorator on the function or class where it lives (the verl habit):

    @register("advantage", "grpo")
    def grpo_advantages(rewards, group_size=None, *, group_ids=None, eps=1e-6): ...

and looked up with `lookup(kind, name)` (or the kind's own `get_advantage`, `get_verifier`, ...), which
imports the kind's home modules (where the built-ins register themselves) on first use.

`KINDS` below is the torch-free list of the built-in names of every kind, with those home modules: config
validation checks a name against it without importing torch (`rlvr config validate` stays fast), and
tests/core/test_registry.py checks it against the live registry, so a name registered in rlvr_core but missing
here, or listed here but registered nowhere, fails. A name registered at runtime (a script's own estimator)
is accepted by the config like a built-in one. Adding an algorithm: the function with its decorator, its
name here, a row in docs/grpo_algorithms.md.
"""

from __future__ import annotations

import importlib
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Names of one kind -> items. `declared`: the built-in names (what is accepted before `home` is imported);
    `home`: the modules whose import registers them; `check`: called on each item as it is registered."""

    def __init__(self, kind: str, declared: tuple[str, ...] = (), home: tuple[str, ...] = (),
                 check: Callable[[str, T], None] | None = None):
        self.kind = kind  # for messages: "unknown <kind> 'x'; known: [...]"
        self.declared = tuple(declared)
        self.home = tuple(home)
        self.check = check
        self._items: dict[str, T] = {}  # registered so far (the home modules register the built-ins on import)
        self._loaded = False

    def add(self, name: str, item: T) -> T:
        if name in self._items:
            raise ValueError(f"{self.kind} {name!r} registered twice")
        if self.check is not None:
            self.check(name, item)
        self._items[name] = item
        return item

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator form of `add`."""
        return lambda item: self.add(name, item)

    def load(self) -> None:
        """Import the home modules once, so every built-in is registered."""
        if self._loaded:
            return
        self._loaded = True  # set first: a home module may look a name up while it is imported
        try:
            for module in self.home:
                importlib.import_module(module)
        except BaseException:
            self._loaded = False
            raise

    def get(self, name: str) -> T:
        if name not in self._items:
            self.load()
        try:
            return self._items[name]
        except KeyError:
            raise KeyError(f"unknown {self.kind} {name!r}; known: {self.names()}") from None

    def live(self) -> list[str]:
        """The names registered so far (after `load`: the built-ins and whatever else has registered)."""
        return sorted(self._items)

    def names(self) -> list[str]:
        """Every name accepted: the declared built-ins and anything registered since; imports nothing."""
        return sorted(set(self.declared) | set(self._items))

    def __contains__(self, name: object) -> bool:
        return name in self._items or name in self.declared


def _registry(kind: str, declared: tuple[str, ...], *home: str) -> Registry:
    return Registry(kind, declared, home)


# ---- the kinds, their built-in names and home modules (torch-free; docs/grpo_algorithms.md, docs/verifiers.md) --
KINDS: dict[str, Registry] = {
    "advantage": _registry("advantage estimator", ("dr_grpo", "grpo", "rloo"), "rlvr_core.grpo.advantages"),
    "policy_loss": _registry("policy loss", ("cispo", "gspo", "luspo", "ppo_clip", "sapo"), "rlvr_core.grpo.losses",
                             "rlvr_core.grpo.policy_losses"),
    "loss_agg": _registry("loss aggregation", ("seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm",
                                               "token-mean"),
                          "rlvr_core.grpo.losses"),
    "kl_estimator": _registry("KL estimator", ("k1", "k2", "k3"), "rlvr_core.grpo.kl"),
    "verifier": _registry("verifier", ("code", "gsm8k", "ifeval", "math", "mcq", "minerva"),
                          *(f"rlvr_core.verifiers.{m}" for m in ("code_exec", "gsm8k", "ifeval", "math_verifier",
                                                                 "mcq", "minerva"))),
    "sampling_engine": _registry("sampling engine", ("hf", "vllm"), "rlvr_core.sampling.registry"),
    "rollout_engine": _registry("rollout engine", ("hf", "vllm", "vllm-server"), "rlvr_core.grpo.rollout_engine"),
    "environment": _registry("environment", ("single_turn", "tools"), "rlvr_core.environments.envs"),
    "ordering": _registry("curriculum ordering", ("bucketed", "easy_to_hard", "hard_to_easy", "interleaved",
                                                  "random"), "rlvr_core.data.curriculum"),
}

ADVANTAGES: Registry[Callable] = KINDS["advantage"]
POLICY_LOSSES: Registry[Callable] = KINDS["policy_loss"]
LOSS_AGGS: Registry[Callable] = KINDS["loss_agg"]
KL_ESTIMATORS: Registry[Callable] = KINDS["kl_estimator"]
VERIFIERS: Registry[Callable] = KINDS["verifier"]
SAMPLING_ENGINES: Registry[Callable] = KINDS["sampling_engine"]
ROLLOUT_ENGINES: Registry[Callable] = KINDS["rollout_engine"]
ORDERINGS: Registry[Callable] = KINDS["ordering"]
ENVIRONMENTS: Registry[Callable] = KINDS["environment"]


def register(kind: str, name: str) -> Callable[[T], T]:
    """Decorator: `@register("advantage", "grpo")` on the function (or class) registers it as `name` of `kind`."""
    return KINDS[kind].register(name)


def lookup(kind: str, name: str):
    """The item registered as `name` of `kind` (KeyError listing the known names when there is none)."""
    return KINDS[kind].get(name)


def names(kind: str) -> list[str]:
    """The names `kind` accepts (built-in and registered), without importing anything."""
    return KINDS[kind].names()
