"""One registry class for everything users choose by name in a config (orderings, advantage
estimators, losses, KL estimators, …), so a YAML value maps to exactly one function and every
"unknown name" error lists the known ones the same way.

The GRPO registries are declared here, with each built-in name pointing at its function as a
"module:attribute" target that is imported on first use: the config checks `grpo.advantage`,
`grpo.kl_estimator` and `grpo.loss_agg` against these registries without importing torch, so
`rlvr config validate` stays fast, and a name registered at runtime (`register_advantage` in
rlvr_core.grpo.advantages, …) is accepted by the config like a built-in one.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class _Target:
    """An item not imported yet: "package.module:attribute"."""

    path: str

    def load(self):
        module, _, attribute = self.path.partition(":")
        return getattr(importlib.import_module(module), attribute)


class Registry(Generic[T]):
    def __init__(self, kind: str, targets: dict[str, str] | None = None):
        self.kind = kind  # for messages: "unknown <kind> 'x'; known: [...]"
        # name -> item, or a _Target to import when the name is first looked up
        self._items: dict[str, T | _Target] = {name: _Target(path) for name, path in (targets or {}).items()}

    def add(self, name: str, item: T) -> T:
        if name in self._items:
            raise ValueError(f"{self.kind} {name!r} registered twice")
        self._items[name] = item
        return item

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator form of `add`."""
        return lambda item: self.add(name, item)

    def get(self, name: str) -> T:
        try:
            item = self._items[name]
        except KeyError:
            raise KeyError(f"unknown {self.kind} {name!r}; known: {self.names()}") from None
        if isinstance(item, _Target):
            item = self._items[name] = item.load()
        return item

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items


# ---- GRPO algorithms (docs/grpo_algorithms.md); the functions live in rlvr_core/grpo/ ----------------------
ADVANTAGES: Registry[Callable] = Registry("advantage estimator", {
    "grpo": "rlvr_core.grpo.advantages:grpo_advantages",
    "dr_grpo": "rlvr_core.grpo.advantages:dr_grpo_advantages",
    "rloo": "rlvr_core.grpo.advantages:rloo_advantages",
})
KL_ESTIMATORS: Registry[Callable] = Registry("KL estimator", {
    "k1": "rlvr_core.grpo.kl:kl_k1",
    "k2": "rlvr_core.grpo.kl:kl_k2",
    "k3": "rlvr_core.grpo.kl:kl_k3",
})
LOSS_AGGS: Registry[Callable] = Registry("loss aggregation", {
    "token-mean": "rlvr_core.grpo.losses:_token_mean",
    "seq-mean-token-mean": "rlvr_core.grpo.losses:_seq_mean_token_mean",
    "seq-mean-token-sum-norm": "rlvr_core.grpo.losses:_seq_mean_token_sum_norm",
})
POLICY_LOSSES: Registry[Callable] = Registry("policy loss", {
    "ppo_clip": "rlvr_core.grpo.losses:ppo_clip_loss",
})
