"""Checkpoint export (rlvr_core.artifacts.export): real DeepSpeed ZeRO checkpoints in, Hugging Face safetensors out,
uploaded to a real S3 API (moto_server) and verified by checksum.

The checkpoints come from `train_grpo` itself: 2 steps of the tiny 2-layer width-32 model of
tests/grpo/grpo_helpers.py (same fixture code, repeated here: tests/grpo is not on this module's import
path, also when it runs as the two-rank worker script), with its parity test verifier so every step has a gradient. The reference for "the trained
weights" is `final_model`, which the trainer writes with its own `save_pretrained` of the live policy at
the same step as the last checkpoint: an export must reproduce it exactly in fp32 (weights, per-token
log-probs of real sequences, greedy outputs), and must differ from the untrained base model (so the
comparison can fail). One launch of 2 processes (`torch.distributed.run`) gives checkpoints partitioned
over 2 ranks under ZeRO-2 and ZeRO-3.

Run as a script, this file is the worker of that 2-process launch.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("DS_ACCELERATOR", "cpu")

from rlvr_core.artifacts.export import (MANIFEST_FILE, ExportError, ExportVerificationError, export_checkpoint,  # noqa: E402
                                        upload_export, verify_export, verify_local_export)
from rlvr_core.experiment.config import GRPOConfig, RewardConfig  # noqa: E402
from rlvr_core.verifiers.base import Outcome, Status, _REGISTRY, register_verifier  # noqa: E402

VERIFIER = "_test_parity"
TIMES: dict[str, float] = {}   # printed after the last test (`_report_times`, pytest -s) for the record


@pytest.fixture(scope="module", autouse=True)
def _report_times():
    """Not a check: after the module's last test, prints the timings its tests gathered in TIMES (visible
    with pytest -s; the CI log's slowest tests come from pytest's --durations)."""
    yield
    if TIMES:
        print("\nexport test numbers:", json.dumps(TIMES, indent=1))


class _Parity:
    name, version = VERIFIER, "1"
    can_hang = False  # a length check

    def warm_up(self) -> None:
        pass

    def verify(self, response: str, gold) -> Outcome:
        ok = len(response) % 2 == 0
        return Outcome(Status.CORRECT if ok else Status.INCORRECT, float(ok), str(len(response)), self.name,
                       self.version)


if VERIFIER not in _REGISTRY:
    register_verifier(VERIFIER)(_Parity)


def _rows():
    from rlvr_core.data.synthetic import SyntheticSpec, make_synthetic_dataset

    return make_synthetic_dataset(SyntheticSpec(n_train=200, n_test=10))["train"]


def _cfg(**kw) -> GRPOConfig:
    base = dict(steps=2, prompts_per_step=4, group_size=4, lr=1e-2, warmup_steps=0, temperature=0.8,
                zero_stage=2, checkpoint_every=1000)
    return GRPOConfig(**{**base, **kw})


def _train(model_dir, rows, out: Path, cfg: GRPOConfig):
    from rlvr_core.grpo.trainer import train_grpo

    return train_grpo(model_dir, rows, [r["id"] for r in rows[:12]], out, cfg, template_id="qa", reward=RewardConfig(verifier=VERIFIER),
                       max_new_tokens=12, seed=0)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """(model dir, rows): the 2-layer width-32 model after 30 supervised steps (grpo_helpers.build_tiny)."""
    from rlvr_core.tiny.warmstart import WarmStartSpec, warm_start

    torch.set_num_threads(1)
    rows = _rows()
    out = tmp_path_factory.mktemp("tiny-base")
    warm_start(rows, out, WarmStartSpec(steps=30, batch_size=16, hidden_size=32, num_layers=2, heads=2,
                                        vocab_size=300, warmup_steps=5))
    return out, rows


@pytest.fixture(scope="module")
def runs(base, tmp_path_factory):
    """Finished 2-step GRPO runs (single process): {name: out_dir}. ZeRO 0-3 in fp32, and ZeRO-2 trained in bf16.
    'z2' checkpoints every step, so it has tags step1 and step2."""
    torch.set_num_threads(1)
    model_dir, rows = base
    root = tmp_path_factory.mktemp("runs")
    specs = {"z0": dict(zero_stage=0), "z1": dict(zero_stage=1), "z2": dict(zero_stage=2, checkpoint_every=1),
             "z3": dict(zero_stage=3), "z2_bf16": dict(zero_stage=2, precision="bf16")}
    out = {}
    for name, kw in specs.items():
        t0 = time.perf_counter()
        res = _train(model_dir, rows, root / name, _cfg(**kw))
        TIMES[f"train_{name}_s"] = round(time.perf_counter() - t0, 2)
        assert res.summary["done"] and res.final_model_dir.is_dir()
        out[name] = root / name
    return out


# ----------------------------------------------------------------------------------------------- helpers
def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def _sequences(model_dir: Path, rows) -> list[list[int]]:
    """Real prompts of the training template, each followed by a greedy completion of the model at model_dir."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlvr_core.data.templates import get_template

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    t = get_template("qa")
    seqs = []
    with torch.no_grad():
        for r in rows[:6]:
            ids = tok(t.render(r["question"]), return_tensors="pt")["input_ids"]
            out = model.generate(ids, do_sample=False, max_new_tokens=12, pad_token_id=tok.pad_token_id)
            seqs.append(out[0].tolist())
    return seqs


