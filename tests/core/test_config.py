from pathlib import Path

import pytest
import yaml

from rlvr_core.experiment.config import (ConfigError, ExperimentConfig, GRPOConfig, check_files, config_hash,
                                         demo_config, load_config, parse_config)

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path, text: str) -> Path:
    p = tmp_path / "exp.yaml"
    p.write_text(text)
    return p


def test_every_shipped_config_validates():
    files = sorted((ROOT / "configs").glob("*.yaml")) + sorted((ROOT / "configs" / "examples").glob("*.yaml"))
    assert files, "configs/ holds no experiment files"
    for f in files:
        load_config(f)


def test_demo_yaml_is_the_builtin_demo():
    # `rlvr demo` without --config and `rlvr demo -c configs/demo.yaml` must be the same experiment.
    assert load_config(ROOT / "configs" / "demo.yaml").config_hash() == demo_config().config_hash()


def test_unknown_key_names_file_and_field_path(tmp_path):
    p = write(tmp_path, "grpo:\n  lr: 1e-5\n  lerning_rate: 3\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert e.value.problems == [("grpo.lerning_rate", "unknown key")]
    assert str(p) in str(e.value) and "grpo.lerning_rate" in str(e.value)


def test_wrong_type_reports_value(tmp_path):
    p = write(tmp_path, "sampling:\n  max_new_tokens: many\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    (path, why), = e.value.problems
    assert path == "sampling.max_new_tokens" and "'many'" in why


def test_all_problems_reported_at_once(tmp_path):
    p = write(tmp_path, "eval:\n  n_samples: 0\nmodel:\n  dtype: float8\nbogus: 1\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert {path for path, _ in e.value.problems} == {"eval.n_samples", "model.dtype", "bogus"}


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "absent.yaml")
    with pytest.raises(ConfigError, match="line 2"):
        load_config(write(tmp_path, "a: [1,\n"))
    with pytest.raises(ConfigError, match="mapping"):
        load_config(write(tmp_path, "- 1\n- 2\n"))


def test_cross_field_rules():
    with pytest.raises(ConfigError, match="n_samples=4"):
        parse_config({"passk": {"n_samples": 4, "ks": [1, 8]}})
    with pytest.raises(ConfigError, match="template"):
        parse_config({"prompt": {"template": "no-such-template"}})
    with pytest.raises(ConfigError, match="needs test_path"):
        parse_config({"data": {"source": "gsm8k", "train_path": "train.jsonl"}})
    with pytest.raises(ConfigError, match="needs path"):
        parse_config({"model": {"source": "hf"}})


def test_hash_is_stable_across_key_order_and_sensitive_to_values(tmp_path):
    a = load_config(write(tmp_path, "seed: 3\ngrpo:\n  lr: 0.001\n  beta: 0.01\n"))
    b = parse_config({"grpo": {"beta": 0.01, "lr": 0.001}, "seed": 3})
    c = parse_config({"grpo": {"beta": 0.01, "lr": 0.002}, "seed": 3})
    assert a.config_hash() == b.config_hash() != c.config_hash()
    # Defaults written out explicitly resolve to the same config.
    assert demo_config().config_hash() == parse_config(demo_config().resolved()).config_hash()
    assert parse_config({}).config_hash() == parse_config(ExperimentConfig().resolved()).config_hash()
    # Independent reference: sha256 of canonical JSON.
    import hashlib
    import json

    canon = json.dumps(a.resolved(), sort_keys=True, separators=(",", ":"))
    assert a.config_hash() == hashlib.sha256(canon.encode()).hexdigest() == config_hash(a.resolved())


def test_overrides(tmp_path):
    p = write(tmp_path, "eval:\n  max_problems: 10\n")
    cfg = load_config(p, {"eval.max_problems": 20, "grpo.lr": 0.5})
    assert cfg.eval.max_problems == 20 and cfg.grpo.lr == 0.5
    with pytest.raises(ConfigError, match="eval.bogus"):
        load_config(p, {"eval.bogus": 1})


def test_resolved_round_trips_through_yaml():
    cfg = ExperimentConfig()
    again = parse_config(yaml.safe_load(yaml.safe_dump(cfg.resolved())))
    assert again == cfg


def test_files_named_by_the_config_must_exist(tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text("")
    cfg = parse_config({"data": {"source": "gsm8k", "train_path": str(train), "test_path": str(tmp_path / "nope.jsonl")},
                        "model": {"source": "hf", "path": str(tmp_path)}})
    with pytest.raises(ConfigError) as e:
        check_files(cfg, "exp.yaml")
    assert [p for p, _ in e.value.problems] == ["data.test_path", "model.path"]
    assert "exp.yaml: data.test_path: no such file" in str(e.value)
    check_files(parse_config({}))  # the synthetic demo names no files


def test_reward_section_follows_eval_unless_set_and_refuses_in_process_hangs():
    from rlvr_core.experiment.config import ConfigError, parse_config

    cfg = parse_config({"eval": {"verifier": "gsm8k", "verifier_mode": "strict"}})
    assert (cfg.reward.verifier, cfg.reward.mode, cfg.reward.workers) == ("gsm8k", "strict", 0)  # cannot hang
    cfg = parse_config({"eval": {"verifier": "gsm8k", "verifier_mode": "strict"}, "reward": {"verifier": "math"}})
    assert (cfg.reward.verifier, cfg.reward.mode, cfg.reward.workers) == ("math", None, 2)  # eval's mode is gsm8k's
    assert cfg.eval.verifier_workers == 0
    assert parse_config({"eval": {"verifier": "ifeval"}}).eval.verifier_workers == 2
    for bad, where in (({"reward": {"verifier": "math", "workers": 0}}, "reward"),
                       ({"eval": {"verifier": "code", "verifier_workers": 0}}, "eval"),
                       ({"reward": {"verifier": "nope"}}, "reward.verifier")):
        with pytest.raises(ConfigError) as e:
            parse_config(bad, "exp.yaml")
        assert f"exp.yaml: {where}" in str(e.value), str(e.value)


def test_algorithm_names_are_checked_against_their_registries(tmp_path):
    """grpo.advantage, grpo.kl_estimator and grpo.loss_agg accept exactly the names their registries hold; a bad
    one fails naming the file, the field and the registered names."""
    from rlvr_core.core.registry import ADVANTAGES, KL_ESTIMATORS, LOSS_AGGS

    for field, registry in (("advantage", ADVANTAGES), ("kl_estimator", KL_ESTIMATORS), ("loss_agg", LOSS_AGGS)):
        for name in registry.names():
            assert getattr(parse_config({"grpo": {field: name}}).grpo, field) == name
        with pytest.raises(ConfigError) as e:
            load_config(write(tmp_path, f"grpo:\n  {field}: nope\n"))
        assert e.value.problems == [(f"grpo.{field}", f"unknown {registry.kind} 'nope'; known: "
                                     + ", ".join(registry.names()))]
        assert f"exp.yaml: grpo.{field}: unknown {registry.kind} 'nope'" in str(e.value)


def test_the_policy_loss_is_chosen_in_yaml_and_checked_against_its_registry(tmp_path):
    """grpo.policy_loss: ppo_clip by default (the loss the update always used), every registered name accepted,
    an unknown one refused naming the file, the field and the registered names."""
    from rlvr_core.core.registry import POLICY_LOSSES

    assert parse_config({}).grpo.policy_loss == "ppo_clip"
    for name in POLICY_LOSSES.names():  # luspo is gspo summed over tokens: it needs its own aggregation
        agg = "  loss_agg: seq-mean-token-sum\n" if name == "luspo" else ""
        assert load_config(write(tmp_path, f"grpo:\n  policy_loss: {name}\n{agg}")).grpo.policy_loss == name
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, "grpo:\n  policy_loss: nope\n"))
    assert e.value.problems == [("grpo.policy_loss", "unknown policy loss 'nope'; known: "
                                 + ", ".join(POLICY_LOSSES.names()))]
    assert "exp.yaml: grpo.policy_loss: unknown policy loss 'nope'" in str(e.value)


def test_the_default_policy_loss_leaves_the_resolved_config_and_its_hash_as_before(monkeypatch):
    """A run that keeps ppo_clip dumps (resolved config, config hash, training key) exactly as before the field
    existed; one that names another loss dumps it, and the dump validates back to the same config."""
    from rlvr_core.core.registry import POLICY_LOSSES

    default = parse_config({}).model_dump(mode="json")["grpo"]
    hidden = set(GRPOConfig._ADDED_LATER)  # policy_loss and every field added with the new losses
    assert "policy_loss" in hidden and "policy_loss" not in default
    assert set(default) == set(GRPOConfig.model_fields) - hidden
    assert GRPOConfig.model_validate(default).policy_loss == "ppo_clip"
    monkeypatch.setattr(POLICY_LOSSES, "_items", dict(POLICY_LOSSES._items))
    POLICY_LOSSES.add("other", lambda *a, **k: None)
    other = parse_config({"grpo": {"policy_loss": "other"}})
    dumped = other.model_dump(mode="json")["grpo"]
    assert dumped == {**default, "policy_loss": "other"}
    assert GRPOConfig.model_validate(dumped) == other.grpo
    assert config_hash(other.model_dump(mode="json")) != config_hash(parse_config({}).model_dump(mode="json"))


def test_a_name_registered_at_runtime_is_accepted_by_the_config(monkeypatch):
    from rlvr_core.core.registry import ADVANTAGES

    monkeypatch.setattr(ADVANTAGES, "_items", dict(ADVANTAGES._items))  # the registration ends with this test
    with pytest.raises(ConfigError, match="unknown advantage estimator 'centred'"):
        parse_config({"grpo": {"advantage": "centred"}})

    @ADVANTAGES.register("centred")
    def centred(rewards, group_size=None, *, group_ids=None, eps=0.0):
        return rewards - rewards.mean(dim=-1, keepdim=True)

    assert parse_config({"grpo": {"advantage": "centred"}}).grpo.advantage == "centred"
    assert ADVANTAGES.get("centred") is centred


def test_validating_a_config_imports_no_torch():
    """`rlvr config validate` stays fast: the registries the config checks names against are torch-free."""
    import subprocess
    import sys

    code = ("import sys; from rlvr_core.experiment.config import parse_config; "
            "parse_config({'grpo': {'enabled': True, 'advantage': 'rloo', 'kl_estimator': 'k1', "
            "'loss_agg': 'seq-mean-token-mean'}}); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_every_config_field_has_help_text():
    from pydantic import BaseModel

    from rlvr_core.experiment.config import ExperimentConfig

    missing = []

    def walk(model, prefix=""):
        for name, f in model.model_fields.items():
            if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel):
                walk(f.annotation, prefix + name + ".")
            elif not (f.description or "").strip():
                missing.append(prefix + name)

    walk(ExperimentConfig)
    assert missing == []


def test_mlflow_run_names_are_decided_in_one_place():
    from rlvr_core.artifacts.layout import mlflow_run_name

    assert mlflow_run_name("demo", name="demo") == mlflow_run_name("pipeline", name="demo") == "demo"
    assert mlflow_run_name("sweep", sweep_id="lr-3f2a") == "lr-3f2a"
    assert mlflow_run_name("trial", sweep_id="lr-3f2a", trial_id="t01", trial_label="lr=5e-05 seed=1") == "lr=5e-05 seed=1"
    assert mlflow_run_name("trial", sweep_id="lr-3f2a", trial_id="t01") == "lr-3f2a/t01"
    assert mlflow_run_name("eval", checkpoint="exp/run-1/checkpoints/final") == "eval exp/run-1/checkpoints/final"
    with pytest.raises(ValueError, match="unknown run kind"):
        mlflow_run_name("nope", name="x")


def test_template_kind_must_match_model_kind(tmp_path):
    """G-chat-template: a chat template on a base model is a config error naming the file and the field."""
    p = write(tmp_path, "model:\n  kind: base\nprompt:\n  template: chat_qa\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    (path, why), = e.value.problems
    assert path == "prompt.template" and "chat models" in why and "model.kind is 'base'" in why
    assert str(p) in str(e.value) and "G-chat-template" in str(e.value)
    with pytest.raises(ConfigError, match="prompt.template: template 'qa' is for base models"):
        parse_config({"model": {"kind": "chat"}})
    # Kinds that agree, or a mismatch declared deliberate, validate.
    assert parse_config({"model": {"kind": "chat"}, "prompt": {"template": "chat_qa"}}).prompt.template == "chat_qa"
    ok = parse_config({"model": {"kind": "chat"}, "prompt": {"allow_kind_mismatch": True}})
    assert ok.prompt.allow_kind_mismatch and ok.model.kind == "chat"
    assert ExperimentConfig().prompt.allow_kind_mismatch is False


def test_the_opt_out_does_not_allow_a_chat_template_on_a_base_model(tmp_path):
    """G-chat-template: `prompt.allow_kind_mismatch` allows a raw template on a chat model; a chat template on a
    base model has no chat template to render through, so it stays a config error (naming file and field) instead
    of a renderer's ValueError once the run has started."""
    p = write(tmp_path, "model:\n  kind: base\nprompt:\n  template: chat_qa\n  allow_kind_mismatch: true\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    (path, why), = e.value.problems
    assert path == "prompt.template" and "cannot allow it" in why and "G-chat-template" in why
    assert str(p) in str(e.value)


def test_push_backend_accepts_file_gloo_nccl_ipc_and_the_older_rlvr_file():
    def backend(name):
        return parse_config({"sampling": {"engine": "vllm-server", "servers": ["http://a:1"],
                                          "push": {"type": name}}}).sampling.server_options()["push"]["type"]

    assert [backend(b) for b in ("file", "gloo", "nccl", "ipc", "rlvr_file")] == ["file", "gloo", "nccl", "ipc", "file"]


def test_the_flat_push_keys_are_read_into_sampling_push_with_a_deprecation():
    import warnings

    from rlvr_core.experiment.grpo_config import ConfigDeprecation

    def sampling(**keys):
        return parse_config({"sampling": {"engine": "vllm-server", "servers": ["http://a:1"], **keys}},
                            "flat.yaml").sampling

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        old = sampling(server_push_backend="gloo", server_workers=2, server_push_timeout_s=30,
                       server_push_folder="/shared/push")  # a folder means nothing to gloo: dropped, as it was ignored
    assert old.push == sampling(push={"type": "gloo", "workers": 2, "timeout_s": 30}).push
    assert sorted(f"{w.filename}:{w.lineno}: {w.message}" for w in said if w.category is ConfigDeprecation) == [
        "flat.yaml:0: sampling.server_push_backend is now sampling.push.type",
        "flat.yaml:0: sampling.server_push_folder is now sampling.push.folder",
        "flat.yaml:0: sampling.server_push_timeout_s is now sampling.push.timeout_s",
        "flat.yaml:0: sampling.server_workers is now sampling.push.workers"]
    assert sampling(server_push_backend="rlvr_file", push={"folder": "/f"}).push.model_dump() == {
        "type": "file", "folder": "/f", "timeout_s": 120.0}
    with pytest.raises(ConfigError, match="sampling.server_push_timeout_s and sampling.push.timeout_s are both set"):
        sampling(server_push_timeout_s=30, push={"timeout_s": 40})
    # --set on a resolved config (push.timeout_s, push.folder: null already there): the flat key by its new path
    from rlvr_core.experiment.config import apply_overrides

    resolved = demo_config().model_dump(mode="json")
    for overrides, push in [({"sampling.server_push_backend": "gloo"}, {"type": "gloo", "workers": 1, "timeout_s": 120.0}),
                            ({"sampling.server_push_timeout_s": 9}, {"type": "file", "folder": None, "timeout_s": 9.0})]:
        with_server = {"sampling.engine": "vllm-server", "sampling.servers": ["http://a:1"], **overrides}
        assert parse_config(apply_overrides(resolved, with_server)).sampling.push.model_dump() == push


def test_vllm_server_settings_are_checked_before_any_work(tmp_path):
    ok = parse_config({"sampling": {"engine": "vllm-server", "servers": ["http://127.0.0.1:8000"],
                                    "push": {"timeout_s": 30}}})
    assert ok.sampling.server_options() == {"servers": ["http://127.0.0.1:8000"], "request_timeout_s": 300.0,
                                            "push": {"type": "file", "timeout_s": 30.0}}
    launched = parse_config({"sampling": {"engine": "vllm-server", "server_launch": {"count": 2}}})
    assert launched.sampling.server_options()["launch"] == {"count": 2, "start_timeout_s": 600.0, "threads": 1}
    for bad, where in [({"engine": "vllm-server"}, "exactly one of servers"),
                       ({"engine": "vllm-server", "servers": ["http://a:1"], "server_launch": {}}, "exactly one"),
                       ({"engine": "vllm", "servers": ["http://a:1"]}, "not vllm-server"),
                       ({"engine": "vllm-server", "servers": ["127.0.0.1:8000"]}, "http://host:port"),
                       ({"engine": "vllm-server", "servers": ["http://a:1", "http://a:1"]}, "listed twice"),
                       ({"engine": "vllm-server", "server_launch": {"count": 0}}, "greater than or equal to 1"),
                       ({"engine": "vllm-server", "servers": ["http://a:1"], "push": {"timeout_s": 0}},
                        "push.timeout_s: .*greater than 0"),
                       ({"engine": "vllm-server", "servers": ["http://a:1"], "push": {"type": "tcp"}},
                        "sampling.push: .*'file', 'gloo', 'nccl' or 'ipc'"),
                       ({"engine": "vllm-server", "servers": ["http://a:1"], "push": {"type": "gloo", "folder": "/f"}},
                        "sampling.push.folder: unknown key")]:
        p = write(tmp_path, yaml.safe_dump({"sampling": bad}))
        with pytest.raises(ConfigError, match=where) as e:
            load_config(p)
        assert str(p) in str(e.value) and "sampling" in str(e.value)
