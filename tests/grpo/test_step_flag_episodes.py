"""Per-step guard flags in real trainer runs (tiny model, HFEngine, VerifierPool, DeepSpeed; grpo_helpers.py's
set-up): G-fixed-seed with identical samples planted, G-verifier-format over a window, and every flagged
stretch of steps as one episode in the summary, train/health_events.parquet, the warehouse's health_events
(a real DuckDB file) and the run report.

Plants:
  * identical samples: the HF engine gets one fixed seed for every request (the reported bug), by replacing
    the `request_seed` it calls; every sample of a group is then the same text at temperature 0.8.
  * a large share of zero-variance groups, not all: `_test_one_per_step` scores the parity of the completion
    only for the first prompt of each step (curriculum positions 0, 4, 8) and 0 for every other prompt, so at
    least 3 of the 4 groups of a step have zero variance.
"""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import torch

from grpo_helpers import tiny_cfg

from rlvr_core.artifacts.storage import LocalStore
from rlvr_core.data import gold_of
from rlvr_core.experiment.config import GRPOConfig, RewardConfig
from rlvr_core.grpo.step_metrics import zero_var_flag
from rlvr_core.grpo.trainer import train_grpo
from rlvr_core.records import report, warehouse
from rlvr_core.records.runrecord import upload_run_folder, write_run_folder
from rlvr_core.sampling import hf as hf_engine
from rlvr_core.verifiers.base import _REGISTRY, Outcome, Status, register_verifier

P = 4


class _OnePerStep:
    name, version = "_test_one_per_step", "1"
    can_hang = False  # a length check
    golds: frozenset = frozenset()  # set by the test: the golds of the prompts that carry a signal

    def warm_up(self) -> None:
        pass

    def verify(self, response: str, gold) -> Outcome:
        ok = str(gold) in self.golds and len(response) % 2 == 0
        return Outcome(Status.CORRECT if ok else Status.INCORRECT, float(ok), None, self.name, self.version)


class _Crash:
    """The reported IFBench case in training: the checker raises TypeError on every completion."""

    name, version = "_test_crash_reward", "1"
    can_hang = False  # it raises at once

    def warm_up(self) -> None:
        pass

    def verify(self, response: str, gold) -> Outcome:
        raise TypeError("check_following() got an unexpected keyword argument 'N'")


for _cls in (_OnePerStep, _Crash):
    if _cls.name not in _REGISTRY:
        register_verifier(_cls.name)(_cls)


def _train(tiny, out, cfg, verifier="_test_parity"):
    model_dir, rows, ids = tiny
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the machine's cores are shared; more threads only slow the tiny model down
    try:
        return train_grpo(model_dir, rows, ids, out, cfg, template_id="qa", reward=RewardConfig(verifier=verifier),
                          max_new_tokens=12, seed=0)
    finally:
        torch.set_num_threads(threads)


def _rows(path):
    return pq.read_table(path).to_pylist()


def _episodes(summary, guard):
    return [f for f in summary["health_firings"] if f["guard_id"] == guard and f.get("source") == "step_flags"]


@pytest.fixture(scope="module")
def healthy(tiny, tmp_path_factory):
    """Per-request seeds, a verifier with signal in nearly every group: no per-step flag should fire."""
    return _train(tiny, tmp_path_factory.mktemp("flags") / "healthy", tiny_cfg(steps=3))