def _logprobs(model_dir: Path, seqs: list[list[int]]) -> list[torch.Tensor]:
    """log p(token t | tokens < t) for every token after the first, one unpadded forward per sequence (fp32)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for s in seqs:
            ids = torch.tensor([s])
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
            out.append(logp.gather(-1, ids[0, 1:, None])[:, 0])
    return out


def _greedy(model_dir: Path, seqs: list[list[int]]) -> list[list[int]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        return [model.generate(torch.tensor([s[:12]]), do_sample=False, max_new_tokens=16,
                               pad_token_id=tok.pad_token_id)[0].tolist() for s in seqs]


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


# ------------------------------------------------------------------------------------------- round trip
@pytest.mark.parametrize("name", ["z2", "z3", "z1", "z0"])
def test_fp32_export_reproduces_the_trained_model_exactly(name, runs, base, tmp_path):
    torch.set_num_threads(1)
    model_dir, rows = base
    run = runs[name]
    t0 = time.perf_counter()
    res = export_checkpoint(run / "checkpoints", base_model_dir=model_dir, out_dir=tmp_path / "export",
                            dtype="float32", run_manifest={"run": name}, step=2)
    TIMES[f"export_{name}_s"] = round(time.perf_counter() - t0, 3)
    assert res.tag == "step2" and res.step == 2 and res.zero_stage == int(name[1])
    assert res.manifest["checkpoint"]["consolidation"].startswith(
        "deepspeed.utils.zero_to_fp32" if name != "z0" else "deepspeed module state dict")

    trained, exported, before = _weights(run / "final_model"), _weights(res.out_dir), _weights(model_dir)
    assert exported.keys() == trained.keys()
    assert all(v.dtype == torch.float32 for v in exported.values())
    assert [k for k in trained if not torch.equal(trained[k], exported[k])] == []
    # The comparison can fail: training moved every tensor away from the base model.
    assert [k for k in trained if torch.equal(before[k], exported[k])] == []

    seqs = _sequences(run / "final_model", rows)
    lp_trained, lp_export, lp_base = (_logprobs(d, seqs) for d in (run / "final_model", res.out_dir, model_dir))
    diff = _max_diff(lp_trained, lp_export)
    TIMES[f"max_logprob_diff_{name}"] = diff
    assert diff == 0.0, f"exported log-probs differ from the trained model's by {diff}"
    assert _max_diff(lp_trained, lp_base) > 1e-3  # the trained model is not the base model
    assert _greedy(res.out_dir, seqs) == _greedy(run / "final_model", seqs)

    # Tokenizer and generation config come along and load.
    from transformers import AutoTokenizer, GenerationConfig

    assert AutoTokenizer.from_pretrained(res.out_dir)("2 + 2")["input_ids"] == \
        AutoTokenizer.from_pretrained(model_dir)("2 + 2")["input_ids"]
    assert GenerationConfig.from_pretrained(res.out_dir).eos_token_id == \
        GenerationConfig.from_pretrained(model_dir).eos_token_id


def test_export_of_an_older_tag(runs, base, tmp_path):
    """Tag 'step1' (not the latest) exports the step-1 weights: different from step 2's, step 1 in the manifest."""
    model_dir, _ = base
    ckpt = runs["z2"] / "checkpoints"
    assert (ckpt / "latest").read_text().strip() == "step2" and (ckpt / "step1").is_dir()
    s1 = export_checkpoint(ckpt, "step1", base_model_dir=model_dir, out_dir=tmp_path / "s1", run_manifest=None)
    s2 = export_checkpoint(ckpt, None, base_model_dir=model_dir, out_dir=tmp_path / "s2", run_manifest=None)
    assert (s1.step, s1.tag, s2.step, s2.tag) == (1, "step1", 2, "step2")
    w1, w2 = _weights(s1.out_dir), _weights(s2.out_dir)
    assert all(not torch.equal(w1[k], w2[k]) for k in w1)
    assert s1.manifest["files"] != s2.manifest["files"]
    # The step must agree with the checkpoint's own record.
    with pytest.raises(ValueError, match="step=5 contradicts .*step1.* says step 1"):
        export_checkpoint(ckpt, "step1", base_model_dir=model_dir, out_dir=tmp_path / "bad", step=5)
    assert not (tmp_path / "bad").exists()


