"""The nightly report's numbers and pages (rlvr_core/eval/nightly_report.py), on hand-made evaluations whose
intervals are computed here independently."""

from __future__ import annotations

import math
import re
from html.parser import HTMLParser

import pytest

from rlvr_core.eval.compare import EvalSource
from rlvr_core.eval.nightly_report import Evaluated, build_report, checkpoint_numbers, to_html, to_markdown

SETTINGS = {"verifier": "gsm8k", "verifier_mode": None, "temperature": 1.0, "template": "qa"}


def _source(label: str, greedy: list[bool], sampled: list[list[bool]], settings=SETTINGS) -> EvalSource:
    recs = []
    for i, (g, s) in enumerate(zip(greedy, sampled)):
        base = {"benchmark": "synthetic", "problem_id": f"p{i}", "side_by_side": {}}
        recs.append({**base, "greedy": True, "sample_index": 0, "status": "correct" if g else "incorrect"})
        recs += [{**base, "greedy": False, "sample_index": j + 1, "status": "correct" if ok else "incorrect"}
                 for j, ok in enumerate(s)]
    return EvalSource(label, "<test>", recs, {"synthetic": dict(settings)})


BASE = _source("base", [True, False, False, False], [[True, False], [False, False], [True, False], [False, False]])
C1 = _source("c1", [True, True, False, False], [[True, True], [True, False], [True, False], [False, False]])
C2 = _source("c2", [True, True, True, False], [[True, True], [True, True], [True, False], [False, True]])


def test_accuracy_interval_and_passk_of_one_checkpoint():
    r = checkpoint_numbers(C1)
    assert (r["accuracy"], r["n"]) == (0.5, 4)
    # Wilson 95 %: 2 of 4
    z = 1.959963984540054
    centre, half = (0.5 + z * z / 8) / (1 + z * z / 4), z * math.sqrt(0.25 / 4 + z * z / 64) / (1 + z * z / 4)
    assert (r["ci_low"], r["ci_high"]) == pytest.approx((centre - half, centre + half))
    # pass@1 = mean c/n = (2 + 1 + 1 + 0) / 8; pass@2 = share of problems with a success = 3/4
    assert r["passk"] == pytest.approx({1: 0.5, 2: 0.75})


def test_report_deltas_are_paired_against_previous_and_base():
    rep = build_report("synthetic@3-abc", [Evaluated("e/a/checkpoints/final", C1, {"MLflow run": "http://m/1"}),
                                           Evaluated("e/b/checkpoints/final", C2, new=True)],
                       Evaluated("base", BASE), n_in_store=2)
    first, second = rep["rows"]
    assert first["vs_previous"] is None
    # c2 - c1 per problem: 0, 0, +1, 0 -> mean 0.25, sd 0.5, t(0.975, 3) = 3.182 -> 0.25 +- 3.182 * 0.25
    d = second["vs_previous"]
    assert (d["delta"], d["n"], d["against"]) == (0.25, 4, "e/a/checkpoints/final")
    assert (d["ci_low"], d["ci_high"]) == pytest.approx((0.25 - 3.182446 * 0.25, 0.25 + 3.182446 * 0.25), abs=1e-5)
    # c2 - base: 0, +1, +1, 0 -> mean 0.5, sd 0.57735
    b = second["vs_base"]
    assert b["delta"] == 0.5 and b["ci_low"] == pytest.approx(0.5 - 3.182446 * 0.57735 / 2, abs=1e-5)
    assert first["vs_base"]["delta"] == 0.25


def test_different_settings_are_not_compared():
    other = _source("o", [True] * 4, [[True, True]] * 4, settings={**SETTINGS, "temperature": 0.7})
    rep = build_report("s", [Evaluated("a", C1), Evaluated("b", other)], None, n_in_store=2)
    assert "refused" in rep["rows"][1]["vs_previous"] and "temperature" in rep["rows"][1]["vs_previous"]["refused"]
    assert rep["rows"][1]["vs_base"] is None
    assert "not compared: settings differ" in to_markdown(rep)


class _Cells(HTMLParser):
    def __init__(self):
        super().__init__()
        self.cells, self.links, self._cls, self._row = {}, [], None, None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "tr" and "data-checkpoint" in a:
            self._row = a["data-checkpoint"]
        if tag == "td":
            self._cls = a.get("class")
        if tag == "a":
            self.links.append(a["href"])

    def handle_data(self, data):
        if self._row and self._cls:
            self.cells.setdefault(self._row, {}).setdefault(self._cls, "")
            self.cells[self._row][self._cls] += data

    def handle_endtag(self, tag):
        if tag == "td":
            self._cls = None


def test_html_carries_the_numbers_and_links():
    rep = build_report("s", [Evaluated("a", C1, {"eval folder": "../eval_a/index.html"}),
                             Evaluated("b & c", C2, {"MLflow run": "http://h/#/experiments/1/runs/x?q=1&r=2"}, new=True)],
                       Evaluated("base", BASE, {"base folder": "../base/evals"}), n_in_store=2,
                       header_links={"Prefect flow run": "http://p/runs/1"})
    page = _Cells()
    page.feed(to_html(rep))
    assert set(page.cells) == {"a", "b & c"}
    row = page.cells["b & c"]
    assert re.fullmatch(r"75\.0 \[\d+\.\d, \d+\.\d\] \(n = 4\)", row["accuracy"])
    assert row["passk"] == "@1 75.0, @2 100.0"
    assert row["delta-previous"].startswith("+25.0 [") and row["delta-base"].startswith("+50.0 [")
    assert page.links == ["http://p/runs/1", "../base/evals", "../eval_a/index.html",
                          "http://h/#/experiments/1/runs/x?q=1&r=2"]
