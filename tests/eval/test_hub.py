"""Models and benchmark data by hub id, with no network: a Hugging Face cache laid out here as huggingface_hub
lays it out (blobs named by content, snapshots/<commit>/ symlinks, refs/main), holding a tiny model and a
small data set, read with HF_HUB_OFFLINE=1 through `rlvr eval`, `rlvr pull`, `rlvr config validate` and the
pipeline's model stage."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from rlvr_core.core.manifest import file_sha256, rows_sha256
from rlvr_core.data.jsonl import write_jsonl
from rlvr_core.data.loaders import load_problems
from rlvr_core.data.synthetic import SyntheticSpec, make_synthetic_dataset
from rlvr_core.eval.metrics import EVAL_FILE

MODEL_COMMIT = "1" * 8 + "a" * 32
DATA_COMMIT = "2" * 8 + "b" * 32


def _hub_repo(cache: Path, kind: str, repo: str, commit: str, files: dict[str, Path]) -> Path:
    """`<cache>/<kind>s--org--name/` as huggingface_hub writes it: blobs/<sha256>, snapshots/<commit>/<name> ->
    ../../blobs/<sha256> (relative symlinks), refs/main holding the commit."""
    root = cache / f"{kind}s--{repo.replace('/', '--')}"
    (root / "blobs").mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)
    snap = root / "snapshots" / commit
    for name, src in files.items():
        sha = file_sha256(src)
        (root / "blobs" / sha).write_bytes(src.read_bytes())
        link = snap / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(root / "blobs" / sha, link.parent))
    return snap


def _bench(path: Path, repo: str, rows_hash: str) -> Path:
    spec = {"name": path.stem, "version": 1, "description": "arithmetic word problems read from a hub data set",
            "data": {"source": "gsm8k", "split": "test",
                     "hub": {"repo": repo, "revision": DATA_COMMIT, "files": {"test": "main/test-*.parquet",
                                                                             "train": "main/train-*.parquet"}},
                     "rows_sha256": {"test": rows_hash}},
            "prompt": {"template": "qa", "model_kind": "base"},
            "generation": {"temperature": 0.0, "max_new_tokens": 48, "n": 1, "seed": 0},
            "verifier": {"name": "gsm8k", "mode": "flexible"}, "metrics": ["accuracy"]}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


MATH_COMMIT = "3" * 8 + "c" * 32


def _math_repo(cache: Path, tmp: Path) -> None:
    """EleutherAI/hendrycks_math's layout in small: one folder per subject, a train and a test parquet each."""
    files = {}
    for subject in ("geometry", "algebra"):
        for split in ("train", "test"):
            rows = [{"problem": f"{subject} {split} {i}: what is {i}+1?", "level": f"Level {i + 1}",
                     "type": subject.title(), "solution": f"{i}+1=\\boxed{{{i + 1}}}"} for i in range(2)]
            local = tmp / "math" / subject / f"{split}.parquet"
            local.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.Table.from_pylist(rows), local)
            files[f"{subject}/{split}-00000-of-00001.parquet"] = local
    _hub_repo(cache, "dataset", "EleutherAI/hendrycks_math", MATH_COMMIT, files)


@pytest.fixture(scope="module")
def hub_env(tiny_checkpoints, tmp_path_factory):
    """HF_HOME with org/tiny (the weaker tiny checkpoint) and org/arith (12 synthetic problems in GSM8K's
    fields, as parquet), offline, an empty data root; plus the benchmark files that name org/arith."""
    tmp = tmp_path_factory.mktemp("hub")
    weak = Path(tiny_checkpoints[0])
    cache = tmp / "hf" / "hub"
    _hub_repo(cache, "model", "org/tiny", MODEL_COMMIT, {p.name: p for p in weak.iterdir() if p.is_file()})
    splits = make_synthetic_dataset(SyntheticSpec(n_train=20, n_test=12, seed=3))
    rows = [{"question": r["question"], "answer": r["answer"]} for r in splits["test"]]
    pq.write_table(pa.Table.from_pylist(rows), tmp / "test.parquet")
    train = [{"question": r["question"], "answer": r["answer"]} for r in splits["train"]]
    for i in (0, 1):  # two shards, read in name order as one split
        pq.write_table(pa.Table.from_pylist(train[10 * i:10 * i + 10]), tmp / f"train{i}.parquet")
    _hub_repo(cache, "dataset", "org/arith", DATA_COMMIT, {"main/test-00000-of-00001.parquet": tmp / "test.parquet",
                                                            "main/train-00000-of-00002.parquet": tmp / "train0.parquet",
                                                            "main/train-00001-of-00002.parquet": tmp / "train1.parquet"})
    write_jsonl(train, tmp / "local" / "train.jsonl")
    _math_repo(cache, tmp)
    # The expected hash comes from the same rows read the other way: a local jsonl file through the loader.
    write_jsonl(rows, tmp / "local" / "test.jsonl")
    rows_hash = rows_sha256(load_problems("gsm8k", tmp / "local" / "test.jsonl"))
    (tmp / "empty").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PREFECT_", "RLVR_", "HF_"))}
    env.update({"HF_HOME": str(tmp / "hf"), "HF_HUB_OFFLINE": "1", "RLVR_DATA_DIR": str(tmp / "empty"),
                "RLVR_HOME": str(tmp / "home"), "OMP_NUM_THREADS": "1"})
    return {"tmp": tmp, "env": env, "weak": weak, "rows_hash": rows_hash,
            "bench": _bench(tmp / "arith.yaml", "org/arith", rows_hash),
            "parquet": tmp / "test.parquet"}