def test_sharded_export_round_trips(runs, base, tmp_path):
    """max_shard_size small enough for several safetensors shards + index: all listed, all read back, equal."""
    model_dir, _ = base
    run = runs["z3"]
    res = export_checkpoint(run / "checkpoints", base_model_dir=model_dir, out_dir=tmp_path / "e",
                            max_shard_size="40KB")
    shards = sorted(p.name for p in res.out_dir.glob("*.safetensors"))
    assert len(shards) > 1 and (res.out_dir / "model.safetensors.index.json").is_file()
    assert set(shards) | {"model.safetensors.index.json"} <= {f["path"] for f in res.files}
    trained, exported = _weights(run / "final_model"), _weights(res.out_dir)
    assert exported.keys() == trained.keys()
    assert [k for k in trained if not torch.equal(trained[k], exported[k])] == []
    from transformers import AutoModelForCausalLM

    reloaded = dict(AutoModelForCausalLM.from_pretrained(res.out_dir).named_parameters())
    assert all(torch.equal(reloaded[k], trained[k]) for k in trained)


# ---------------------------------------------------------------------------------------------- dtypes
def test_bf16_and_fp16_exports_are_the_fp32_weights_cast_once(runs, base, tmp_path):
    from safetensors import safe_open

    model_dir, _ = base
    ckpt = runs["z3"] / "checkpoints"
    fp32 = _weights(export_checkpoint(ckpt, base_model_dir=model_dir, out_dir=tmp_path / "f32").out_dir)
    for dtype, tdt in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        res = export_checkpoint(ckpt, base_model_dir=model_dir, out_dir=tmp_path / dtype, dtype=dtype)
        assert res.manifest["dtype"] == dtype
        with safe_open(res.out_dir / "model.safetensors", "pt") as f:   # dtype as stored on disk
            stored = {k: f.get_slice(k).get_dtype() for k in f.keys()}
        assert set(stored.values()) == {"BF16" if dtype == "bfloat16" else "F16"}
        half = _weights(res.out_dir)
        assert half.keys() == fp32.keys()
        assert [k for k in fp32 if not torch.equal(half[k], fp32[k].to(tdt))] == []
        assert json.loads((res.out_dir / "config.json").read_text())["dtype"] == dtype
        from transformers import AutoModelForCausalLM

        assert AutoModelForCausalLM.from_pretrained(res.out_dir).dtype == tdt


