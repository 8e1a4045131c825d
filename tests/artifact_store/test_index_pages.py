"""Index pages of runs and sweeps (rlvr_core.artifacts.artifacts_index): self-contained (figures are inline SVG drawn
from the run's own Parquet files), every file and trial linked relatively, the MLflow link kept when a later
stage rewrites the page; and a page downloaded alone shows its figures in a real browser."""

from __future__ import annotations

import json
import re
import shutil
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from urllib.parse import quote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlvr_core.artifacts.artifacts_index import write_run_index, write_sweep_index
from rlvr_core.artifacts.layout import trial_prefix
from rlvr_core.artifacts.storage import LocalStore

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dashboards"))  # the shared browser helper
from browser import page, screenshot  # noqa: E402

SVG = "{http://www.w3.org/2000/svg}"
STEPS = [{"step": s, "reward_mean": r} for s, r in ((1, 0.1), (2, 0.3), (3, 0.2), (4, 0.6))]



def _put_parquet(store, key: str, rows: list[dict]) -> None:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(rows), sink)
    store.put_bytes(key, sink.getvalue().to_pybytes())


def _run_folder(store, folder: str, run_id: str, summary: dict | None = None) -> None:
    store.put_text(f"{folder}/run.json", json.dumps({"run_id": run_id, "experiment": "exp", "status": "FINISHED"}))
    store.put_text(f"{folder}/summary.json", json.dumps(summary or {}))
    _put_parquet(store, f"{folder}/train/steps.parquet", STEPS)
    _put_parquet(store, f"{folder}/passk_curves.parquet",
                 [{"source": src, "k": k, "value": v} for src, base in (("eval/base", 0.2), ("eval/trained", 0.4))
                  for k, v in ((1, base), (2, base + 0.1), (4, base + 0.2))])


def _svgs(page_html: str) -> list[ET.Element]:
    return [ET.fromstring(m) for m in re.findall(r"<svg .*?</svg>", page_html, flags=re.S)]


def test_run_index_draws_its_figures_inline_and_keeps_its_links(store):
    _run_folder(store, "exp/demo-a1b2c3d4", "a1b2c3d4" * 4)
    mlflow = "http://127.0.0.1:5000/#/experiments/1/runs/" + "a1b2c3d4" * 4
    key = write_run_index(store, "exp/demo-a1b2c3d4", {"MLflow run": mlflow})
    html = store.get_text(key)
    assert "<img" not in html and "src=" not in html  # nothing the page needs lives beside it
    reward, passk = _svgs(html)  # well-formed SVG, one per figure
    assert reward.find(f"{SVG}title").text == "training reward (mean per step)"
    (line,) = reward.iter(f"{SVG}polyline")
    pts = [tuple(map(float, p.split(","))) for p in line.get("points").split()]
    assert len(pts) == len(STEPS) and [x for x, _ in pts] == sorted(x for x, _ in pts)
    assert min(pts, key=lambda p: p[1]) == pts[3] and max(pts, key=lambda p: p[1]) == pts[0]  # SVG y grows down
    assert len(list(passk.iter(f"{SVG}polyline"))) == 2 and {"eval/base", "eval/trained"} <= {
        t.text for t in passk.iter(f"{SVG}text")}
    # A later stage adds a report and rewrites the page without links: the MLflow link stays.
    store.put_text("exp/demo-a1b2c3d4/reports/index.html", "<p>report</p>")
    html = store.get_text(write_run_index(store, "exp/demo-a1b2c3d4"))
    assert f'href="{mlflow}"' in html and 'href="reports/index.html"' in html


def test_sweep_index_links_trials_and_shows_the_pivot(store):
    sweep = "exp/demo-lr-5eed5eed"
    trials = {}
    for i, (lr, seed, acc) in enumerate(((1e-5, 0, 0.40), (1e-5, 1, 0.50), (5e-5, 0, 0.70), (5e-5, 1, 0.60))):
        tid, label = f"t{i:02d}", f"grpo.lr={lr:g} seed={seed}"
        folder = trial_prefix("exp", "demo-lr-5eed5eed", tid, label)
        _run_folder(store, folder, f"{i:032x}", {"trial_id": tid, "trial_label": label, "accuracy_greedy": acc})
        write_run_index(store, folder)
        trials[tid] = folder.rsplit("/", 1)[1]
    pivot = [{"grpo.lr": "1e-05", "n_seeds": 2, "mean": 0.45, "sd": 0.07, "per_seed": [0.4, 0.5], "seeds": ["0", "1"],
              "trial_ids": ["t00", "t01"], "n_problems": 40, "ci_low": 0.0, "ci_high": 1.0, "ci_kind": "t over 2 seeds"},
             {"grpo.lr": "5e-05", "n_seeds": 2, "mean": 0.65, "sd": 0.07, "per_seed": [0.7, 0.6], "seeds": ["0", "1"],
              "trial_ids": ["t02", "t03"], "n_problems": 40, "ci_low": 0.01, "ci_high": 1.0, "ci_kind": "t over 2 seeds"}]
    key = write_sweep_index(store, sweep, pivot=pivot, swept_keys=["grpo.lr"], metric="accuracy_greedy",
                            links={"MLflow parent run": "http://mlflow/#/experiments/1/runs/p"})
    assert key == f"{sweep}/index.html"
    html = store.get_text(key)
    for tid, name in trials.items():  # each trial linked twice: in its pivot cell and in the trial list
        assert html.count(f'href="{quote(name)}/index.html"') == 2, tid
    assert "0.450" in html and "0.650" in html and "t over 2 seeds" in html and 'href="pivot.json"' in html
    assert json.loads(store.get_text(f"{sweep}/pivot.json")) == pivot
    (fig,) = _svgs(html)
    assert len(list(fig.iter(f"{SVG}circle"))) == 2 and len(list(fig.iter(f"{SVG}line"))) >= 2  # points + CI bars
    assert not store.exists(f"{sweep}/run.json")  # a sweep folder is not a run (the warehouse skips it)


