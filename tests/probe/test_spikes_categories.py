"""Spike rule, token categories, turning points, and the planted-change bar of issue 9:
one checkpoint's logits shifted on one token type are found by the spike detector and attributed to
the right category."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlvr_core.probe.categories import CATEGORIES, categorize_text, token_categories
from rlvr_core.probe.inputs import sequences_from_rows
from rlvr_core.probe.spikes import SpikeRule, detect_spikes, turning_points
from rlvr_core.probe.tables import Checkpoint, summarise, token_table
from rlvr_core.probe.token_stats import teacher_forced_stats

from tests.probe.conftest import perturbed


@pytest.mark.parametrize("text,cat", [
    ("7", "number"), (" 12", "number"), ("3.5", "number"), ("1,000", "number"),
    ("\n", "step_marker"), ("####", "step_marker"), (" Step", "step_marker"), ("Finally", "step_marker"), ("2.", "step_marker"),
    (" +", "math_symbol"), (" =", "math_symbol"), ("\\frac", "math_symbol"), ("-", "math_symbol"), ("$", "math_symbol"),
    (" Therefore", "logical"), (" so", "logical"), ("if", "logical"),
    (" x", "variable"), ("y1", "variable"), ("a_2", "variable"), ("θ", "variable"),
    (".", "punctuation"), (",", "punctuation"), ("(", "punctuation"), ("?", "punctuation"),
    (" apples", "other"), ("<|endoftext|>", "other"), ("  ", "other"),
])
def test_categories(text, cat):
    assert categorize_text(text) == cat
    assert cat in CATEGORIES


def test_token_categories_on_the_tiny_tokenizer(tokenizer):
    ids = tokenizer("Tom has 3 apples.\n7 + 4 = 11\n#### 11", add_special_tokens=False)["input_ids"]
    cats = token_categories(tokenizer, ids)
    by_text = {text.strip(): c for text, c in cats.values()}
    assert by_text["3"] == "number" and by_text["+"] == "math_symbol" and by_text["="] == "math_symbol"
    assert by_text.get("####", "step_marker") == "step_marker"


def test_spike_rules():
    flat = np.zeros(50)
    for kind in ("robust", "zscore"):
        assert not detect_spikes(flat, SpikeRule(kind=kind)).any()  # identical models: no spikes
    x = np.full(50, 0.01) + np.linspace(0, 1e-3, 50)
    x[[7, 30]] = 1.0
    for kind in ("robust", "zscore"):
        assert detect_spikes(x, SpikeRule(kind=kind)).nonzero()[0].tolist() == [7, 30]
        assert not detect_spikes(x * 1e-4, SpikeRule(kind=kind)).any()  # below min_value: noise, not spikes
    assert detect_spikes(x, SpikeRule(kind="absolute", threshold=0.5)).nonzero()[0].tolist() == [7, 30]
    # a change on 40% of the tokens: mean/std is masked by it, median/MAD is not (why robust is the default)
    y = np.full(50, 0.01) + np.linspace(0, 1e-3, 50)
    y[::5] = y[1::5] = 0.5
    assert not detect_spikes(y, SpikeRule(kind="zscore")).any()
    assert detect_spikes(y, SpikeRule()).sum() == 20
    rule = SpikeRule(scope="checkpoint")
    assert detect_spikes(np.full(5, 0.5), rule, pooled=(0.01, 0.01)).all()  # shifted against the checkpoint
    with pytest.raises(ValueError):
        detect_spikes(x, rule)
    with pytest.raises(ValueError):
        SpikeRule(kind="quantile")


def test_turning_points():
    steps = [100, 200, 300, 400, 500, 600]
    assert [(p["step"], p["kind"]) for p in turning_points(steps, [1, 2, 3, 2, 1, 2])] == [(300, "peak"), (500, "trough")]
    assert turning_points(steps, [1, 2, 3, 4, 5, 6]) == []  # straight line: no turn, no inflection
    # rising fast then slowly: curvature changes sign at 300 (accelerating to decelerating)
    pts = turning_points(steps, [0, 1, 4, 6, 7, 7.5])
    assert [(p["step"], p["kind"]) for p in pts] == [(300, "inflection")]
    assert turning_points([1, 2], [0, 1]) == []
    # a wiggle below the tolerance is flat
    assert turning_points(steps, [1, 1.001, 1, 2, 3, 4], rel_tol=0.05) == []


class PlantedShift(torch.nn.Module):
    """Checkpoint B = `inner` with the logit of the actual next token raised by `delta` wherever that token
    is in `ids` (one token type): the planted change the detector must find. Logits-level, so head="logits"."""

    def __init__(self, inner, ids: set[int], delta: float):
        super().__init__()
        self.inner, self.delta = inner, delta
        self.register_buffer("ids", torch.tensor(sorted(ids)))

    def forward(self, input_ids, **kw):
        out = self.inner(input_ids=input_ids, **kw)
        logits = out.logits.clone()
        nxt = input_ids[:, 1:]
        hit = torch.isin(nxt, self.ids)
        b, t = hit.nonzero(as_tuple=True)
        logits[b, t, nxt[b, t]] += self.delta
        out.logits = logits
        return out


def test_planted_change_is_recovered_and_attributed(model_a, tokenizer, rows):
    seqs = sequences_from_rows(rows["test"][:30], tokenizer, "qa")
    cats = token_categories(tokenizer, range(len(tokenizer)))
    numbers = {t for t, (_, c) in cats.items() if c == "number"}
    noisy = perturbed(model_a, 0.005, seed=5)  # background differences everywhere, like a real checkpoint
    b = PlantedShift(noisy, numbers, delta=6.0)
    res = teacher_forced_stats(model_a, {"noisy": noisy, "planted": b}, seqs, head="logits")
    ck = [Checkpoint("noisy", 1), Checkpoint("planted", 2)]
    tokens = token_table(res, seqs, tokenizer, probe_id="t", reference="a", checkpoints=ck)
    tables = summarise(tokens)
    t = tokens.to_pydict()
    planted = [i for i, c in enumerate(t["checkpoint_b"]) if c == "planted"]
    is_num = np.array([t["category"][i] == "number" for i in planted])
    spike = np.array([t["is_spike"][i] for i in planted])
    assert is_num.sum() > 100
    recall = (spike & is_num).sum() / is_num.sum()
    precision = (spike & is_num).sum() / max(spike.sum(), 1)
    assert recall >= 0.9 and precision >= 0.95, (recall, precision)
    c = tables.categories.to_pydict()
    share = {cat: s for k, cat, s in zip(c["checkpoint"], c["category"], c["spike_share"]) if k == "planted"}
    kl = {cat: v for k, cat, v in zip(c["checkpoint"], c["category"], c["mean_kl"]) if k == "planted"}
    assert max(share, key=share.get) == "number" and share["number"] >= 0.95
    assert max(kl, key=kl.get) == "number"
    # the background checkpoint has far fewer spikes, spread over categories
    ckt = tables.checkpoints.to_pydict()
    assert ckt["total_spikes"][1] > 3 * ckt["total_spikes"][0]
    # Δlog p is positive on the planted tokens (B favours them) and the report's tables are consistent
    dl = np.array([t["dlogp"][i] for i in planted])
    assert dl[is_num].mean() > 1.0
    assert sum(tables.problems.column("n_spikes").to_pylist()) == sum(ckt["total_spikes"])
