"""GRPO config sections (`grpo.memory`, `grpo.launch`, `grpo.guards`) and the training folder's key (`grpo_key_dump`).

The key is decided by declaration next to the config: each section says whether it is in the key (`IN_KEY`),
every other top-level field is declared with `InKey`. A field declared neither way fails here, and the key of a
run trained before the sections existed is unchanged (its folder, and so its checkpoints, are found again).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from pydantic import Field

from rlvr_core.experiment.config import ConfigError, GRPOConfig, config_hash, load_config, parse_config
from rlvr_core.experiment.grpo_config import (ConfigDeprecation, grpo_key_dump, grpo_unkeyed_dump,
                                              undeclared_key_fields)
from rlvr_core.pipeline.sweeps import parse_sweep

ROOT = Path(__file__).resolve().parents[2]

# A config away from the defaults in the key's fields and in both out-of-key sections.
MEMORY = {"micro_batch_size": 4, "max_tokens_per_micro_batch": 64, "logprob_chunk_size": 0, "pack_sequences": True,
          "gradient_checkpointing": True}
LAUNCH = {"mode": "torchrun", "nnodes": 2, "nproc_per_node": 2, "rdzv_endpoint": "10.0.0.5:29500",
          "node_command": "ssh {host}", "hosts": ["b"]}
GUARDS = {"kl_spike_max": 5.0, "ratio_guard_tol": 0.1, "drift_every": 0,
          "health": {"collapse": {"grad_norm_factor": 8}}}
KEYED = {"enabled": True, "steps": 7, "lr": 1e-4, "beta": 0.1, "kl_estimator": "k2", "clip_low": 0.1,
         "advantage": "rloo", "eval_every": 3, "lora_rank": 4, "lora_target_modules": ["q_proj"], "guards": GUARDS}

# Written out by hand: the key the training stage computed for KEYED before the sections existed (the flat
# GRPOConfig dumped without GRPO_MEMORY_FIELDS and GRPO_LAUNCH_FIELDS), and its hash.
BEFORE_SECTIONS = {
    "adam_eps": 1e-08, "adaptive_k_failure": 2, "adaptive_k_success": 2, "adaptive_max_samples": 64,
    "adaptive_sampling": False, "advantage": "rloo", "beta": 0.1, "checkpoint_every": 25, "clip_high": 0.28,
    "clip_low": 0.1, "cos_min_ratio": 0.1, "dlogp_reweight_c": 0.0, "drift_every": 0, "dynamic_sampling": False,
    "dynamic_sampling_max_rounds": 4, "enabled": True, "epochs_per_step": 1, "eval_every": 3,
    "eval_max_problems": 500, "eval_samples": 0, "grad_clip": 1.0, "group_size": 8,
    "health": {"collapse": {"grad_norm_factor": 8}}, "kl_estimator": "k2", "kl_spike_max": 5.0,
    "logprob_guard_tol": None, "logprob_temperature": 1.0, "lora_alpha": 16.0, "lora_rank": 4,
    "lora_target_modules": ["q_proj"], "loss_agg": "token-mean", "lr": 0.0001, "max_staleness": 0,
    "negative_advantage_weight": 1.0, "overlong_buffer_len": 0, "overlong_penalty_factor": 1.0, "precision": "fp32",
    "prompts_per_step": 16, "ratio_guard_tol": 0.1, "rollout_batch_size": 128, "rollout_samples_per_step": 4,
    "steps": 7, "temperature": 1.0, "tis_cap": None, "top_p": 1.0, "warmup_steps": 5, "weight_decay": 0.0,
    "zero3_sampling_replica": False, "zero_stage": 2, "zero_var_guard_share": 0.9, "zero_var_guard_window": 5,
}
BEFORE_SECTIONS_HASH = "6cb9aa27ea5af6007f0e6ecbfc82a7614a8c8bfe16ef2ccc45615c658e0fbe17"
# The defaults' key; changed once on purpose since the sections: grpo.guards.kl_spike_max 10 -> 1000 (calibrated on
# healthy runs, docs/guards_training.md), so runs at the defaults train into new folders once, with the same numbers.
DEFAULT_HASH = "b3eeda003a21c259aed54c6ee9ad63adeba1ef165e60cba41eb62da999ccca01"
# What the training folder records instead of keying (the names numerics.json has always used).
UNKEYED = {"micro_batch_size", "max_tokens_per_micro_batch", "logprob_chunk_size", "gradient_checkpointing",
           "pack_sequences", "launch", "nnodes", "nproc_per_node", "rdzv_endpoint", "node_command", "hosts",
           "hostfile", "include", "exclude"}


def test_the_training_key_is_the_one_runs_had_before_the_sections():
    grpo = parse_config({"grpo": {**KEYED, "memory": MEMORY, "launch": LAUNCH}}).grpo
    assert grpo_key_dump(grpo) == BEFORE_SECTIONS
    assert config_hash(grpo_key_dump(grpo)) == BEFORE_SECTIONS_HASH
    assert config_hash(grpo_key_dump(GRPOConfig())) == DEFAULT_HASH
    # The sections declared out of the key change nothing in it, and are what the folder records.
    assert grpo_key_dump(parse_config({"grpo": KEYED}).grpo) == BEFORE_SECTIONS
    assert grpo_unkeyed_dump(grpo) == {**MEMORY, **{k: v for k, v in LAUNCH.items() if k != "mode"},
                                       "launch": "torchrun", "hostfile": "", "include": "", "exclude": ""}


def test_every_grpo_field_is_in_the_key_or_in_a_section_declared_out_of_it():
    assert undeclared_key_fields() == []
    grpo = GRPOConfig()
    keyed, unkeyed = set(grpo_key_dump(grpo)), set(grpo_unkeyed_dump(grpo))
    assert unkeyed == UNKEYED and not keyed & unkeyed
    sections = GRPOConfig.sections()
    leaves = {n for n in GRPOConfig.model_fields if n not in sections}
    leaves |= {sec.FLAT.get(f, f) for sec in sections.values() for f in sec.model_fields}
    # a field added after runs were keyed joins the key only away from its default (the earlier runs' behaviour)
    late = set(GRPOConfig._ADDED_LATER) | {f for sec in sections.values() for f in sec._ADDED_LATER}
    assert keyed | unkeyed | late == leaves and not keyed & late
    assert grpo_key_dump(GRPOConfig.model_construct(policy_loss="another"))["policy_loss"] == "another"
    assert grpo_key_dump(parse_config({"grpo": {"guards": {"correction_mask_share": 0.3}}}).grpo)[
        "correction_mask_share"] == 0.3
    assert {n for n, sec in sections.items() if not sec.IN_KEY} == {"memory", "launch"}
    assert sections["guards"].IN_KEY  # in the key, flat, as before the sections


def test_a_top_level_field_without_a_key_declaration_fails():
    class WithANewKnob(GRPOConfig):
        new_memory_knob: int = Field(1, description="a setting whose author forgot to declare it")

    assert undeclared_key_fields(WithANewKnob) == ["new_memory_knob"]
    with pytest.raises(TypeError, match=r"\['new_memory_knob'\] declare neither InKey nor a section"):
        grpo_key_dump(WithANewKnob())


def test_pre_section_keys_still_work_with_one_line_naming_the_new_place(tmp_path):
    flat = {**{k: v for k, v in KEYED.items() if k != "guards"}, **GUARDS, **MEMORY,
            **{k: v for k, v in LAUNCH.items() if k != "mode"}, "launch": "torchrun"}
    with pytest.warns(ConfigDeprecation) as said:
        old = parse_config({"grpo": flat}, "exp.yaml").grpo
    lines = {str(w.message) for w in said}
    assert {(w.filename, w.lineno) for w in said} == {("exp.yaml", 0)}  # shown as `exp.yaml:0: ConfigDeprecation: …`
    assert "grpo.micro_batch_size is now grpo.memory.micro_batch_size" in lines
    assert "grpo.launch is now grpo.launch.mode" in lines and "grpo.nnodes is now grpo.launch.nnodes" in lines
    assert "grpo.kl_spike_max is now grpo.guards.kl_spike_max" in lines
    assert all("\n" not in line for line in lines)
    assert old == parse_config({"grpo": {**KEYED, "memory": MEMORY, "launch": LAUNCH}}).grpo
    # --set and sweep keys by their old names too.
    with pytest.warns(ConfigDeprecation, match="grpo.micro_batch_size is now grpo.memory.micro_batch_size"):
        cfg = load_config(ROOT / "configs" / "demo.yaml", {"grpo.micro_batch_size": 2, "grpo.launch": "torchrun"})
    assert (cfg.grpo.memory.micro_batch_size, cfg.grpo.launch.mode) == (2, "torchrun")
    with pytest.warns(ConfigDeprecation):
        sw = parse_sweep({"name": "x", "base": {}, "grid": {"grpo.gradient_checkpointing": [False, True]}})
    assert [t.config["grpo"]["memory"]["gradient_checkpointing"] for t in sw.trials] == [False, True]


def test_a_setting_given_at_both_places_is_an_error_naming_it():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # refused before any deprecation line
        with pytest.raises(ConfigError, match=r"exp.yaml: grpo: grpo.micro_batch_size and "
                                              r"grpo.memory.micro_batch_size are both set"):
            parse_config({"grpo": {"micro_batch_size": 4, "memory": {"micro_batch_size": 2}}}, "exp.yaml")
        with pytest.raises(ConfigError, match=r"grpo.nnodes and grpo.launch.nnodes are both set"):
            parse_config({"grpo": {"nnodes": 2, "launch": {"nnodes": 2}}}, "exp.yaml")


def test_guard_thresholds_are_typed_settings_checked_at_load():
    """`grpo.guards.health` is one typed section per detector: a bad value fails when the config loads, naming the
    file and the field; the detectors read every setting, while the resolved config and the training key hold the
    settings given, as written (an int stays an int: the hash of `8` is not the hash of `8.0`)."""
    for bad, why in (({"collapse": {"window": 0}}, "collapse.window: Input should be greater than or equal to 1"),
                     ({"kl_explosion": {"serious": "yes"}}, "kl_explosion.serious: Input should be a valid boolean"),
                     ({"entropy": {"abs_floor": True}}, "entropy.abs_floor: expected float, got True"),
                     ({"no_signal": {"starved_share": 1.5}}, "no_signal.starved_share: Input should be less than or "
                                                             "equal to 1"),
                     ({"reward_hacking": {"confirm_evals": 2.5}}, "reward_hacking.confirm_evals: Input should be a "
                                                                  "valid integer"),
                     ({"enabled": ["G-collapse", "G-nope"]}, "enabled: unknown guard id(s) ['G-nope']")):
        with pytest.raises(ConfigError) as e:
            parse_config({"grpo": {"guards": {"health": bad}}}, "exp.yaml")
        assert f"exp.yaml: grpo.guards.health.{why}" in str(e.value), str(e.value)
    given = {"collapse": {"grad_norm_factor": 8, "window": 5}, "enabled": ["G-collapse", "G-no-signal"]}
    cfg = parse_config({"grpo": {"guards": {"health": given}}})
    health = cfg.grpo.guards.health
    assert (health.collapse.grad_norm_factor, health.collapse.min_signals, health.kl_explosion.max_limit) == (8, 2, 1000)
    assert health.enabled == ("G-collapse", "G-no-signal")
    assert grpo_key_dump(cfg.grpo)["health"] == given == cfg.model_dump(mode="json")["grpo"]["guards"]["health"]
    assert config_hash(grpo_key_dump(cfg.grpo)) != config_hash(
        grpo_key_dump(parse_config({"grpo": {"guards": {"health": {**given, "collapse": {"grad_norm_factor": 8.0,
                                                                                          "window": 5}}}}}).grpo))
    assert grpo_key_dump(GRPOConfig())["health"] == {}


def test_the_training_key_declares_what_changes_the_weights_and_what_only_names_the_run():
    from rlvr_core.experiment.config import RewardConfig
    from rlvr_core.experiment.config_base import key_fields
    from rlvr_core.experiment.sampling_config import SamplingConfig
    from rlvr_core.pipeline.train_stage import _train_key

    assert key_fields(GRPOConfig, changes_weights=False) == ["enabled", "eval_every", "eval_max_problems",
                                                             "eval_samples", "checkpoint_every",
                                                             "rollout_samples_per_step"]
    assert key_fields(RewardConfig, changes_weights=True) == ["verifier", "mode", "timeout_s", "timeout_reward"]
    assert key_fields(RewardConfig, changes_weights=False) == ["max_timeout_share", "max_error_share"]
    assert key_fields(SamplingConfig) == ["engine", "max_new_tokens"]

    class Base:
        model_hash = "m"

    class Curriculum:
        curriculum_id = "c"

    # The reward and sampling parts of the key as the training stage picked them by hand before the declarations.
    for data in ({}, {"reward": {"verifier": "math", "mode": "boxed", "workers": 3, "timeout_s": 2.0},
                      "sampling": {"engine": "vllm", "max_new_tokens": 512, "temperature": 0.6, "batch_size": 8}}):
        cfg = parse_config(data)
        key = _train_key(cfg, Base, Curriculum)
        assert key["reward"] == cfg.reward.model_dump(mode="json", exclude={"workers"})
        assert (key["max_new_tokens"], key["engine"]) == (cfg.sampling.max_new_tokens, cfg.sampling.engine)
        assert set(key) == {"stage", "base", "curriculum", "grpo", "template", "reward", "verifier_version",
                            "max_new_tokens", "seed", "engine"}