def test_sweep_figure_axis_fits_the_intervals_and_values_keep_their_precision(tmp_path):
    """Two cells 0.5 points apart: the chart's axis spans their intervals (not 0–1, which drew them as one dot),
    with error bars; the pivot and the trial table print 0.025 and 0.030 apart, with n and the interval."""
    store = LocalStore(tmp_path / "store")
    sweep, cells = "exp/lr-5eed5eed", ((1e-5, 0.025, 0.020, 0.030), (5e-5, 0.030, 0.027, 0.033))
    pivot = [{"grpo.lr": lr, "n_seeds": 2, "mean": m, "ci_low": lo, "ci_high": hi, "ci_kind": "t over 2 seeds",
              "per_seed": [m, m], "seeds": [0, 1], "trial_ids": [f"t{2 * i:02d}", f"t{2 * i + 1:02d}"], "n_problems": 40}
             for i, (lr, m, lo, hi) in enumerate(cells)]
    folder = trial_prefix("exp", "lr-5eed5eed", "t00", "lr=1e-05 seed=0")
    _run_folder(store, folder, "0" * 32, {"trial_id": "t00", "trial_label": "lr=1e-05 seed=0", "accuracy_greedy": 0.025,
                                          "accuracy_greedy_ci95": [0.0044, 0.1288], "n_eval": 40})
    html = store.get_text(write_sweep_index(store, sweep, pivot=pivot, swept_keys=["grpo.lr"], metric="accuracy_greedy"))
    (fig,) = _svgs(html)
    ticks = [float(t.text) for t in fig.iter(f"{SVG}text") if t.get("text-anchor") == "end" and t.text]
    assert len(ticks) >= 3 and 0.019 <= min(ticks) and max(ticks) <= 0.034, ticks  # the data's range, not 0–1
    ys = {float(c.get("cy")) for c in fig.iter(f"{SVG}circle")}
    assert max(ys) - min(ys) > 50, ys  # the two means are drawn apart (the plot is ~200 px high)
    bars = [ln for ln in fig.iter(f"{SVG}line") if ln.get("stroke") == "#555"]
    assert len(bars) == 2 * 3  # per cell: the interval and its two caps
    span = [(float(b.get("y1")), float(b.get("y2"))) for b in bars if b.get("x1") == b.get("x2")]
    assert all(abs(y1 - y2) > 20 for y1, y2 in span), span  # each interval visible, not a dot
    assert {"0.025", "0.030"} <= {t.text for t in fig.iter(f"{SVG}text")}  # each mean labelled to 3 decimals
    rows = re.findall(r"<tr><td>([15]e-05)</td><td>2</td><td>40</td><td>([0-9.]+)</td><td>([0-9.–]+)</td>", html)
    assert rows == [("1e-05", "0.025", "0.020–0.030"), ("5e-05", "0.030", "0.027–0.033")], html
    assert re.search(r"<td class='n'>0\.025</td><td class='n'>0\.004–0\.129</td><td class='n'>40</td>", html), html


@pytest.mark.slow
def test_a_downloaded_index_page_shows_its_figures_in_a_browser(tmp_path):
    store = LocalStore(tmp_path / "store")
    _run_folder(store, "exp/demo-a1b2c3d4", "a1b2c3d4" * 4)
    alone = tmp_path / "downloads"
    alone.mkdir()
    shutil.copy(store.root / write_run_index(store, "exp/demo-a1b2c3d4"), alone / "index.html")
    with page(height=900) as (pg, errors):
        pg.goto((alone / "index.html").as_uri())
        sizes = pg.eval_on_selector_all("svg", "els => els.map(e => [e.getBoundingClientRect().width, "
                                               "e.querySelectorAll('polyline').length])")
        assert sizes == [[520, 1], [520, 2]], sizes
        screenshot(pg, "run_index.png")
        assert errors == [], "\n".join(errors)
