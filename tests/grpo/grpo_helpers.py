"""Shared by the GRPO trainer tests: the tiny base model they train (`build_tiny`, built once per session by
tests/grpo/conftest.py), a small GRPO config, one training call, a model's parameters, and the test verifier
`_test_parity` (reward 1 when the completion has an even number of characters: groups nearly always have
reward variance, so every step has a gradient). Importing this module registers that verifier."""

from __future__ import annotations

import os
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
os.environ.setdefault("DS_ACCELERATOR", "cpu")

from rlvr_core.experiment.config import GRPOConfig, RewardConfig  # noqa: E402
from rlvr_core.grpo.trainer import train_grpo  # noqa: E402
from rlvr_core.verifiers.base import Outcome, Status, _REGISTRY, register_verifier  # noqa: E402

VERIFIER = "_test_parity"


class _Parity:
    name, version = VERIFIER, "1"
    can_hang = False  # a length check

    def warm_up(self) -> None:
        pass

    def verify(self, response: str, gold) -> Outcome:
        ok = len(response) % 2 == 0
        return Outcome(Status.CORRECT if ok else Status.INCORRECT, float(ok), str(len(response)), self.name, self.version)


if VERIFIER not in _REGISTRY:
    register_verifier(VERIFIER)(_Parity)


def build_tiny(out, hidden_size: int = 32):
    """(model dir, train rows, curriculum ids): a 2-layer, 2-head model after 30 supervised steps."""
    from rlvr_core.data.synthetic import SyntheticSpec, make_synthetic_dataset
    from rlvr_core.tiny.warmstart import WarmStartSpec, warm_start

    rows = make_synthetic_dataset(SyntheticSpec(n_train=200, n_test=10))["train"]
    warm_start(rows, out, WarmStartSpec(steps=30, batch_size=16, hidden_size=hidden_size, num_layers=2, heads=2,
                                        vocab_size=300, warmup_steps=5))
    return out, rows, [r["id"] for r in rows[:12]]


def tiny_cfg(**kw) -> GRPOConfig:
    base = dict(steps=2, prompts_per_step=4, group_size=4, lr=1e-2, warmup_steps=0, temperature=0.8,
                zero_stage=2, checkpoint_every=1000)
    return GRPOConfig(**{**base, **kw})


def train_tiny(tiny, out: Path, cfg: GRPOConfig, **kw):
    model_dir, rows, ids = tiny
    return train_grpo(model_dir, rows, ids, out, cfg, template_id="qa", reward=RewardConfig(verifier=VERIFIER),
                      max_new_tokens=12, seed=0, **kw)


def model_params(path: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return {k: v.detach().clone() for k, v in AutoModelForCausalLM.from_pretrained(path).named_parameters()}
