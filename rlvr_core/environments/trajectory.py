"""A multi-turn rollout as segments of token ids: what the policy sampled and what the environment answered.

Token-in/token-out: a trajectory is never decoded and re-encoded. The next turn's prompt is the ids so far, the
ids the engine sampled (the stop token it actually sampled included), and the observation's ids rendered by the
template's boundary adapter. The trainer sees exactly these ids; its loss mask is 1 on model segments and 0 on
everything else, and its old log-probs are the engine's for model tokens (0 elsewhere, masked).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Role = Literal["model", "env"]
# Why a trajectory ended: the environment said done, or a budget cut it (each handled as configured).
ENDS = ("done", "max_turns", "max_total_tokens", "deadline", "length")


class TrajectoryError(ValueError):
    """A trajectory whose ids, log-probs and mask disagree: training on it would misalign every token."""


@dataclass(frozen=True)
class Segment:
    """One turn's ids: the model's (with the engine's raw log-probs, one per id, and the weight version that
    sampled them) or the environment's (an observation plus the template's boundary tokens; no log-probs)."""

    role: Role
    token_ids: tuple[int, ...]
    turn: int
    logprobs: tuple[float, ...] | None = None
    weight_version: int | None = None

    def __post_init__(self) -> None:
        if self.role not in ("model", "env"):
            raise TrajectoryError(f"segment role must be 'model' or 'env', got {self.role!r}")
        if self.role == "model":
            if self.logprobs is None or len(self.logprobs) != len(self.token_ids):
                got = None if self.logprobs is None else len(self.logprobs)
                raise TrajectoryError(f"turn {self.turn}: a model segment of {len(self.token_ids)} ids has {got} "
                                      "log-probs")
        elif self.logprobs is not None:
            raise TrajectoryError(f"turn {self.turn}: an environment segment carries log-probs: its tokens were "
                                  "not sampled by the policy")


@dataclass
class Trajectory:
    """The first prompt's ids, then the segments in order; the outcome reward and per-turn rewards; why it ended;
    tool calls made and how many failed (timed out, raised, or were malformed)."""

    prompt_ids: tuple[int, ...]
    segments: list[Segment] = field(default_factory=list)
    reward: float = 0.0
    turn_rewards: list[float | None] = field(default_factory=list)
    end: str = "done"
    tool_calls: int = 0
    tool_errors: int = 0
    text: str = ""  # the model's final turn, decoded, for the verifier and for people (never re-encoded)
    seed: int = 0  # the first turn's request seed
    # For people, not for training (not stored as segments): per model turn, when the engine sampled it (ns), how
    # many ids, and the tool call it made (name, argument, answer, error, when it ran). Traces show it as spans.
    turn_log: list[dict] = field(default_factory=list, compare=False)

    @property
    def turns(self) -> int:
        return sum(1 for s in self.segments if s.role == "model")

    @property
    def cut(self) -> bool:
        """A budget ended it (not the environment): flagged, and handled as configured, never a silent 0."""
        return self.end != "done"

    def completion_ids(self) -> list[int]:
        """Every id after the first prompt, in order: what the trainer scores after `prompt_ids`."""
        return [t for s in self.segments for t in s.token_ids]

    def logprobs(self) -> list[float]:
        """The engine's log-probs of the model's ids, 0.0 on the environment's (masked out)."""
        return [lp for s in self.segments for lp in (s.logprobs if s.role == "model" else (0.0,) * len(s.token_ids))]

    def loss_mask(self) -> list[int]:
        """1 on ids the policy wrote, 0 on observations and template tokens."""
        return [int(s.role == "model") for s in self.segments for _ in s.token_ids]

    def context_ids(self) -> list[int]:
        """The ids the engine is given for the next turn: the prompt and every segment so far."""
        return [*self.prompt_ids, *self.completion_ids()]


def check_aligned(ids: list[int], logprobs: list[float], mask: list[int], *, where: str) -> None:
    """Ids, log-probs and mask cut together: one length, a 0/1 mask (TRL #5145: lengths that drifted apart)."""
    if not (len(ids) == len(logprobs) == len(mask)):
        raise TrajectoryError(f"{where}: {len(ids)} ids, {len(logprobs)} log-probs and {len(mask)} mask entries; "
                              "they must be cut together")
    if any(m not in (0, 1) for m in mask):
        raise TrajectoryError(f"{where}: the loss mask holds values other than 0 and 1")


# The warehouse's `rollout_segments` rows: one per segment (segment 0 is the first prompt, role "prompt"), each
# with the trajectory's outcome, so a trajectory can be read back and replayed through the trainer.
SEGMENT_COLUMNS = ("segment", "role", "turn", "token_ids", "logprobs", "weight_version", "reward", "end",
                   "tool_calls", "tool_errors", "text")


def to_rows(traj: Trajectory) -> list[dict]:
    """The trajectory as plain rows (SEGMENT_COLUMNS), in order."""
    common = {"reward": traj.reward, "end": traj.end, "tool_calls": traj.tool_calls,
              "tool_errors": traj.tool_errors, "text": traj.text}
    rows = [{"segment": 0, "role": "prompt", "turn": -1, "token_ids": list(traj.prompt_ids), "logprobs": None,
             "weight_version": None, **common}]
    for i, s in enumerate(traj.segments, 1):
        rows.append({"segment": i, "role": s.role, "turn": s.turn, "token_ids": list(s.token_ids),
                     "logprobs": None if s.logprobs is None else list(s.logprobs),
                     "weight_version": s.weight_version, **common})
    return rows


def from_rows(rows: list[dict]) -> Trajectory:
    """`to_rows` read back (rows in any order); raises TrajectoryError on a missing or doubled segment."""
    ordered = sorted(rows, key=lambda r: int(r["segment"]))
    if [int(r["segment"]) for r in ordered] != list(range(len(ordered))) or ordered[0]["role"] != "prompt":
        raise TrajectoryError("rollout_segments rows: segments must be 0..n with the prompt as segment 0")
    head = ordered[0]
    segments = [Segment(r["role"], tuple(int(t) for t in r["token_ids"]), int(r["turn"]),
                        None if r["logprobs"] is None else tuple(float(x) for x in r["logprobs"]),
                        None if r["weight_version"] is None else int(r["weight_version"])) for r in ordered[1:]]
    return Trajectory(tuple(int(t) for t in head["token_ids"]), segments, float(head["reward"]),
                      end=str(head["end"]), tool_calls=int(head["tool_calls"]), tool_errors=int(head["tool_errors"]),
                      text=str(head["text"]))
