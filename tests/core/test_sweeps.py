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
    assert e.value.problems[0][1].endswith("known: demo-lr, sampling-ablations"), e.value.problems  # the docs' names
    assert find_sweep("demo-lr").name == "demo_lr.yaml"
