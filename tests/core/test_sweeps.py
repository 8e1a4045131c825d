"""Sweep files: expansion into trials, and errors that name the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rlvr_core.experiment.config import ConfigError, load_config
from rlvr_core.pipeline.sweeps import find_sweep, load_sweep, parse_sweep

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, data: dict, name: str = "s.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return p


def test_demo_sweep_is_the_demo_recipe_at_two_lrs_times_three_seeds():
    sw = load_sweep(ROOT / "configs" / "sweeps" / "demo_lr.yaml")
    assert [t.trial_id for t in sw.trials] == [f"t{i:02d}" for i in range(6)]
    assert sw.swept_keys == ["grpo.lr"]
    assert [(t.config["grpo"]["lr"], t.config["seed"]) for t in sw.trials] == [
        (lr, s) for lr in (3e-5, 3e-4) for s in (0, 1, 2)]
    # The demo's recipe: its data, base model, sampling and GRPO batch; only the length of training (and the
    # warm-up and evaluation interval that scale with it) and the lr differ.
    base = load_config(ROOT / "configs" / "demo.yaml").resolved()
    assert 3e-4 == base["grpo"]["lr"]
    for t in sw.trials:
        for section in ("data", "model", "prompt", "sampling"):
            assert t.config[section] == base[section], section
        differ = {k for k in base["grpo"] if t.config["grpo"][k] != base["grpo"][k]}
        assert differ <= {"lr", "steps", "warmup_steps", "eval_every"}, differ
        assert t.config["grpo"]["steps"] == 10 and t.config["passk"]["max_prompts"] == 200
    assert find_sweep("demo-lr") == ROOT / "configs" / "sweeps" / "demo_lr.yaml"


def test_sampling_ablation_sweep_expands_to_valid_variants_times_seeds():
    # Seed 001's ablation table as one sweep: every trial a valid experiment (staleness never meets
    # dynamic or adaptive sampling, which the config refuses), the seed the only other difference.
    sw = load_sweep(ROOT / "configs" / "sweeps" / "sampling_ablations.yaml")
    assert len(sw.trials) == 12
    kinds = [(g["dynamic_sampling"], g["max_staleness"], g["adaptive_sampling"])
             for g in (t.config["grpo"] for t in sw.trials)]
    assert kinds == [k for k in ((False, 0, False), (True, 0, False), (False, 1, False), (True, 0, True))
                     for _ in range(3)]
    assert [t.config["seed"] for t in sw.trials] == [0, 1, 2] * 4
    base = load_config(ROOT / "configs" / "demo.yaml").resolved()
    for t in sw.trials:
        assert {k: v for k, v in t.config["grpo"].items() if not k.startswith(("adaptive", "dynamic_sampling", "max_st"))} \
            == {k: v for k, v in base["grpo"].items() if not k.startswith(("adaptive", "dynamic_sampling", "max_st"))}
    assert find_sweep("sampling-ablations") == ROOT / "configs" / "sweeps" / "sampling_ablations.yaml"


def test_loss_ablation_and_distillation_sweeps_expand_to_valid_demo_trials():
    # Issue 54's two sweeps: every trial a valid experiment of the demo recipe (10 steps, like demo-lr), the swept
    # field and the seed the only differences, and the teacher a `--set` away (run:<the demo's run id>).
    from rlvr_core.pipeline.sweeps import with_overrides

    base = load_config(ROOT / "configs" / "demo.yaml").resolved()
    losses = load_sweep(ROOT / "configs" / "sweeps" / "demo_losses.yaml")
    assert losses.swept_keys == ["grpo.policy_loss"] and len(losses.trials) == 12
    assert [(t.config["grpo"].get("policy_loss", "ppo_clip"), t.config["seed"]) for t in losses.trials] == [
        (loss, s) for loss in ("ppo_clip", "gspo", "cispo", "sapo") for s in (0, 1, 2)]
    for t in losses.trials:
        g = t.config["grpo"]
        differ = {k for k in set(base["grpo"]) | set(g) if g.get(k) != base["grpo"].get(k)}
        assert differ <= {"policy_loss", "steps", "warmup_steps", "eval_every", "epochs_per_step"}, differ
        assert t.config["grpo"]["steps"] == 10 and t.config["grpo"]["epochs_per_step"] == 2
        assert t.config["model"] == base["model"]
    assert find_sweep("demo-losses") == ROOT / "configs" / "sweeps" / "demo_losses.yaml"
    path = ROOT / "configs" / "sweeps" / "demo_distill.yaml"
    distill = load_sweep(path)
    assert [(t.config["grpo"].get("distill_weight", 1.0), t.config["seed"]) for t in distill.trials] == [
        (w, s) for w in (0.0, 1.0, 0.5) for s in (0, 1, 2)]
    assert {t.config["grpo"]["distill_teacher"] for t in distill.trials} == {"run:demo-teacher"}
    assert not any(t.config["grpo"]["dynamic_sampling"] for t in distill.trials)
    given = parse_sweep(with_overrides(yaml.safe_load(path.read_text()), {"grpo.distill_teacher": "run:0a1b2c3d"}),
                        str(path), path.parent)
    assert {t.config["grpo"]["distill_teacher"] for t in given.trials} == {"run:0a1b2c3d"}
    with pytest.raises(ConfigError, match=r"demo_distill.yaml: .*distill_teacher"):
        parse_sweep(with_overrides(yaml.safe_load(path.read_text()), {"grpo.distill_teacher": "run:"}),
                    str(path), path.parent)


def test_grid_variants_and_seeds_multiply(tmp_path):
    sw = parse_sweep({"name": "x", "base": {}, "grid": {"grpo.lr": [1e-5, 2e-5]},
                      "variants": [{"grpo.beta": 0.0}, {"grpo.beta": 0.1, "grpo.kl_estimator": "k1"}],
                      "seeds": [0, 1, 2], "seed_keys": ["seed", "sampling.seed"]}, "inline")
    assert len(sw.trials) == 2 * 2 * 3
    t = sw.trials[-1]
    assert t.config["grpo"]["lr"] == 2e-5 and t.config["grpo"]["beta"] == 0.1 and t.config["grpo"]["kl_estimator"] == "k1"
    assert t.config["seed"] == 2 and t.config["sampling"]["seed"] == 2
    assert t.cell == {"grpo.lr": 2e-5, "grpo.beta": 0.1, "grpo.kl_estimator": "k1"}
    assert sw.swept_keys == ["grpo.lr", "grpo.beta", "grpo.kl_estimator"]
    # Trials of one cell differ only by seed; ids are unique.
    assert len({x.trial_id for x in sw.trials}) == len(sw.trials)
    assert sw.sweep_hash == parse_sweep({"name": "x", "base": {}, "grid": {"grpo.lr": [1e-5, 2e-5]},
                                         "variants": [{"grpo.beta": 0.0}, {"grpo.beta": 0.1, "grpo.kl_estimator": "k1"}],
                                         "seeds": [0, 1, 2], "seed_keys": ["seed", "sampling.seed"]}, "inline").sweep_hash


@pytest.mark.parametrize("data, expected", [
    ({"name": "x", "base": {}, "grid": {"grpo.learning_rate": [1]}}, "grid.grpo.learning_rate: not a field of the experiment config"),
    ({"name": "x", "base": {}, "grid": {"grpo.lr": [-1.0]}}, "grid: grpo.lr: Input should be greater than 0"),
    ({"name": "x", "base": {}, "variants": [{"grpo.advantage": "ppo"}]}, "variants[0]: grpo.advantage"),
    ({"name": "x", "base": {}, "grid": {"grpo.lr": []}}, "grid: grpo.lr: needs at least one value"),
    ({"name": "x", "base": {}, "seeds": [1, 1]}, "seeds: repeated seeds [1, 1]"),
    ({"name": "x", "base": {}, "metric": "bleu"}, "metric: unknown metric 'bleu'"),
    ({"name": "x", "base": {}, "gird": {}}, "gird: unknown key"),
    ({"name": "x", "base": "nope.yaml"}, "base: no such experiment file"),
])
def test_bad_sweeps_name_the_file_and_field(tmp_path, data, expected):
    p = write(tmp_path, data)
    with pytest.raises(ConfigError) as e:
        load_sweep(p)
    assert str(p) in str(e.value) and expected in str(e.value), str(e.value)


def test_base_file_relative_to_the_sweep(tmp_path):
    (tmp_path / "exp.yaml").write_text("name: mine\ngrpo:\n  steps: 7\n")
    sw = load_sweep(write(tmp_path, {"name": "rel", "base": "exp.yaml", "grid": {"grpo.lr": [1e-5]}}))
    assert sw.trials[0].config["name"] == "mine" and sw.trials[0].config["grpo"]["steps"] == 7
    with pytest.raises(ConfigError, match="no such file"):
        load_sweep(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="no sweep file of that name") as e:
        find_sweep("demo-rl")
    assert e.value.problems[0][1].endswith("known: demo-distill, demo-losses, demo-lr, sampling-ablations, tools-on-off"), e.value.problems  # the docs' names
    assert find_sweep("demo-lr").name == "demo_lr.yaml"


def test_tools_sweep_is_the_tool_demo_with_and_without_its_calculator():
    """A sweep axis over the environment: the same shared stages (data, base model), one cell per environment."""
    sw = load_sweep(ROOT / "configs" / "sweeps" / "tools_on_off.yaml")
    assert sw.swept_keys == ["environment.name"] and len(sw.trials) == 6
    assert [(t.config["environment"]["name"], t.config["seed"]) for t in sw.trials] == [
        (name, s) for name in ("single_turn", "tools") for s in (0, 1, 2)]
    base = load_config(ROOT / "configs" / "examples" / "tool-demo.yaml").resolved()
    for t in sw.trials:
        for section in ("data", "model", "prompt", "sampling"):
            assert t.config[section] == base[section], section
        assert load_config_from(t.config).environment.multi_turn == (t.config["environment"]["name"] == "tools")
    assert find_sweep("tools-on-off") == ROOT / "configs" / "sweeps" / "tools_on_off.yaml"


def load_config_from(resolved: dict):
    from rlvr_core.experiment.config import parse_config

    return parse_config(resolved, "trial")


def test_the_pivot_names_a_swept_field_left_out_at_its_default():
    # The ppo_clip trials of demo-losses carry no grpo.policy_loss param (the resolved config leaves it out at its
    # default, so earlier runs keep their keys); the warehouse query reads the missing value as '∅', the pivot
    # shows the default instead. A key that is no field stays '∅'; a value that is there stays as it is.
    from rlvr_core.pipeline.sweeps import _at_default

    assert _at_default("grpo.policy_loss", "∅") == "ppo_clip"
    assert _at_default("grpo.distill_weight", "∅") == "1.0"
    assert _at_default("grpo.guards.teacher_kl_max", "∅") == "10.0"
    assert _at_default("grpo.no_such_field", "∅") == "∅"
    assert _at_default("grpo.policy_loss", "gspo") == "gspo"