def rlvr(env: dict, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    """Run `rlvr ARGS`; returns the process and the CPU seconds it used (load-independent, unlike wall time)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-m", "rlvr_cli.main", *args], env=env, capture_output=True, text=True,
                          timeout=600, cwd=Path(__file__).resolve().parents[2])
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return proc, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def test_eval_by_hub_id_offline_records_commits(hub_env):
    from rlvr_core.sampling.models import model_hashes

    out = hub_env["tmp"] / "out"
    proc, _ = rlvr(hub_env["env"], "eval", f"org/tiny@{MODEL_COMMIT}", "--benchmark", str(hub_env["bench"]),
                   "--out", str(out), "--quiet", "--json", "--verifier-workers", "0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["model_commit"] == MODEL_COMMIT and summary["eval_id"] == f"tiny-{MODEL_COMMIT[:8]}"
    b = summary["benchmarks"]["arith"]
    assert b["n"] == 12 and 0 <= b["accuracy_greedy"] <= 1
    weights = hub_env["weak"] / "model.safetensors"
    assert b["identity"]["model_hash"] == model_hashes(hub_env["weak"])[0]  # the same weights as the original
    assert b["identity"]["hub"]["commit"] == MODEL_COMMIT
    assert b["identity"]["hub"]["files"]["model.safetensors"] == file_sha256(weights)
    src = b["data_source"]
    assert (src["kind"], src["repo"], src["commit"]) == ("hub", "org/arith", DATA_COMMIT)
    assert src["files"] == {"main/test-00000-of-00001.parquet": file_sha256(hub_env["parquet"])}
    written = json.loads((out / EVAL_FILE).read_text())["benchmarks"]["arith"]  # what the result folder keeps
    assert written["summary"]["identity"]["hub"]["commit"] == MODEL_COMMIT
    assert written["summary"]["data_source"]["commit"] == DATA_COMMIT


def test_default_branch_resolves_to_its_commit(hub_env, monkeypatch):
    from rlvr_core.core import hub

    for k in ("HF_HOME", "HF_HUB_OFFLINE"):
        monkeypatch.setenv(k, hub_env["env"][k])
    for ref in ("org/tiny", "org/tiny@main"):
        repo, rev = hub.split_ref(ref)
        snap = hub.snapshot(repo, revision=rev)
        assert snap.commit == MODEL_COMMIT and snap.requested == rev and (snap.folder / "config.json").is_file()


def _one_line_failure(proc: subprocess.CompletedProcess, cpu_s: float, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    for n in needles:
        assert n in proc.stderr, proc.stderr
    assert cpu_s < 2.0, f"took {cpu_s:.2f} s of CPU to fail"


def test_missing_model_fails_fast_naming_pull(hub_env):
    ref = f"org/absent@{MODEL_COMMIT}"
    proc, cpu = rlvr(hub_env["env"], "eval", ref, "--benchmark", str(hub_env["bench"]))
    _one_line_failure(proc, cpu, f"rlvr pull model {ref}", "HF_HUB_OFFLINE")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_missing_dataset_fails_fast_naming_pull(hub_env):
    bench = _bench(hub_env["tmp"] / "nodata.yaml", "org/absent-data", hub_env["rows_hash"])
    proc, cpu = rlvr(hub_env["env"], "eval", f"org/tiny@{MODEL_COMMIT}", "--benchmark", str(bench))
    _one_line_failure(proc, cpu, f"rlvr pull benchmark {bench}`", f"{bench}: data.path")
    assert proc.stderr.strip().splitlines()[0] == "invalid config" and len(proc.stderr.strip().splitlines()) == 2


def test_rows_hash_mismatch_fails_before_the_model_loads(hub_env):
    bench = _bench(hub_env["tmp"] / "changed.yaml", "org/arith", "0" * 64)
    proc, cpu = rlvr(hub_env["env"], "eval", f"org/tiny@{MODEL_COMMIT}", "--benchmark", str(bench))
    _one_line_failure(proc, cpu, f"{bench}: data.rows_sha256", "expects 0000000000000000",
                      f"hash to {hub_env['rows_hash'][:16]}")


def test_pull_prints_commits_and_hashes_from_the_cache(hub_env):
    proc, _ = rlvr(hub_env["env"], "pull", "model", "org/tiny")
    assert proc.returncode == 0, proc.stderr
    weights = file_sha256(hub_env["weak"] / "model.safetensors")
    assert f"-> commit {MODEL_COMMIT}" in proc.stdout and f"{weights}  model.safetensors" in proc.stdout
    assert f"model.revision: {MODEL_COMMIT}" in proc.stdout  # asked for the branch: says what to pin
    proc, _ = rlvr(hub_env["env"], "pull", "benchmark", str(hub_env["bench"]))
    assert proc.returncode == 0, proc.stderr
    assert (f"org/arith commit {DATA_COMMIT}, 12 rows, rows sha256 {hub_env['rows_hash']} (matches the benchmark "
            "file)") in proc.stdout
    # Offline, `rlvr pull` says where to run it, not to run `rlvr pull`; a model ref may be a missing local folder.
    proc, _ = rlvr(hub_env["env"], "pull", "model", "org/absent")
    cache = Path(hub_env["env"]["HF_HOME"]) / "hub"
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == (
        f"model org/absent is not in the Hugging Face cache ({cache}) and HF_HUB_OFFLINE is set: run this `rlvr pull` "
        "where there is network, with the same HF_HOME (or copy that cache folder here); or, for a local folder: "
        "there is no folder org/absent"), proc.stderr
    # Without HF_HUB_OFFLINE and without a hub to reach (nothing listens at the endpoint): one clear line.
    no_net = {k: v for k, v in hub_env["env"].items() if k != "HF_HUB_OFFLINE"}
    no_net.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HUB_ETAG_TIMEOUT="2", HF_HUB_DOWNLOAD_TIMEOUT="2")
    proc, _ = rlvr(no_net, "pull", "model", "org/absent")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == (
        f"model org/absent is not in the Hugging Face cache ({cache}) and could not be downloaded (no connection to "
        "http://127.0.0.1:9): run this `rlvr pull` where there is network, with the same HF_HOME (or copy that "
        "cache folder here); or, for a local folder: there is no folder org/absent"), proc.stderr
    proc, _ = rlvr(no_net, "eval", "org/absent", "--benchmark", str(hub_env["bench"]))
    assert "could not be downloaded (no connection to http://127.0.0.1:9): run `rlvr pull model org/absent` " \
           "where there is network, with the same HF_HOME" in proc.stderr, proc.stderr[-2000:]


def _config(tmp: Path, name: str, model_path: str) -> Path:
    cfg = {"name": name, "model": {"source": "hf", "path": model_path, "kind": "base"},
           "data": {"source": "gsm8k", "train_path": str(tmp / "local" / "test.jsonl"),
                    "test_path": str(tmp / "local" / "test.jsonl")}}
    (tmp / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
    return tmp / f"{name}.yaml"


def test_config_with_hub_model_validates_offline_only_when_cached(hub_env):
    tmp = hub_env["tmp"]
    proc, _ = rlvr(hub_env["env"], "config", "validate", str(_config(tmp, "cached", f"org/tiny@{MODEL_COMMIT}")))
    assert proc.returncode == 0 and "valid" in proc.stdout, proc.stderr
    proc, cpu = rlvr(hub_env["env"], "config", "validate", str(_config(tmp, "absent", "org/absent")))
    _one_line_failure(proc, cpu, "model.path", "rlvr pull model org/absent")


def test_model_stage_records_the_commit_in_the_manifest(hub_env, monkeypatch):
    from rlvr_core.experiment.config import parse_config
    from rlvr_core.pipeline import stages

    for k in ("HF_HOME", "HF_HUB_OFFLINE"):
        monkeypatch.setenv(k, hub_env["env"][k])
    cfg = parse_config(yaml.safe_load(_config(hub_env["tmp"], "stage", "org/tiny").read_text())
                       | {"name": "stage"})
    cfg = parse_config({**cfg.resolved(), "model": {**cfg.resolved()["model"], "revision": "main"}})
    model = stages.prepare_base_model(cfg, data=None)
    assert Path(model.path).name == MODEL_COMMIT and model.model_id == f"org/tiny@{MODEL_COMMIT}"
    data = stages.DataArtifact("", "", "tr", "te", 0, 0, True)
    man = stages.experiment_manifest(cfg, data, model, config_hash="h", resolved_config={}, template_key="qa@1",
                                     extra={})
    hub_rec = man["model"]["hub"]
    assert (hub_rec["repo"], hub_rec["revision"], hub_rec["commit"]) == ("org/tiny", "main", MODEL_COMMIT)
    assert hub_rec["files"]["model.safetensors"] == file_sha256(hub_env["weak"] / "model.safetensors")


def test_experiment_data_from_a_benchmark_on_the_hub(hub_env, monkeypatch, tmp_path):
    """`data.benchmark`: the data stage reads the benchmark's train split (two parquet shards) and its test split
    from the hub cache, the same rows as the local jsonl copies; the held-out spec reads the same place."""
    from rlvr_core.experiment.benchmarks import check_experiment_data
    from rlvr_core.experiment.config import ConfigError, parse_config
    from rlvr_core.pipeline import stages

    for k in ("HF_HOME", "HF_HUB_OFFLINE", "RLVR_DATA_DIR"):
        monkeypatch.setenv(k, hub_env["env"][k])
    monkeypatch.setenv("RLVR_HOME", str(tmp_path / "home"))
    cfg = parse_config({"data": {"source": "gsm8k", "benchmark": str(hub_env["bench"])}})
    check_experiment_data(str(hub_env["bench"]), "gsm8k", "cfg.yaml")
    data = stages.prepare_data(cfg)
    local = hub_env["tmp"] / "local"
    assert data.train_rows() == load_problems("gsm8k", local / "train.jsonl")
    assert data.test_rows() == load_problems("gsm8k", local / "test.jsonl")
    assert (data.n_train, data.n_test) == (20, 12)
    spec = stages.held_out_spec(cfg)
    assert spec.data.hub is not None and spec.data.hub.repo == "org/arith" and spec.data.split == "test"
    with pytest.raises(ConfigError, match="data.benchmark: benchmark .* reads 'gsm8k' data but data.source is 'svamp'"):
        check_experiment_data(str(hub_env["bench"]), "svamp", "cfg.yaml")


@pytest.mark.shared_data
def test_recipe_validates():
    """The shipped GSM8K recipe validates (its data from the data root; its model fetched at run time)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLVR_HOME", "HF_HUB_OFFLINE"))}
    proc, _ = rlvr(env, "config", "validate", "configs/examples/qwen2.5-0.5b-gsm8k.yaml")
    assert proc.returncode == 0 and "valid" in proc.stdout, proc.stderr


def test_math_recipe_reads_hendrycks_math_from_the_hub_cache(hub_env, monkeypatch):
    """The MATH recipe's data file (unpinned) resolves to the cached commit; rows come in subject (file-name)
    order with the last \\boxed{} as answer; the recipe validates with its data only in the hub cache."""
    from rlvr_core.experiment import benchmarks as B

    env = {k: v for k, v in hub_env["env"].items() if k != "HF_HUB_OFFLINE"}  # the cache answers first
    for k in ("HF_HOME", "RLVR_DATA_DIR"):
        monkeypatch.setenv(k, env[k])
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    spec = B.load_benchmark("configs/examples/data/hendrycks_math.yaml")
    train = B.split_problems(spec, "train")
    assert [p["question"][:18] for p in train] == ["algebra train 0: w", "algebra train 1: w",
                                                   "geometry train 0: ", "geometry train 1: "]
    assert [p["answer"] for p in train] == ["1", "2", "1", "2"]
    assert train[2]["id"] == "hendrycks_math/train/2" and train[2]["meta"]["subject"] == "Geometry"
    assert B.data_source_record(spec)["commit"] == MATH_COMMIT
    proc, _ = rlvr(env, "config", "validate", "configs/examples/qwen2.5-math-1.5b-math.yaml")
    assert proc.returncode == 0 and "valid" in proc.stdout, proc.stderr
