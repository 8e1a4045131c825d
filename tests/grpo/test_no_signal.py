"""G-no-signal: a run that trains no token (or nearly none) for a window, or whose pass-rate table shows the base model
solves none of the curriculum's prompts, stops (before training, or within the window) with its real cause named in
one line.

The issue's two runs are planted from what they really produced at small sizes (`rlvr demo -c configs/demo.yaml
--set passk.max_prompts=160 --set grpo.steps=12 --set eval.max_problems=20` plus the plant; each entry of
tests/grpo/data/no_signal_plants.json names its command): the step rows and pass-rate samples of
`--set reward.verifier=math --set reward.mode=boxed`, and of near-greedy rollouts. On this tree the issue's
`--set sampling.temperature=0.05` only changes the pass-rate table's temperature and the run learns (+45 points:
kept as the run that must not stop); the symptoms the issue reports for it (0-2 of 48 groups kept, G-fixed-seed and
G-verifier-format blamed) are those of `--set grpo.temperature=0.05`, planted as the near-greedy run. The detector
and the pass-rate check are tested on those real records without a demo run here. One real trainer run on the tiny
model (a verifier that never matches its outputs) shows the stop, the quoted outputs, the flag lines and the record
the stop leaves; another shows a guard stop at step 1 leaves its record too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rlvr_core.experiment.config import RewardConfig
from rlvr_core.experiment.guards import GUARD_NO_SIGNAL, GuardError, NoSignalConfig, check_health, detect_no_signal
from rlvr_core.experiment.no_signal import passrate_no_signal
from rlvr_core.artifacts.layout import STEPS_FILE, SUMMARY_FILE
from rlvr_core.grpo.trainer import run_health, train_grpo
from grpo_helpers import tiny_cfg, train_tiny

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

DATA = Path(__file__).parent / "data" / "no_signal_plants.json"


@pytest.fixture(scope="module")
def plants() -> dict:
    return json.loads(DATA.read_text())


def _ctx(plant: dict) -> NoSignalConfig:
    """The detector's settings as the trainer fills them in for that run (`run_health`)."""
    s = plant["settings"]
    return NoSignalConfig(verifier=s["verifier"], verifier_mode=s["mode"], temperature=s["grpo_temperature"],
                          passrate_temperature=s["sampling_temperature"])


# ------------------------------------------------------------------------------------- the two reported runs
def test_a_verifier_that_never_matches_is_stopped_before_training_naming_verifier_mode_and_outputs(plants):
    plant = plants["verifier"]
    s = plant["settings"]
    hit = passrate_no_signal(plant["curriculum"], plant["samples"], verifier=s["verifier"], mode=s["mode"],
                             temperature=s["grpo_temperature"], passrate_temperature=s["sampling_temperature"])
    assert hit is not None, "the base solves none of the kept prompts: this must stop before training"
    reason, evidence = hit
    assert reason.startswith("G-no-signal before training")
    assert "cause: the reward verifier math (mode boxed) extracted no answer from 100%" in reason, reason
    assert "unextracted outputs: '" in reason and "####" in reason  # the model's own answer format, quoted
    assert evidence["cause"] == "verifier"


def test_near_greedy_rollouts_stop_within_the_window_naming_the_temperature_and_zero_variance_share(plants):
    plant = plants["temperature"]
    s = plant["settings"]
    # Its pass-rate table (at the demo's temperature 1) has solved prompts, so nothing stops before training ...
    assert passrate_no_signal(plant["curriculum"], [], verifier=s["verifier"], mode=s["mode"],
                              temperature=s["grpo_temperature"], passrate_temperature=s["sampling_temperature"]) is None
    # ... and the steps that keep 0-2 of 48 groups stop it at step 4, blaming the temperature, not the verifier or a
    # fixed seed (which is what the flags on those steps, G-fixed-seed and G-verifier-format, point at).
    [f] = [f for f in check_health(plant["rows"], run_health_for(plant)) if f.serious]
    assert f.guard_id == GUARD_NO_SIGNAL and f.step == 4, f.reason
    assert f.evidence["cause"] == "temperature", f.reason
    cause = f.reason.split("cause: ", 1)[1]
    assert cause.startswith("near-greedy rollouts: grpo.temperature 0.05") and "zero-variance groups 99%" in cause
    assert "verifier" not in cause and "seed" not in cause