def test_bf16_trained_checkpoint_exports_fp32_master_weights(runs, base, tmp_path):
    """precision=bf16: the checkpoint's fp32 master weights are exported; cast to bf16 they are exactly the
    bf16 weights the policy ran with (final_model holds those, as fp32)."""
    model_dir, _ = base
    run = runs["z2_bf16"]
    master = export_checkpoint(run / "checkpoints", base_model_dir=model_dir, out_dir=tmp_path / "f32")
    bf16 = export_checkpoint(run / "checkpoints", base_model_dir=model_dir, out_dir=tmp_path / "bf16", dtype="bfloat16")
    assert master.manifest["checkpoint"]["training_precision"] == "bf16"
    assert master.manifest["checkpoint"]["source_dtypes"] == ["float32"]
    trained, wm, wb = _weights(run / "final_model"), _weights(master.out_dir), _weights(bf16.out_dir)
    assert [k for k in trained if not torch.equal(wb[k], trained[k].to(torch.bfloat16))] == []
    # The master weights carry more precision than the bf16 policy (so they are not the same tensors).
    gap = max(float((wm[k] - trained[k]).abs().max()) for k in trained)
    TIMES["bf16_master_vs_bf16_policy_max_abs"] = gap
    assert 0 < gap < 1e-2


# --------------------------------------------------------------------------------------------- manifest
def test_manifest_lists_every_file_with_size_and_sha256(runs, base, tmp_path):
    from rlvr_core.core.manifest import build_manifest

    model_dir, _ = base
    run_manifest = build_manifest(config_hash="abc", resolved_config={"grpo": {"steps": 2}}, datasets={"train": "d0"},
                                  seeds={"train": 0}, model={"id": str(model_dir)}, template="qa@1")
    res = export_checkpoint(runs["z2"] / "checkpoints", base_model_dir=model_dir, out_dir=tmp_path / "e",
                            dtype="bfloat16", run_manifest=run_manifest)
    on_disk = {}
    for dirpath, _, names in os.walk(res.out_dir):
        for n in names:
            p = Path(dirpath) / n
            if n != MANIFEST_FILE:
                on_disk[p.relative_to(res.out_dir).as_posix()] = (os.path.getsize(p), _sha256(p))
    m = json.loads((res.out_dir / MANIFEST_FILE).read_text())
    assert {f["path"]: (f["size"], f["sha256"]) for f in m["files"]} == on_disk
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json"} <= set(on_disk)
    assert not [p for p in on_disk if p.endswith(".bin")]
    assert (m["step"], m["tag"], m["dtype"], m["zero_stage"]) == (2, "step2", "bfloat16", 2)
    assert m["run_manifest"] == json.loads(json.dumps(run_manifest))
    assert m["checkpoint"]["dp_world_size"] == 1 and m["checkpoint"]["ds_version"]
    assert m["model"]["class"] == "Qwen2ForCausalLM" and m["model"]["n_parameters"] > 0
    assert m == res.manifest
    # Nothing left behind next to the export (it is built under a temporary name and renamed).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e"]


