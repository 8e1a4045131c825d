"""Guided two-model decoding: it is HFEngine when nothing is replaced, the gates fire as documented,
and the extrapolated distribution is p_B^(1+γ) p_A^(-γ) renormalised."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlvr_core.data.templates import get_template
from rlvr_core.probe.decoding import Guide, GuidedEngine, extrapolated_logprobs
from rlvr_core.probe.dlogp import calibrate_thresholds, ks_distance
from rlvr_core.sampling.base import SamplingParams
from rlvr_core.sampling.hf import HFEngine

PARAMS = SamplingParams(n=3, temperature=1.0, max_new_tokens=12, stop=get_template("qa").stop, seed=7)


def _prompts(rows, k=5):
    t = get_template("qa")
    return [t.render(r["question"]) for r in rows[:k]], [r["id"] for r in rows[:k]]


def _ids(groups):
    return [[s.token_ids for s in g] for g in groups]


def test_never_replacing_is_hfengine(model_a, model_b, tokenizer, rows):
    prompts, ids = _prompts(rows["test"])
    for proposal, model in (("a", model_a), ("b", model_b)):
        ref = HFEngine(model, tokenizer, batch_size=8).generate(prompts, ids, PARAMS)
        eng = GuidedEngine(model_a, model_b, tokenizer, Guide(proposal=proposal), batch_size=8)
        got = eng.generate(prompts, ids, PARAMS)
        assert _ids(got) == _ids(ref)
        assert [[s.text for s in g] for g in got] == [[s.text for s in g] for g in ref]
        assert all(n == 0 for n, _ in eng.replaced.values())


def test_gates_and_replacement(model_a, model_b, tokenizer, rows):
    prompts, ids = _prompts(rows["test"])
    always = GuidedEngine(model_a, model_b, tokenizer, Guide("a", "always", replacement="b"), batch_size=8)
    out = always.generate(prompts, ids, PARAMS)
    assert all(n == t and t > 0 for n, t in always.replaced.values())
    # replacing every token with B's draw is sampling from B (a different random stream than B's own)
    assert _ids(out) != _ids(HFEngine(model_b, tokenizer, batch_size=8).generate(prompts, ids, PARAMS))
    # a Δlog p gate below every possible value never fires; above every value always fires
    low = GuidedEngine(model_a, model_b, tokenizer, Guide("a", "dlogp", -1e9), batch_size=8)
    assert _ids(low.generate(prompts, ids, PARAMS)) == _ids(HFEngine(model_a, tokenizer, batch_size=8).generate(prompts, ids, PARAMS))
    high = GuidedEngine(model_a, model_b, tokenizer, Guide("a", "dlogp", 1e9), batch_size=8)
    assert _ids(high.generate(prompts, ids, PARAMS)) == _ids(out)  # same draws as `always` (common random numbers)
    half = GuidedEngine(model_a, model_b, tokenizer, Guide("a", "random", 0.5), batch_size=8)
    half.generate(prompts, ids, PARAMS)
    n, t = map(sum, zip(*half.replaced.values()))
    assert 0.3 < n / t < 0.7
    # extrapolation with gamma 0 replacing every token draws from B with the replacement stream: same as `always`
    ext0 = GuidedEngine(model_a, model_b, tokenizer, Guide("a", "always", replacement="extrapolate", gamma=0.0), batch_size=8)
    assert _ids(ext0.generate(prompts, ids, PARAMS)) == _ids(out)
    with pytest.raises(ValueError, match="temperature"):
        GuidedEngine(model_a, model_b, tokenizer, Guide()).generate(prompts, ids, SamplingParams(temperature=0.0))
    with pytest.raises(ValueError):
        Guide(criterion="magic")


def test_extrapolated_distribution_closed_form():
    g = torch.Generator().manual_seed(0)
    la, lb = torch.randn(4, 30, generator=g, dtype=torch.float64), torch.randn(4, 30, generator=g, dtype=torch.float64)
    pa, pb = torch.softmax(la, -1), torch.softmax(lb, -1)
    for gamma in (0.0, 0.5, 1.0, 3.0):
        want = pb ** (1 + gamma) * pa ** (-gamma)
        want = want / want.sum(-1, keepdim=True)
        torch.testing.assert_close(extrapolated_logprobs(la, lb, gamma).double().exp(), want, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(extrapolated_logprobs(la, lb, 0.0).double(), torch.log_softmax(lb, -1), atol=1e-6, rtol=0)


def test_calibration_and_ks():
    rng = np.random.default_rng(0)
    stats = {"dlogp": rng.normal(size=10_000), "entropy_a": rng.random(10_000), "kl_sym": rng.random(10_000)}
    for rate in (0.05, 0.2):
        assert abs((stats["dlogp"] < calibrate_thresholds(stats, "dlogp", rate)).mean() - rate) < 0.002
        assert abs((stats["entropy_a"] > calibrate_thresholds(stats, "entropy", rate)).mean() - rate) < 0.002
        assert abs((stats["kl_sym"] > calibrate_thresholds(stats, "kl", rate)).mean() - rate) < 0.002
        assert calibrate_thresholds(stats, "random", rate) == rate
    x = rng.normal(size=2000)
    assert ks_distance(x, x) == 0.0
    assert ks_distance(x, x + 100) == 1.0
    assert 0.3 < ks_distance(x, x + 1) < 0.5  # Φ(0.5) - Φ(-0.5) ≈ 0.38