@pytest.fixture(scope="module")
def fixed_seed(tiny, tmp_path_factory):
    """The planted bug: one seed for every generation request."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(hf_engine, "request_seed", lambda seed, *a, **kw: seed)
        return _train(tiny, tmp_path_factory.mktemp("flags") / "fixed", tiny_cfg(steps=3))


def test_fixed_seed_flag_fires_on_identical_samples_and_not_with_per_request_seeds(healthy, fixed_seed):
    bad, good = _rows(fixed_seed.steps_path), _rows(healthy.steps_path)
    # The plant did what the bug does: every group is one distinct text.
    assert all(r["unique_frac_mean"] == pytest.approx(1 / 4) for r in bad)
    assert [r["health/G-fixed-seed"] for r in bad] == [1, 1, 1]
    assert all(r["unique_frac_mean"] > 0.5 for r in good)
    assert [r["health/G-fixed-seed"] for r in good] == [0, 0, 0]
    assert fixed_seed.summary["guards"]["health/G-fixed-seed"] == 3
    # Three flagged steps in a row are one episode in the summary.
    (ep,) = _episodes(fixed_seed.summary, "G-fixed-seed")
    assert (ep["step"], ep["last_step"], ep["n_steps"], ep["serious"]) == (1, 3, 3, False)
    assert "steps 1-3" in ep["reason"]
    assert not [f for f in healthy.summary["health_firings"] if f.get("source") == "step_flags"]


def test_flag_episode_reaches_health_events_the_warehouse_and_the_report(fixed_seed, tmp_path):
    """The trainer's summary → train/health_events.parquet (as the pipeline writes it) → warehouse → report."""
    run_id = "fixedseed1"
    tables = {"train/steps.parquet": pq.read_table(fixed_seed.steps_path),
              "train/health_events.parquet": warehouse.health_events_table(fixed_seed.summary["health_firings"])}
    local = write_run_folder(tmp_path / run_id, run={"run_id": run_id, "experiment": "exp", "kind": "trial",
                                                     "status": "FINISHED"},
                             params={}, manifest={}, config_yaml="", summary=fixed_seed.summary, tables=tables)
    events = pq.read_table(local / "train" / "health_events.parquet").to_pylist()
    assert [(e["guard_id"], e["step"], e["last_step"], e["n_steps"], e["source"]) for e in events
            if e["guard_id"] == "G-fixed-seed"] == [("G-fixed-seed", 1, 3, 3, "step_flags")]
    store = LocalStore(tmp_path / "store")
    upload_run_folder(store, f"exp/{run_id}", local)
    db = tmp_path / "w.duckdb"
    warehouse.ingest_run(store, f"exp/{run_id}", db)
    got = warehouse.query("select guard_id, step, last_step, n_steps, serious, source from health_events "
                          "where guard_id = 'G-fixed-seed'", path=db)[1]
    assert got == [("G-fixed-seed", 1, 3, 3, False, "step_flags")]  # one row, not one per step
    key = f"exp/{run_id}/reports/index.html"
    assert report.build_report(run_id, store=store, warehouse_path=db) == store.url(key)
    html = store.get_text(key)
    table = html.split("<h3>Guard firings</h3>")[1].split("<h2>")[0]
    assert "G-fixed-seed" in table and "step_flags" in table and "steps 1-3" in table


def test_verifier_format_fires_on_a_large_share_over_the_window(tiny, healthy, tmp_path):
    _, rows, ids = tiny
    by_id = {r["id"]: r for r in rows}
    golds = [str(gold_of(by_id[i])) for i in ids]
    _OnePerStep.golds = frozenset(golds[j] for j in (0, 4, 8))
    signal = [j for j, g in enumerate(golds) if g in _OnePerStep.golds]
    assert len(signal) <= 4, "too many prompts share the chosen golds: the plant would not be a large share"
    cfg = tiny_cfg(steps=4, guards={"zero_var_guard_share": 0.7, "zero_var_guard_window": 3})
    res = _train(tiny, tmp_path / "sparse", cfg, verifier=_OnePerStep.name)
    steps = _rows(res.steps_path)
    shares = [r["zero_var_group_share"] for r in steps]
    for k, r in enumerate(steps):
        window = shares[max(0, k - 2):k + 1]
        assert r["health/G-verifier-format"] == int(sum(window) / len(window) >= 0.7), (k, shares)
    assert all(s >= 0.5 for s in shares)
    # The point of the window: steps where not every group is zero-variance still fire (the old rule,
    # "every group in this step", would have missed them).
    assert any(r["health/G-verifier-format"] and r["zero_var_group_share"] < 1 for r in steps), shares
    flagged = [r["step"] for r in steps if r["health/G-verifier-format"]]
    eps = _episodes(res.summary, "G-verifier-format")
    assert sum(e["n_steps"] for e in eps) == len(flagged) and eps[0]["step"] == flagged[0]
    # A healthy run (parity of every completion): every step under 0.7, and no flag at the defaults.
    assert all(r["zero_var_group_share"] < 0.7 for r in _rows(healthy.steps_path))
    assert [r["health/G-verifier-format"] for r in _rows(healthy.steps_path)] == [0, 0, 0]


def test_verifier_format_window_ignores_one_unlucky_step():
    cfg = GRPOConfig()  # share 0.9 over 5 steps
    healthy = [{"zero_var_group_share": 0.3}] * 4
    assert zero_var_flag(cfg, 1.0, healthy) == 0  # one step without signal in a learning run: mean 0.44
    assert zero_var_flag(cfg, 0.9, [{"zero_var_group_share": 0.92}] * 4) == 1  # 9 groups in 10, 5 steps running
    assert zero_var_flag(cfg, 1.0, []) == 1  # the first step of a run with no signal at all (every reward 0)


def test_verifier_error_flag_fires_when_the_checker_crashes_in_training(tiny, healthy, tmp_path):
    res = _train(tiny, tmp_path / "crash", tiny_cfg(steps=2), verifier=_Crash.name)
    steps = _rows(res.steps_path)
    assert [r["status/error"] for r in steps] == [P * 4, P * 4]  # an error each, not "incorrect"
    assert [r["health/G-verifier-error"] for r in steps] == [1, 1]
    (ep,) = _episodes(res.summary, "G-verifier-error")
    assert (ep["step"], ep["last_step"], ep["n_steps"]) == (1, 2, 2)
    assert [r["health/G-verifier-error"] for r in _rows(healthy.steps_path)] == [0, 0, 0]