# ------------------------------------------------------------------------------------- upload and verify
def test_upload_to_s3_verifies_and_a_corrupted_byte_fails_loudly(runs, base, tmp_path, s3_env):
    import boto3

    from rlvr_core.artifacts.storage import open_store

    endpoint, bucket = s3_env
    model_dir, _ = base
    res = export_checkpoint(runs["z3"] / "checkpoints", base_model_dir=model_dir, out_dir=tmp_path / "e")
    store = open_store(f"s3://{bucket}/team", endpoint_url=endpoint)
    t0 = time.perf_counter()
    keys = upload_export(res.out_dir, store, "exp1/step2")
    TIMES["upload_and_verify_s3_s"] = round(time.perf_counter() - t0, 3)
    listed = sorted(f["path"] for f in res.files)
    assert keys == [f"exp1/step2/{p}" for p in listed] + [f"exp1/step2/{MANIFEST_FILE}"]
    assert store.list("exp1/step2") == sorted(keys)
    assert verify_export(store, "exp1/step2") == res.manifest

    # The bytes really are in the bucket: read them back with boto3 directly.
    s3 = boto3.client("s3", endpoint_url=endpoint)
    key = "team/exp1/step2/model.safetensors"
    data = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    assert data == (res.out_dir / "model.safetensors").read_bytes()

    # Corrupt one byte of one uploaded object (in the middle of the tensor data).
    bad = bytearray(data)
    bad[len(bad) // 2] ^= 0x01
    s3.put_object(Bucket=bucket, Key=key, Body=bytes(bad))
    with pytest.raises(ExportVerificationError) as e:
        verify_export(store, "exp1/step2")
    msg = str(e.value)
    good_sha, bad_sha = hashlib.sha256(data).hexdigest(), hashlib.sha256(bytes(bad)).hexdigest()
    assert "model.safetensors" in msg and good_sha in msg and bad_sha in msg and "checksum mismatch" in msg
    assert [p["path"] for p in e.value.problems] == ["model.safetensors"]
    assert e.value.problems[0]["expected_sha256"] == good_sha and e.value.problems[0]["actual_sha256"] == bad_sha

    # Repaired, then a missing file and a stray file are named too.
    s3.put_object(Bucket=bucket, Key=key, Body=data)
    verify_export(store, "exp1/step2")
    s3.delete_object(Bucket=bucket, Key="team/exp1/step2/tokenizer.json")
    s3.put_object(Bucket=bucket, Key="team/exp1/step2/model-00002-of-00002.safetensors", Body=b"old shard")
    with pytest.raises(ExportVerificationError) as e:
        verify_export(store, "exp1/step2")
    assert {p["path"]: p["problem"] for p in e.value.problems} == {
        "tokenizer.json": "missing", "model-00002-of-00002.safetensors": "not listed in the manifest"}
    # A manifest that is not the one recorded elsewhere (e.g. on the MLflow run) is refused.
    with pytest.raises(ExportVerificationError, match="export_manifest.json: checksum mismatch"):
        verify_export(store, "exp1/step2", expected_manifest_sha256="0" * 64)


def test_upload_to_a_local_store_and_local_corruption_is_caught_before_upload(runs, base, tmp_path):
    from rlvr_core.artifacts.storage import LocalStore

    model_dir, _ = base
    res = export_checkpoint(runs["z2"] / "checkpoints", base_model_dir=model_dir, out_dir=tmp_path / "e")
    store = LocalStore(tmp_path / "store")
    upload_export(res.out_dir, store, "runs/a")
    assert verify_export(store, "runs/a")["step"] == 2
    target = tmp_path / "store" / "runs" / "a" / "config.json"
    target.write_bytes(target.read_bytes().replace(b"qwen2", b"qwen3"))
    with pytest.raises(ExportVerificationError, match=r"config.json: checksum mismatch"):
        verify_export(store, "runs/a")

    # A file damaged on local disk after export: refused before anything is uploaded.
    f = res.out_dir / "tokenizer_config.json"
    f.write_text(f.read_text() + " ")
    with pytest.raises(ExportVerificationError, match="tokenizer_config.json: checksum mismatch"):
        upload_export(res.out_dir, store, "runs/b")
    assert store.list("runs/b") == []


def test_verify_without_an_export_names_the_missing_manifest(tmp_path):
    from rlvr_core.artifacts.storage import LocalStore

    with pytest.raises(ExportVerificationError, match="export_manifest.json: missing"):
        verify_export(LocalStore(tmp_path / "s"), "nothing/here")


# ------------------------------------------------------------------------------------------------ errors
def test_missing_checkpoint_dir_and_unknown_tag_name_the_path(runs, base, tmp_path):
    model_dir, _ = base
    missing = tmp_path / "no-such-run" / "checkpoints"
    with pytest.raises(FileNotFoundError, match=f"checkpoint directory {missing} does not exist"):
        export_checkpoint(missing, base_model_dir=model_dir, out_dir=tmp_path / "e")
    ckpt = runs["z2"] / "checkpoints"
    with pytest.raises(FileNotFoundError) as e:
        export_checkpoint(ckpt, "step7", base_model_dir=model_dir, out_dir=tmp_path / "e")
    assert str(ckpt / "step7") in str(e.value) and "'step1', 'step2'" in str(e.value)
    empty = tmp_path / "empty-ckpts"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=f"no 'latest' file at {empty / 'latest'}"):
        export_checkpoint(empty, base_model_dir=model_dir, out_dir=tmp_path / "e")
    (empty / "step3").mkdir()
    with pytest.raises(FileNotFoundError, match="no DeepSpeed '\\*model_states.pt' file"):
        export_checkpoint(empty, "step3", base_model_dir=model_dir, out_dir=tmp_path / "e")
    with pytest.raises(ValueError, match="dtype 'int8' not supported"):
        export_checkpoint(ckpt, base_model_dir=model_dir, out_dir=tmp_path / "e", dtype="int8")
    assert not (tmp_path / "e").exists()