def test_a_near_greedy_pass_rate_table_does_not_stop_a_run_that_learns(plants):
    # `--set sampling.temperature=0.05`: the table (1 correct sample in its 158 kept prompts) says nothing about the
    # rollouts at temperature 1, which trained +45 points; nothing stops it, before training or during.
    plant = plants["sampling_temperature"]
    s = plant["settings"]
    assert sum(r["c"] for r in plant["curriculum"]) == 1
    no_solved = [{**r, "c": 0} for r in plant["curriculum"]]  # had the table caught none, still no stop
    for cur in (plant["curriculum"], no_solved):
        assert passrate_no_signal(cur, [], verifier=s["verifier"], mode=s["mode"], temperature=s["grpo_temperature"],
                                  passrate_temperature=s["sampling_temperature"]) is None
    assert [f for f in check_health(plant["rows"], run_health_for(plant)) if f.guard_id == GUARD_NO_SIGNAL] == []


def run_health_for(plant: dict):
    """`run_health` as the trainer calls it for that run's settings."""
    s = plant["settings"]
    return run_health(tiny_cfg(temperature=s["grpo_temperature"]), None,
                      RewardConfig(verifier=s["verifier"], mode=s["mode"]), s["sampling_temperature"])


def test_a_healthy_run_never_fires(plants):
    # The healthy demo's steps (the same recipe at the defaults): groups carry signal at every step.
    plant = plants["healthy"]
    assert detect_no_signal(plant["rows"], _ctx(plant)) == []
    s = plant["settings"]
    assert passrate_no_signal(plant["curriculum"], [], verifier=s["verifier"], mode=s["mode"],
                              temperature=s["grpo_temperature"], passrate_temperature=s["sampling_temperature"]) is None


def test_the_pipeline_stops_before_the_base_evaluation_and_leaves_what_its_record_needs(plants, rlvr_home):
    # The check the flow runs right after the curriculum (stages.no_signal_before_training), on the verifier plant's
    # real curriculum and pass-rate samples laid out as the stages cache them: GuardError naming the cause, and the
    # stopped summary in the training folder that the flow records (stopped_training finds it).
    import pyarrow as pa

    from rlvr_core.experiment.config import load_config
    from rlvr_core.pipeline import stages

    plant = plants["verifier"]
    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "demo.yaml",
                      {"reward.verifier": "math", "reward.mode": "boxed", "grpo.steps": 12})
    cur_dir, table_dir = rlvr_home / "cache" / "curriculum" / "c1", rlvr_home / "cache" / "pass_rate_table" / "t1"
    cur_dir.mkdir(parents=True), table_dir.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(plant["curriculum"]), cur_dir / "curriculum.parquet")
    (cur_dir / "cache_key.json").write_text(json.dumps({"table": "t1"}))
    pq.write_table(pa.Table.from_pylist(plant["samples"]), table_dir / "samples.parquet")
    base = stages.ModelArtifact("unused", "base", "model-hash", "tokenizer-hash", True)
    cur = stages.CurriculumArtifact(str(cur_dir / "curriculum.parquet"), "c1", len(plant["curriculum"]), True)
    with pytest.raises(GuardError) as e:
        stages.no_signal_before_training(cfg, base, cur)
    assert str(e.value).startswith("G-no-signal before training") and "mode boxed" in str(e.value)
    folder, summary = stages.stopped_training(cfg, base, cur)
    assert summary["stopped_at_step"] == 0 and summary["stopped_by"] == [GUARD_NO_SIGNAL]
    assert summary["guard_coverage"]["G-no-signal"] == "active" and summary["health_firings"][0]["serious"]
    assert not (folder / STEPS_FILE).exists()  # no step ran; the record goes without train/steps.parquet


