"""`rlvr config validate` of sweep files, `rlvr sweep run` refusing a bad sweep before Prefect, `rlvr sweep show`
from a real DuckDB warehouse, and the pieces they print: short trial names, one-line errors, the pivot table.
(The submit/watch/status path runs on a real Prefect server in tests/flows/test_stack_e2e.py.)"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from rlvr_cli.main import app
from rlvr_core.pipeline.sweeps import load_sweep, one_line_error, short_names, sweep_pivot
from rlvr_core.records import warehouse

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


@pytest.mark.parametrize("name, trials, cells", [("demo_lr", 6, 2), ("sampling_ablations", 12, 4)])
def test_validate_recognises_shipped_sweep_files(name, trials, cells):
    res = runner.invoke(app, ["config", "validate", str(ROOT / "configs" / "sweeps" / f"{name}.yaml")])
    assert res.exit_code == 0, res.output
    assert "valid sweep" in res.output and f"{trials} trials ({cells} cells × 3 seeds)" in res.output


def test_demo_sweep_compares_its_lrs_on_one_schedule_with_three_seeds():
    # The lr of every step, from the trainer's own DeepSpeed scheduler config: both cells come within 5 % of the
    # lr they compare right after the warm-up (the cosine starts there) and follow the same schedule, so the
    # small cell trains at a tenth of the other's lr at every step.
    import torch
    from deepspeed.runtime.lr_schedules import WarmupCosineLR

    from rlvr_core.experiment.config import GRPOConfig
    from rlvr_core.grpo.policy import ds_config

    sw = load_sweep(ROOT / "configs" / "sweeps" / "demo_lr.yaml")
    assert sw.spec.seeds == [0, 1, 2]
    schedules = {}
    for t in sw.trials:
        g = GRPOConfig(**t.config["grpo"])
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=g.lr)
        sched = WarmupCosineLR(opt, **ds_config(g, 8)["scheduler"]["params"])
        lrs = []
        for _ in range(g.steps):  # the trainer advances the scheduler once before step 1 (update.py)
            sched.step()
            lrs.append(opt.param_groups[0]["lr"])
        assert 0.95 * g.lr < max(lrs) <= g.lr and lrs.index(max(lrs)) <= g.warmup_steps, (t.label, lrs)
        schedules.setdefault(g.lr, lrs)
    (small, small_lrs), (big, big_lrs) = sorted(schedules.items())
    assert big == pytest.approx(10 * small) and [b / s for s, b in zip(small_lrs, big_lrs)] == pytest.approx([10.0] * len(big_lrs))


@pytest.mark.parametrize("change, field", [
    ({"grid": {"grpo.learnig_rate": [1e-5]}}, "grid.grpo.learnig_rate: not a field of the experiment config"),
    ({"set": {"grpo.enabled": True, "grpo.steps": 4, "grpo.warmup_steps": 10}},
     "set: grpo.warmup_steps: 10 warm-up steps with grpo.steps 4: the lr never reaches grpo.lr"),
    ({"set": {"grpo.enabled": True, "grpo.steps": 4}, "grid": {"grpo.warmup_steps": [1, 4]}},
     "grid: grpo.warmup_steps: 4 warm-up steps with grpo.steps 4"),
    ({"seeds": [0, 0]}, "seeds: repeated seeds [0, 0]"),
])
def test_bad_sweep_file_named_with_its_field(tmp_path, change, field):
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({"name": "x", "base": str(ROOT / "configs" / "demo.yaml"), **change}))
    res = runner.invoke(app, ["config", "validate", str(p)])
    assert res.exit_code == 2 and f"{p}: {field}" in res.output, res.output
    # `rlvr sweep run` refuses it in one line before Prefect is even imported (nothing can be submitted).
    proc = subprocess.run([sys.executable, "-c", "import sys; from rlvr_cli.main import app\n"
                           "try:\n    app(['sweep', 'run', sys.argv[1]])\nexcept SystemExit as e:\n"
                           "    assert 'prefect' not in sys.modules; raise", str(p)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"invalid sweep: {p}: {field}"), line


def test_trial_names_say_what_differs_in_short_keys():
    assert short_names(["grpo.lr", "grpo.loss_agg"]) == {"grpo.lr": "lr", "grpo.loss_agg": "loss_agg"}
    assert short_names(["grpo.lr", "model.warm_start.lr", "seed"]) == {
        "grpo.lr": "grpo.lr", "model.warm_start.lr": "warm_start.lr", "seed": "seed"}
    sw = load_sweep(ROOT / "configs" / "sweeps" / "demo_lr.yaml")
    labels = [t.label for t in sw.trials]
    assert labels == [f"lr={lr} seed={s}" for lr in ("3e-05", "0.0003") for s in (0, 1, 2)]
    assert len(set(labels)) == len(labels)


def test_one_line_error_from_prefect_state_messages():
    cfg = ("Flow run encountered an exception: ConfigError: invalid config\n"
           "  <pipeline parameter config>: grpo.lr: Input should be greater than 0\n  x.yaml: seeds: repeated")
    assert one_line_error(cfg) == "<pipeline parameter config>: grpo.lr: Input should be greater than 0; x.yaml: seeds: repeated"
    tb = "Traceback (most recent call last):\n  File \"a.py\", line 1\nValueError: bad verifier output"
    assert one_line_error(tb) == "ValueError: bad verifier output"
    assert one_line_error("Flow run encountered an exception: SweepFailed: trial t01 (lr=1e-05 seed=0) failed: "
                          "GuardError: G-logprob-temp: differ") == \
        "trial t01 (lr=1e-05 seed=0) failed: GuardError: G-logprob-temp: differ"
    child = ("Flow run encountered an exception: StageProcessError: train failed in its process: GuardError: x\n"
             "Traceback (most recent call last):\n  File \"tasks/stage_runner.py\", line 86, in main\n"
             "rlvr_core.experiment.guards.GuardError: G-logprob-temp: trainer log-probs differ")
    assert one_line_error(child) == "rlvr_core.experiment.guards.GuardError: G-logprob-temp: trainer log-probs differ"
    assert one_line_error(None) == ""


def _write_trials(db: Path, sweep_id: str, scores: dict[tuple[str, str], list[float]]) -> None:
    """Trial rows as the pipeline flow records them: runs, flattened config params (+ sweep.*), eval metrics."""
    with warehouse.writer(db) as con:
        i = 0
        for (agg, lr), values in scores.items():
            for seed, v in enumerate(values):
                rid = f"run{i}"
                con.execute("INSERT INTO runs (run_id, experiment, name, kind, started_at) VALUES (?, 'e', ?, 'trial', "
                            "TIMESTAMP '2026-01-01 00:00:00' + to_seconds(?))", [rid, rid, i])
                params = {"grpo.loss_agg": agg, "grpo.lr": lr, "seed": str(seed), "sampling.seed": "7",
                          "grpo.steps": "4", "sweep.id": sweep_id, "sweep.trial_id": f"t{i:02d}",
                          "sweep.trial_label": f"loss_agg={agg} lr={lr} seed={seed}"}
                con.executemany("INSERT INTO run_params VALUES (?, ?, ?)", [[rid, k, x] for k, x in params.items()])
                con.execute("INSERT INTO eval_metrics (run_id, eval_id, benchmark, metric, value, n, ci_low, ci_high) "
                            "VALUES (?, 'trained', 'synthetic', 'accuracy_greedy', ?, 40, ?, ?)", [rid, v, v - .1, v + .1])
                i += 1


def test_show_prints_the_pivot_with_t_intervals_across_seeds(tmp_path):
    db = tmp_path / "warehouse.duckdb"
    scores = {("token-mean", "1e-05"): [0.25, 0.30, 0.35], ("token-mean", "5e-05"): [0.20, 0.20, 0.26],
              ("seq-mean-token-mean", "1e-05"): [0.40, 0.30, 0.20], ("seq-mean-token-mean", "5e-05"): [0.1, 0.1, 0.1]}
    _write_trials(db, "demo-lr-0123abcd", scores)
    res = runner.invoke(app, ["sweep", "show", "demo-lr", "--warehouse", str(db)])  # by name: the latest run
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0] == "sweep demo-lr-0123abcd: 12 trials"
    assert lines[1].split() == ["loss_agg", "lr", "seeds", "mean", "accuracy_greedy", "95%", "CI", "per", "seed"]
    rows = {tuple(ln.split()[:2]): ln for ln in lines[3:7]}
    assert len(rows) == 4
    t = 4.302652729911275  # Student t, 2 degrees of freedom, 97.5%
    for (agg, lr), vals in scores.items():
        mean = sum(vals) / 3
        half = t * math.sqrt(sum((v - mean) ** 2 for v in vals) / 2) / math.sqrt(3)
        line = rows[(agg, lr)]
        assert line.split()[2:4] == ["3", f"{mean:.3f}"], line
        assert f"[{mean - half:.3f}, {mean + half:.3f}]" in line, line
        assert ", ".join(f"{v:.3f}" for v in vals) + "  (seeds 0, 1, 2)" in line, line
    assert lines[7].startswith("95% CI: t over 3 seeds")
    # The pivot function agrees, and an unknown sweep is one line, exit 2.
    assert [r["n_seeds"] for r in sweep_pivot("demo-lr-0123abcd", ["grpo.loss_agg", "grpo.lr"], path=db)] == [3] * 4
    res = runner.invoke(app, ["sweep", "show", "nope", "--warehouse", str(db)])
    assert res.exit_code == 2 and "no sweep 'nope' in the warehouse" in res.output and "demo-lr-0123abcd" in res.output


def test_set_changes_sweep_fields_grid_entries_or_every_trial(tmp_path):
    from rlvr_core.pipeline.sweeps import submitted_mapping

    sw, mapping = submitted_mapping(ROOT / "configs" / "sweeps" / "demo_lr.yaml",
                                    {"seeds": [0, 1, 2, 3], "grid.grpo.loss_agg": ["token-mean"], "grpo.steps": 6})
    assert len(sw.trials) == 1 * 2 * 4 and {t.config["grpo"]["steps"] for t in sw.trials} == {6}
    assert sw.source.endswith("demo_lr.yaml (with --set)")
    # What is submitted needs no file of this machine: the base is inlined, and it expands to the same trials.
    assert isinstance(mapping["base"], dict)
    from rlvr_core.pipeline.sweeps import parse_sweep

    assert [t.config for t in parse_sweep(mapping, "submitted").trials] == [t.config for t in sw.trials]


def test_show_finds_swept_keys_from_labels_even_single_valued():
    from rlvr_core.pipeline.sweeps import swept_keys_from_params

    # `--set grid.grpo.loss_agg=[token-mean]`: one value, still a column; `lr` is grpo.lr (it varies), not the
    # constant model.warm_start.lr; seed fields are not columns.
    trials = {f"r{i}": {"grpo.lr": lr, "model.warm_start.lr": "0.003", "grpo.loss_agg": "token-mean", "seed": str(s),
                        "sampling.seed": str(s), "sweep.trial_label": f"loss_agg=token-mean lr={lr} seed={s}"}
              for i, (lr, s) in enumerate([("1e-05", 0), ("1e-05", 1), ("5e-05", 0), ("5e-05", 1)])}
    assert swept_keys_from_params(trials) == ["grpo.loss_agg", "grpo.lr"]
    for p in trials.values():
        del p["sweep.trial_label"]
    assert swept_keys_from_params(trials) == ["grpo.lr"]  # no labels: what differs, less the seed fields