def test_existing_export_dir_is_not_overwritten_silently(runs, base, tmp_path):
    model_dir, _ = base
    ckpt = runs["z2"] / "checkpoints"
    export_checkpoint(ckpt, base_model_dir=model_dir, out_dir=tmp_path / "e", dtype="bfloat16")
    with pytest.raises(FileExistsError, match="already exists"):
        export_checkpoint(ckpt, base_model_dir=model_dir, out_dir=tmp_path / "e")
    res = export_checkpoint(ckpt, base_model_dir=model_dir, out_dir=tmp_path / "e", overwrite=True)
    assert res.manifest["dtype"] == "float32"
    assert json.loads((tmp_path / "e" / MANIFEST_FILE).read_text())["dtype"] == "float32"


@pytest.mark.parametrize("layers, missing, unexpected", [
    (3, "model.layers.2.", None),       # the base config has a layer the checkpoint lacks
    (1, None, "model.layers.1."),       # the checkpoint has a layer the base config lacks
])
def test_keys_that_do_not_match_the_base_config_fail_naming_them(runs, base, tmp_path, layers, missing, unexpected):
    model_dir, _ = base
    other = tmp_path / "other-base"
    shutil.copytree(model_dir, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["num_hidden_layers"] = layers
    cfg["layer_types"] = ["full_attention"] * layers
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ExportError) as e:
        export_checkpoint(runs["z3"] / "checkpoints", base_model_dir=other, out_dir=tmp_path / "e")
    msg = str(e.value)
    if missing:
        assert f"missing ['{missing}" in msg and "unexpected none" in msg
    else:
        assert f"unexpected ['{unexpected}" in msg and "missing none" in msg
    assert not (tmp_path / "e").exists()


def test_shape_mismatch_fails_naming_the_tensor(runs, base, tmp_path):
    model_dir, _ = base
    other = tmp_path / "other-base"
    shutil.copytree(model_dir, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["intermediate_size"] = 64
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ExportError,
                       match=r"model.layers.0.mlp.gate_proj.weight: checkpoint \(128, 32\) vs model \(64, 32\)"):
        export_checkpoint(runs["z2"] / "checkpoints", base_model_dir=other, out_dir=tmp_path / "e")