# ------------------------------------------------------------------------------------- real trainer runs
def test_a_real_run_whose_verifier_never_matches_stops_at_step_4_quoting_outputs_and_leaves_its_record(tiny, tmp_path):
    model_dir, rows, ids = tiny
    out = tmp_path / "boxed"
    lines: list[str] = []
    with pytest.raises(GuardError) as e:
        train_grpo(model_dir, rows, ids, out, tiny_cfg(steps=8), template_id="qa",
                   reward=RewardConfig(verifier="math", mode="boxed", workers=1), max_new_tokens=12, seed=0,
                   progress=lines.append)
    msg = str(e.value)
    assert msg.startswith("G-no-signal at step 4: 4 of the 4 steps 1-4 trained no token or nearly none"), msg
    assert "cause: the reward verifier math (mode boxed) extracted no answer from 100%" in msg
    assert "unextracted outputs: '" in msg
    summary = json.loads((out / SUMMARY_FILE).read_text())
    assert summary["stopped_by"] == [GUARD_NO_SIGNAL] and summary["stopped_at_step"] == 4
    assert "collapsed" in summary["tags"]
    assert pq.read_table(out / STEPS_FILE).num_rows == 4
    assert any(line.startswith("STOP G-no-signal at step 4") for line in lines)
    # The per-step G-verifier-format flag opened at step 1: one terminal line for the episode, not one per step.
    assert [line for line in lines if line.startswith("flag G-verifier-format")] == [
        "flag G-verifier-format from step 1: zero-reward-variance groups at or above grpo.guards.zero_var_guard_share "
        "over the window (one line per episode; all in health_events)"]


def test_a_stop_at_step_1_leaves_its_summary_and_an_empty_steps_file(tiny, tmp_path):
    # G-logprob-temp is raised inside the step-1 update, before any step row: the run still leaves its record.
    out = tmp_path / "lpt"
    with pytest.raises(GuardError, match="G-logprob-temp"):
        train_tiny(tiny, out, tiny_cfg(steps=3, logprob_temperature=0.8))
    summary = json.loads((out / SUMMARY_FILE).read_text())
    assert summary["stopped_at_step"] == 1 and summary["stopped_by"] == ["G-logprob-temp"]
    assert summary["tags"] == ["collapsed"] and summary["steps"] == 0
    [firing] = summary["health_firings"]
    assert firing["guard_id"] == "G-logprob-temp" and firing["serious"] and "temperature 0.8" in firing["reason"]
    assert pq.read_table(out / STEPS_FILE).num_rows == 0


# ------------------------------------------------------------------------------------- how the plants were made
def _extract(home: Path, out: dict, name: str, settings: dict, steps: int = 12) -> None:  # pragma: no cover
    """Add one demo run's records to the plants: the first `steps` step rows (the detector's columns), the
    curriculum's counts and the pass-rate samples of its kept prompts (status, response). Run by hand on the
    homes of the runs named in the module docstring."""
    cols = ["step", "n_tokens", "zero_var_group_share", "reward_mean", "unique_frac_mean", "dynamic/groups_kept",
            *[f"status/{s}" for s in ("correct", "incorrect", "no_answer", "error", "timeout")]]
    cache = home / "cache"
    grpo = max((cache / "grpo").glob(f"*/{STEPS_FILE}"), key=lambda p: p.stat().st_mtime)
    rows = [{k: r.get(k) for k in cols} for r in pq.read_table(grpo).to_pylist()[:steps]]
    cur_dir = max((cache / "curriculum").glob("*/curriculum.parquet"), key=lambda p: p.stat().st_mtime).parent
    cur = pq.read_table(cur_dir / "curriculum.parquet", columns=["problem_id", "c", "n"]).to_pylist()
    table = json.loads((cur_dir / "cache_key.json").read_text())["table"]
    kept = {r["problem_id"] for r in cur}
    samples = [s for s in pq.read_table(cache / "pass_rate_table" / table / "samples.parquet",
                                        columns=["problem_id", "status", "response"]).to_pylist()
               if s["problem_id"] in kept]
    out[name] = {"settings": settings, "rows": rows, "curriculum": cur, "samples": samples[:64]}
