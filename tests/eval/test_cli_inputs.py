"""`rlvr eval` on inputs that are not a model: one line naming the folder, exit 2, no traceback; an
`s3://bucket/key` checkpoint keeps its `//` (it used to go through pathlib and become `s3:/bucket/key`) and
is downloaded from a real S3 API (moto_server) and evaluated."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest


def cli(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PREFECT_", "RLVR_"))}
    base.update({"RLVR_HOME": str(home), "OMP_NUM_THREADS": "1", **(env or {})})
    return subprocess.run([sys.executable, "-m", "rlvr_cli.eval", "eval", *args], env=base,
                          capture_output=True, text=True, timeout=600)


def _one_line_error(proc: subprocess.CompletedProcess, text: str) -> None:
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [text], proc.stderr[-2000:]


def test_a_folder_without_weights_is_one_line_naming_it(tmp_path):
    folder = tmp_path / "checkpoints" / "final"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "export_manifest.json").write_text("{}")
    _one_line_error(cli(tmp_path, str(folder), "-b", "synthetic"),
                    f"{folder}: no model weights (*.safetensors or pytorch_model*.bin): not a model folder, or an "
                    "export that did not finish")
    _one_line_error(cli(tmp_path, str(tmp_path / "nope"), "-b", "synthetic"), f"{tmp_path / 'nope'}: no such folder")


def test_s3_paths_keep_their_scheme(tmp_path, s3_env):
    endpoint, bucket = s3_env
    s3 = boto3.client("s3", endpoint_url=endpoint)
    s3.put_object(Bucket=bucket, Key="artifacts/exp/run-1/checkpoints/final/config.json", Body=b"{}")
    env = {"RLVR_S3_ENDPOINT_URL": endpoint, **{k: os.environ[k] for k in
                                                ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}}
    uri = f"s3://{bucket}/artifacts/exp/run-1/checkpoints/final"
    proc = cli(tmp_path, uri, "-b", "synthetic", env=env)
    _one_line_error(proc, f"{uri}: no model weights (*.safetensors or pytorch_model*.bin): not a model folder, or an "
                          "export that did not finish")
    missing = f"s3://{bucket}/artifacts/exp/no-such-run/checkpoints/final"
    _one_line_error(cli(tmp_path, missing, "-b", "synthetic", env=env), f"{missing}: no such folder in the bucket")
    assert "s3:/" + bucket not in proc.stderr


@pytest.mark.slow
def test_an_s3_checkpoint_is_downloaded_and_evaluated(tiny_checkpoints, tmp_path, s3_env):
    endpoint, bucket = s3_env
    weak, _ = tiny_checkpoints
    s3 = boto3.client("s3", endpoint_url=endpoint)
    for f in Path(weak).rglob("*"):
        if f.is_file():
            s3.upload_file(str(f), bucket, f"ckpt/weak/{f.relative_to(weak).as_posix()}")
    env = {"RLVR_S3_ENDPOINT_URL": endpoint, **{k: os.environ[k] for k in
                                                ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}}
    proc = cli(tmp_path, f"s3://{bucket}/ckpt/weak", "-b", "synthetic", "--max-problems", "4", "--n", "2", "--quiet",
               "--json", "--verifier-workers", "0", "--out", str(tmp_path / "out"), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["checkpoint"] == f"s3://{bucket}/ckpt/weak" and summary["benchmarks"]["synthetic"]["n"] == 4
    local = tmp_path / "cache" / "eval-checkpoints" / bucket / "ckpt" / "weak"
    assert sorted(p.name for p in local.iterdir()) == sorted(p.name for p in Path(weak).iterdir())
