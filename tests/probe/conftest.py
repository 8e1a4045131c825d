"""Fixtures for the probe tests: the tiny task's tokenizer and small Qwen2 models built from configs."""

from __future__ import annotations

import copy

import pytest
import torch

from rlvr_core.data.synthetic import SyntheticSpec, make_synthetic_dataset
from rlvr_core.data.templates import get_template
from rlvr_core.tiny.model import build_tiny_model
from rlvr_core.tiny.tokenizer import train_tokenizer


@pytest.fixture(scope="session")
def rows():
    return make_synthetic_dataset(SyntheticSpec(n_train=300, n_test=40))


@pytest.fixture(scope="session")
def tokenizer(rows):
    torch.set_num_threads(1)
    t = get_template("qa")
    return train_tokenizer([t.render(r["question"]) + " " + r["answer"] for r in rows["train"]], vocab_size=400)


def small_model(tokenizer, seed: int = 0, sharpen: float = 6.0):
    """A random tiny Qwen2 (hidden 64, 2 layers) with sharpened logits so distributions are not near-uniform."""
    m = build_tiny_model(tokenizer, hidden_size=64, num_layers=2, heads=4, seed=seed).eval()
    with torch.no_grad():
        m.model.norm.weight.mul_(sharpen)
    return m


def perturbed(model, scale: float, seed: int):
    """A copy of `model` with every parameter moved by scale * N(0, 1) (a stand-in for a trained checkpoint)."""
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return out.eval()


@pytest.fixture(scope="session")
def model_a(tokenizer):
    return small_model(tokenizer, seed=0)


@pytest.fixture(scope="session")
def model_b(model_a):
    return perturbed(model_a, 0.02, seed=1)