def test_tied_weights_that_disagree_in_the_checkpoint_are_refused(runs, base):
    """The base config ties lm_head to the embeddings; a consolidated state whose two copies differ (an
    untied checkpoint) must not be loaded silently (one copy would overwrite the other)."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlvr_core.artifacts.export import _load_into_model

    model_dir, _ = base
    state = get_fp32_state_dict_from_zero_checkpoint(str(runs["z2"] / "checkpoints"))
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    assert _load_into_model(model, dict(state), "ok")[0] == 26  # lm_head is an alias of the embeddings: 26 tensors
    untied = dict(state)
    untied["lm_head.weight"] = state["lm_head.weight"] + 1e-3
    with pytest.raises(ExportError, match="'model.embed_tokens.weight' and 'lm_head.weight' differ but the model ties"):
        _load_into_model(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir)), untied, "untied")
    # Only the alias present is fine (the tie supplies it); nothing present is a missing key.
    alias_only = {k: v for k, v in state.items() if k != "model.embed_tokens.weight"}
    assert _load_into_model(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir)), alias_only,
                            "alias")[0] == 26
    none = {k: v for k, v in state.items() if k not in ("model.embed_tokens.weight", "lm_head.weight")}
    with pytest.raises(ExportError, match=r"missing \['lm_head.weight', 'model.embed_tokens.weight'\]"):
        _load_into_model(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir)), none, "none")


# ------------------------------------------------------------------------------- G-prompt-mismatch
def _benchmark_files(tmp_path: Path) -> dict[str, Path]:
    """The synthetic benchmark cut to 2 greedy problems of 4 tokens, as written (template qa, the training
    template) and with the Minerva template ("Problem: ... Solution:") instead."""
    import yaml

    from rlvr_core.experiment.benchmarks import load_benchmark

    out = {}
    for name, template in (("synthetic_qa", "qa"), ("synthetic_minerva", "minerva")):
        d = load_benchmark("synthetic").model_dump(mode="json")
        d.update(name=name, metrics=["accuracy"], side_by_side=[])
        d["prompt"]["template"] = template
        d["data"]["max_problems"] = 2
        d["generation"].update(temperature=0.0, n=1, greedy=False, max_new_tokens=4)
        out[name] = tmp_path / f"{name}.yaml"
        out[name].write_text(yaml.safe_dump(d))
    return out


def test_export_records_the_training_template_and_rlvr_eval_flags_a_mismatch(runs, base, tmp_path, rlvr_home):
    """The export carries the template the run trained with; `rlvr eval` of the export on a benchmark with another
    template flags it (settings, summary, warning line, comparison report), on the training template it does not,
    and a model we did not train (no export manifest) is never a mismatch."""
    import subprocess

    from rlvr_core.artifacts.export import train_template_of
    from rlvr_core.eval.compare import compare, load_eval, to_markdown
    from rlvr_core.eval.evaluate import evaluate
    from rlvr_core.experiment.benchmarks import load_benchmark

    model_dir, _ = base
    res = export_checkpoint(runs["z2"] / "checkpoints", base_model_dir=model_dir, out_dir=tmp_path / "export",
                            train_template="qa@1")
    assert res.manifest["train_template"] == "qa@1" == train_template_of(res.out_dir)
    verify_local_export(res.out_dir)
    assert train_template_of(model_dir) is None  # a base model folder has no training template
    # An export given only the pipeline's run manifest takes the template from it.
    alt = export_checkpoint(runs["z2"] / "checkpoints", base_model_dir=model_dir, out_dir=tmp_path / "export2",
                            run_manifest={"prompt_template": "minerva@1"})
    assert train_template_of(alt.out_dir) == "minerva@1"

    files = _benchmark_files(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "rlvr_cli.eval", "eval", str(res.out_dir), "--benchmark",
                           str(files["synthetic_qa"]), "--benchmark", str(files["synthetic_minerva"]), "--quiet",
                           "--verifier-workers", "0", "--out", str(tmp_path / "trained"), "--eval-id", "trained"],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "RLVR_HOME": str(rlvr_home)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    warned = [line for line in proc.stderr.splitlines() if "G-prompt-mismatch" in line]
    assert warned == ["warning: G-prompt-mismatch: synthetic_minerva prompts with minerva@1 but the checkpoint "
                      "was trained with qa@1; the score may understate what it learned"]
    record = json.loads((tmp_path / "trained" / "eval.json").read_text())["benchmarks"]
    for name, mismatch in (("synthetic_qa", False), ("synthetic_minerva", True)):
        for part in ("settings", "summary"):
            assert record[name][part]["train_template"] == "qa@1"
            assert record[name][part]["template_mismatch"] is mismatch, (name, part)

    # The base model on the same benchmark: no training template, no mismatch; the comparison with the trained
    # checkpoint is allowed (same evaluation settings) and stamped with the trained side's mismatch.
    spec = load_benchmark(str(files["synthetic_minerva"]))
    base_eval = evaluate(model_dir, [spec], out=tmp_path / "base", eval_id="base",
                         run=_eval_run()).benchmarks[0]
    assert (base_eval.settings["train_template"], base_eval.settings["template_mismatch"]) == (None, False)
    result = compare(load_eval(str(tmp_path / "base")), load_eval(str(tmp_path / "trained")),
                     benchmarks=["synthetic_minerva"])
    trained = result["b"]["label"]
    assert result["template_mismatch"] == {"synthetic_minerva": {trained: "qa@1"}}
    assert f"**G-prompt-mismatch** (synthetic_minerva): {trained} was trained with `qa@1`" in to_markdown(result)


def _eval_run():
    from rlvr_core.eval.evaluate import RunSettings

    return RunSettings(verifier_workers=0)


def test_pipeline_and_nightly_evaluation_flag_a_checkpoint_trained_on_another_template(runs, base, tmp_path,
                                                                                       rlvr_home):
    """`evaluate_stage` (the pipeline's held-out evaluation and the nightly flow's) compares the export's training
    template with the config's: flagged in the summary and the metric settings when they differ, not otherwise."""
    from rlvr_core.experiment.config import parse_config
    from rlvr_core.pipeline import stages
    from rlvr_core.sampling.models import model_hashes

    model_dir, _ = base
    res = export_checkpoint(runs["z2"] / "checkpoints", base_model_dir=model_dir, out_dir=tmp_path / "export",
                            train_template="qa@1")
    model = stages.ModelArtifact(str(res.out_dir), "export", *model_hashes(res.out_dir), True)
    out = {}
    for template in ("qa", "minerva"):
        cfg = parse_config({"prompt": {"template": template}, "data": {"synthetic": {"n_train": 20, "n_test": 2}},
                            "eval": {"temperature": 0.0, "max_new_tokens": 4, "verifier_workers": 0}})
        lines = []
        ev = stages.evaluate_stage(cfg, stages.prepare_data(cfg), model, eval_id=template,
                                   progress=lambda stage, msg, **kw: lines.append(msg))
        settings = {json.loads(s)["template_mismatch"] for s in ev.metrics.column("settings").to_pylist()}
        out[template] = (ev.summary["train_template"], ev.summary["template_mismatch"], settings,
                         [m for m in lines if "G-prompt-mismatch" in m])
    assert out["qa"] == ("qa@1", False, {False}, [])
    assert out["minerva"][:3] == ("qa@1", True, {True}) and len(out["minerva"][3]) == 1


