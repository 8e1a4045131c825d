"""Defaults that guard a run: periodic evaluation by default for long runs, the base evaluation as
G-reward-hacking's reference, the beta-0 drift signal that G-kl-explosion and G-entropy's stop watch, and
the guard coverage every run summary lists (docs/guards.md, "What a default run is guarded against")."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rlvr_core.experiment.config import ConfigError, GRPOConfig, demo_config, load_config, parse_config
from rlvr_core.experiment.guard_coverage import GUARDS, guard_coverage, unguarded_line
from rlvr_core.experiment.guards import (GUARD_ENTROPY, GUARD_KL_EXPLOSION, GUARD_REWARD_HACKING, check_health)

ROOT = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------------------- periodic eval
def test_eval_every_auto_gives_about_ten_points_on_long_runs_and_zero_stays_off():
    assert GRPOConfig().eval_every == "auto" and GRPOConfig().eval_interval() == 15  # 150 steps: 10 points
    assert GRPOConfig(steps=41).eval_interval() == 5 and GRPOConfig(steps=8000).eval_interval() == 800
    assert GRPOConfig(steps=40).eval_interval() == 0  # short runs: after the last step only
    assert GRPOConfig(steps=1000, eval_every=0).eval_interval() == 0  # explicitly off
    # The demo sets its own interval: its numbers and time do not change.
    assert demo_config().grpo.eval_interval() == 40
    assert load_config(ROOT / "configs" / "demo.yaml").grpo.eval_interval() == 40
    with pytest.raises(ConfigError, match=r"exp.yaml: grpo.eval_every"):
        parse_config({"grpo": {"eval_every": "often"}}, "exp.yaml")
    with pytest.raises(ConfigError, match=r"exp.yaml: grpo.eval_every.*'auto' or an integer >= 0"):
        parse_config({"grpo": {"eval_every": -3}}, "exp.yaml")


# ----------------------------------------------------------------------------------------- guard coverage
def _needs(cov: dict[str, str]) -> dict[str, str]:
    return {g: v for g, v in cov.items() if not v.startswith("active")}


def test_guard_coverage_lists_every_guard_for_the_shipped_configs():
    demo = guard_coverage(demo_config())
    assert list(demo) == list(GUARDS) and len(GUARDS) == 33
    assert all(v.startswith(("active", "needs ")) for v in demo.values())
    assert _needs(demo) == {}  # the demo (beta 0.1, eval every 40 of 120 steps) is guarded by every guard
    assert demo["G-kl-explosion"] == "active" and demo["G-no-eval"].startswith("active: every 40 steps")
    assert demo["G-weight-push"].startswith("active: nothing to push (engine hf")
    assert demo["G-tito-context"].startswith("active: nothing to check (single-turn rollouts")
    tools = guard_coverage(load_config(ROOT / "configs" / "examples" / "tool-demo.yaml"))
    assert {g: tools[g] for g in ("G-tito-context", "G-tito-mask", "G-tool-errors", "G-turn-budget",
                                  "G-rerender-drift")} == dict.fromkeys(("G-tito-context", "G-tito-mask",
                                                                        "G-tool-errors", "G-turn-budget",
                                                                        "G-rerender-drift"), "active")
    loose = parse_config({"grpo": {"enabled": True}, "environment": {"name": "tools", "max_cut_share": 1.0}})
    assert guard_coverage(loose)["G-turn-budget"] == "off: environment.max_cut_share = 1 (no share can exceed 1)"
    server = parse_config({"grpo": {"enabled": True}, "sampling": {"engine": "vllm-server", "servers": ["http://h:1"]}})
    assert guard_coverage(server)["G-weight-push"] == "active"
    # The defaults with training on: beta 0, so the drift signal carries G-kl-explosion and G-entropy's stop.
    default = guard_coverage(parse_config({"grpo": {"enabled": True}}))
    assert _needs(default) == {}
    assert "drift signal every 4 steps" in default["G-kl-explosion"]
    assert "kl_spike_max flag needs grpo.beta > 0" in default["G-kl-explosion"]
    # Every example config validates; a recipe that trains is guarded by every guard; without training, the
    # training guards say what they need.
    for path in sorted((ROOT / "configs" / "examples").glob("*.yaml")):
        cfg = load_config(path)
        cov = guard_coverage(cfg)
        assert list(cov) == list(GUARDS), path
        if cfg.grpo.enabled:
            assert _needs(cov) == {} and cov["G-collapse"] == "active", (path, _needs(cov))
        else:
            assert cov["G-collapse"] == "needs grpo.enabled (no training in this run)", path


def test_guard_coverage_names_the_setting_a_blind_guard_needs():
    blind = parse_config({"grpo": {"enabled": True, "steps": 30,
                                   "guards": {"drift_every": 0,
                                              "health": {"enabled": ["G-collapse", "G-entropy", "G-kl-explosion"]}}},
                          "reward": {"max_timeout_share": 1.0}})
    enabled = "off: grpo.guards.health.enabled = ['G-collapse', 'G-entropy', 'G-kl-explosion']"
    assert _needs(guard_coverage(blind)) == {
        "G-kl-explosion": "needs grpo.beta > 0 or grpo.guards.drift_every > 0 (no reference model and no drift signal)",
        "G-entropy": "needs grpo.beta > 0 or grpo.guards.drift_every > 0 for its stop (the entropy-floor flag is active)",
        "G-no-eval": "needs grpo.eval_every > 0 (or auto with grpo.steps > 40); now only the last step is evaluated",
        "G-reward-hacking": f"{enabled} (G-reward-hacking left out)",
        "G-no-signal": f"{enabled} (G-no-signal left out)",
        "G-verifier-hang": "off: reward.max_timeout_share = 1 (no share can exceed 1)",
    }
    few = guard_coverage(parse_config({"grpo": {"enabled": True, "steps": 100, "eval_every": 50}}))
    assert few["G-reward-hacking"] == "needs at least 3 eval points during training (grpo.eval_every; now 2)"
    # The pipeline run's report says how many are active and names each blind one with what it needs.
    from rlvr_core.pipeline.run_record import coverage_lines

    lines = coverage_lines(guard_coverage(blind))
    assert lines[1] == "Guards (docs/guards.md): 27 of 33 active." and len(lines) == 2 + 6
    assert "- G-no-eval needs grpo.eval_every > 0" in "\n".join(lines)


# Each guard switched off by a value of the demo's config: (override, guard, what coverage must say). Every guard
# is active in the demo itself, so each row also shows the value, not the guard, is what switched it off.
H = "grpo.guards.health"
OFF_BY_VALUE = [
    ({"reward.max_timeout_share": 1.0}, "G-verifier-hang", "off: reward.max_timeout_share = 1 (no share can exceed 1)"),
    ({"reward.max_error_share": 1.0, "eval.max_verifier_error_share": 1.0}, "G-verifier-error",
     "off: reward.max_error_share and eval.max_verifier_error_share = 1 and 1 (no share can exceed 1)"),
    ({"eval.max_truncation_share": 1.0}, "G-truncation", "off: eval.max_truncation_share = 1 (no share can exceed 1"),
    ({"grpo.steps": 12}, "G-no-eval",
     "off: grpo.eval_every = 40 (not shorter than the run's 12 steps: only the last step is evaluated)"),
    ({"grpo.steps": 12}, "G-reward-hacking", "needs at least 3 eval points during training (grpo.eval_every; now 1)"),
    ({f"{H}.collapse": {"window": 130}}, "G-collapse",
     f"off: {H}.collapse.window = 130 (first judged at step 130, after the run's 120 steps)"),
    ({f"{H}.collapse": {"min_signals": 8}}, "G-collapse",
     f"off: {H}.collapse.min_signals = 8 (more than the 7 signals it watches)"),
    ({f"{H}.entropy": {"window": 100, "baseline_steps": 30}}, "G-entropy",
     f"off: {H}.entropy.window + baseline_steps = 130 (first judged at step 130, after the run's 120 steps)"),
    ({f"{H}.kl_explosion": {"window": 200}, "grpo.beta": 0.0}, "G-kl-explosion",
     f"off: {H}.kl_explosion.window = 200 (first judged at step 200, after the run's 120 steps)"),
    ({f"{H}.no_signal": {"min_dead_steps": 6}}, "G-no-signal",
     f"off: {H}.no_signal.min_dead_steps = 6 (more than its window of 5 steps holds)"),
    ({f"{H}.enabled": ["G-collapse", "G-entropy", "G-kl-explosion", "G-reward-hacking"]}, "G-no-signal",
     f"off: {H}.enabled = ['G-collapse', 'G-entropy', 'G-kl-explosion', 'G-reward-hacking'] (G-no-signal left out)"),
    ({"grpo.enabled": False}, "G-no-signal", "needs grpo.enabled (no training in this run)"),
]


@pytest.mark.parametrize("overrides, guard, expected", OFF_BY_VALUE, ids=[f"{g}-{i}" for i, (_, g, _) in
                                                                         enumerate(OFF_BY_VALUE)])
def test_a_guard_switched_off_by_a_value_is_listed_off_with_the_value(overrides, guard, expected):
    assert guard_coverage(demo_config())[guard].startswith("active")
    cfg = load_config(ROOT / "configs" / "demo.yaml", overrides)
    cov = guard_coverage(cfg)
    assert cov[guard].startswith(expected), cov[guard]
    # The run says so once at start, beside every other guard it runs without.
    assert f"{guard} ({expected.removeprefix('off: ')}" in unguarded_line(cov)


def test_partly_off_guards_stay_active_and_say_which_part_runs():
    kl = guard_coverage(load_config(ROOT / "configs" / "demo.yaml", {f"{H}.kl_explosion": {"window": 200}}))
    assert kl["G-kl-explosion"].startswith("active: the per-step kl_spike_max flag only")  # beta 0.1: the flag runs
    err = guard_coverage(load_config(ROOT / "configs" / "demo.yaml", {"eval.max_verifier_error_share": 1.0}))
    assert err["G-verifier-error"].startswith("active: training steps only")
    short = guard_coverage(load_config(ROOT / "configs" / "demo.yaml", {"grpo.steps": 8}))
    assert short["G-collapse"].startswith("active: reward, truncation and length against the base model only")
    assert unguarded_line(guard_coverage(demo_config())) is None  # the demo: nothing to say


# ----------------------------------------------------------------------------------------- base eval reference
def test_base_reference_scores_the_base_evaluation_on_the_periodic_slice(rlvr_home):
    from rlvr_core.eval.metrics import samples_table
    from rlvr_core.pipeline import stages
    from rlvr_core.pipeline.evaluation_stage import held_out_problems, periodic_problems

    cfg = parse_config({"data": {"synthetic": {"n_test": 10}}, "grpo": {"eval_max_problems": 4}})
    data = stages.prepare_data(cfg)
    ids = [p["id"] for p in held_out_problems(cfg, data, stages.held_out_spec(cfg))]
    correct = {ids[0], ids[2], ids[5], ids[6], ids[7]}  # 2 of the slice's 4, 3 more outside it
    rows = [{"problem_id": i, "greedy": True, "status": "correct" if i in correct else "incorrect"} for i in ids]
    rows += [{"problem_id": i, "greedy": False, "status": "correct"} for i in ids]  # sampled: not the greedy score
    base = stages.EvalArtifact(samples_table(rows), None, {}, {})
    assert stages.base_reference(cfg, data, base) == {"greedy_pass_at_1": 0.5, "greedy_pass_at_1_n": 4.0}
    # The periodic evaluation scores exactly that slice.
    assert [p["id"] for p in periodic_problems(cfg, held_out_problems(
        cfg, data, stages.held_out_spec(cfg)))] == ids[:4]
    # A base evaluation that missed a problem of the slice is no reference.
    partial = stages.EvalArtifact(samples_table(rows[1:]), None, {}, {})
    assert stages.base_reference(cfg, data, partial) == {}


# ----------------------------------------------------------------------------------------- real trainer runs
from grpo_helpers import tiny_cfg, train_tiny  # noqa: E402


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def test_base_eval_is_the_reward_hacking_reference_in_a_real_run(tiny, tmp_path):
    # The held-out score stays at 0.30 at every eval point: against its own first point nothing fell, but
    # the base model scored 0.50, so with the base evaluation handed over, the run fell 20 points below base.
    def held_out(model, tokenizer):
        return {"greedy_pass_at_1": 0.30}

    cfg = tiny_cfg(steps=6, eval_every=2)
    alone = train_tiny(tiny, tmp_path / "alone", cfg, evaluate=held_out)
    assert not [f for f in alone.summary["health_firings"] if f["guard_id"] == GUARD_REWARD_HACKING]
    based = train_tiny(tiny, tmp_path / "based", cfg, evaluate=held_out, base_eval={"greedy_pass_at_1": 0.50})
    fired = [f for f in based.summary["health_firings"] if f["guard_id"] == GUARD_REWARD_HACKING]
    assert [f["step"] for f in fired] == [4] and fired[0]["evidence"]["reference"] == "base"
    assert fired[0]["evidence"]["eval_reference"] == 0.50 and "vs the base model" in fired[0]["reason"]
    rows = pq.read_table(based.steps_path).to_pylist()
    assert [r["health/G-reward-hacking"] for r in rows] == [0, 0, 0, 1, 0, 0]


def test_drift_signal_at_beta_0_is_measured_every_n_steps_and_not_with_a_reference(tiny, tmp_path):
    rows = pq.read_table(train_tiny(tiny, tmp_path / "b0", tiny_cfg(steps=5, guards={"drift_every": 2})).steps_path).to_pylist()
    measured = [r["step"] for r in rows if not math.isnan(r["drift/kl_mean"])]
    assert measured == [1, 3, 5]
    # Sampled at T 0.8 and trained at lr 1e-2: the update moves the policy, by a bounded amount.
    assert all(0 < r["drift/kl_mean"] <= r["drift/kl_max"] < 100 for r in rows if r["step"] in measured)
    ref = pq.read_table(train_tiny(tiny, tmp_path / "b1", tiny_cfg(steps=2, beta=0.1)).steps_path).to_pylist()
    assert all(math.isnan(r["drift/kl_mean"]) and r["kl_ref_mean"] >= 0 for r in ref)


def test_drift_signal_catches_the_lr_blowup_without_a_reference(tiny, tmp_path):
    """lr 0.5 at beta 0 (no reference model): one update moves the sampled tokens' KL by > 1 nat per token
    (healthy lr 1e-2: <= 0.43 at the first steps, then ~0.01), so G-kl-explosion fires from the drift signal
    at step 5, its first evaluable step, before G-collapse stops the run at step 10."""
    from rlvr_core.experiment.guards import GuardError

    out = tmp_path / "hot"
    with pytest.raises(GuardError, match="G-collapse"):
        train_tiny(tiny, out, tiny_cfg(steps=12, lr=0.5, warmup_steps=2, guards={"drift_every": 1}))
    rows = pq.read_table(out / "steps.parquet").to_pylist()
    assert all(math.isnan(r["kl_ref_max"]) for r in rows)
    kl = [f for f in check_health(rows) if f.guard_id == GUARD_KL_EXPLOSION]
    assert [f.step for f in kl] == [5] and "no reference model" in kl[0].reason
    assert kl[0].evidence["drift_kl_mean_window_median"] >= 0.5
    assert [r["step"] for r in rows if r["health/G-kl-explosion"]] == [5]  # marked in the run's own rows


def test_entropy_stop_without_a_reference_uses_the_drift_signal():
    # A policy gone deterministic (entropy 4 -> 0.01) while single updates still move a sampled token's
    # probability ~1000x (k3 KL ~1000): without a reference, the drift signal makes G-entropy serious.
    rows = [{"step": s, "entropy": 4.0 if s <= 5 else 0.01, "kl_ref_max": float("nan"),
             "drift/kl_mean": 0.01, "drift/kl_max": 2.0 if s < 9 else 1000.0} for s in range(1, 13)]
    ent = [f for f in check_health(rows) if f.guard_id == GUARD_ENTROPY]
    assert [(f.step, f.serious) for f in ent] == [(10, True)] and "no reference model" in ent[0].reason
    calm = [{**r, "drift/kl_max": 2.0} for r in rows]
    assert [(f.step, f.serious) for f in check_health(calm) if f.guard_id == GUARD_ENTROPY] == [(10, False)]