# ------------------------------------------------------------------------------------ 2 ranks (ZeRO 2, 3)

def test_checkpoints_partitioned_over_two_ranks(base, tmp_path):
    """ZeRO-2 and ZeRO-3 checkpoints written by 2 processes (each rank saves its own partition) export to
    exactly the weights rank 0 saved as final_model."""
    model_dir, _ = base
    spec = {"model_dir": str(model_dir), "out": str(tmp_path / "ddp")}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    from twoproc import run_two_ranks  # here: the launched ranks run this file without tests/ on sys.path

    proc, t_launch = run_two_ranks(__file__, tmp_path / "spec.json")
    TIMES["two_rank_launch_s"] = round(t_launch, 1)
    assert proc.returncode == 0, proc.stdout[-4000:] + "\n" + proc.stderr[-8000:]
    for name, stage in (("z2", 2), ("z3", 3)):
        run = tmp_path / "ddp" / name
        optim = sorted(p.name for p in (run / "checkpoints" / "step2").glob("*optim_states.pt"))
        assert len(optim) == 2, optim  # one partition per rank
        res = export_checkpoint(run / "checkpoints", base_model_dir=model_dir, out_dir=tmp_path / f"e{name}")
        assert res.zero_stage == stage and res.manifest["checkpoint"]["dp_world_size"] == 2
        trained, exported, before = _weights(run / "final_model"), _weights(res.out_dir), _weights(model_dir)
        assert exported.keys() == trained.keys()
        assert [k for k in trained if not torch.equal(trained[k], exported[k])] == []
        assert [k for k in trained if torch.equal(before[k], exported[k])] == []  # it trained


def _worker(spec_path: str) -> None:
    from rlvr_core.grpo.distributed import shutdown

    torch.set_num_threads(1)
    spec = json.loads(Path(spec_path).read_text())
    rows = _rows()
    for name, stage in (("z2", 2), ("z3", 3)):
        _train(spec["model_dir"], rows, Path(spec["out"]) / name, _cfg(zero_stage=stage, lr=1e-3))
    shutdown()


if __name__ == "__main__":
    _worker(sys.argv[1])
