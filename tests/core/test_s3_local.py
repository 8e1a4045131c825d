"""The local stack's S3 (`rlvr_core.artifacts.s3_local`): a real server process driven by boto3; what a client was told
is written survives SIGKILL and a restart, what it deleted stays deleted, and a write that cannot be kept is
refused instead of pretended."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.s3


def _start(data: Path) -> tuple[subprocess.Popen, object]:
    import boto3

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "rlvr_core.artifacts.s3_local", "--port", str(port), "--data", str(data)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=1)
            break
        except OSError:
            assert proc.poll() is None, "s3_local exited at start-up"
            time.sleep(0.1)
    return proc, boto3.client("s3", endpoint_url=url, aws_access_key_id="k", aws_secret_access_key="s",
                              region_name="us-east-1")


def _listing(s3, bucket: str) -> dict[str, tuple[str, int]]:
    return {o["Key"]: (o["ETag"], o["Size"]) for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
            for o in page.get("Contents", [])}


def test_objects_survive_sigkill_and_restart(tmp_path):
    data = tmp_path / "s3"
    proc, s3 = _start(data)
    try:
        s3.create_bucket(Bucket="rlvr")
        s3.put_object(Bucket="rlvr", Key="a/b.txt", Body=b"hello", ContentType="text/plain", Metadata={"x": "1"})
        s3.put_object(Bucket="rlvr", Key="a", Body=b"a key that is also a folder of other keys")
        s3.put_object(Bucket="rlvr", Key="../escape", Body=b"not a usable path")
        big = tmp_path / "big.bin"
        big.write_bytes(os.urandom(9 * 1024 * 1024))  # over boto3's multipart threshold: an "-N" ETag
        s3.upload_file(str(big), "rlvr", "ckpt/model.safetensors")
        s3.copy_object(Bucket="rlvr", Key="copy.txt", CopySource={"Bucket": "rlvr", "Key": "a/b.txt"})
        for k in ("gone", "g1", "g2"):
            s3.put_object(Bucket="rlvr", Key=k, Body=b"x")
        s3.delete_object(Bucket="rlvr", Key="gone")
        s3.delete_objects(Bucket="rlvr", Delete={"Objects": [{"Key": "g1"}, {"Key": "g2"}]})
        s3.create_bucket(Bucket="dropped")
        s3.put_object(Bucket="dropped", Key="k", Body=b"x")
        s3.delete_object(Bucket="dropped", Key="k")
        s3.delete_bucket(Bucket="dropped")
        before = _listing(s3, "rlvr")
    finally:
        proc.kill()  # SIGKILL: no chance to save anything on the way out
        proc.wait()
    assert sorted(before) == ["../escape", "a", "a/b.txt", "ckpt/model.safetensors", "copy.txt"]
    assert any(etag.endswith('-2"') for etag, _ in before.values())  # the multipart upload
    assert (data / "rlvr" / "a" / "b.txt").read_bytes() == b"hello"  # browsable at the key's path
    proc, s3 = _start(data)
    try:
        assert _listing(s3, "rlvr") == before  # same keys, sizes and ETags
        assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == ["rlvr"]
        head = s3.head_object(Bucket="rlvr", Key="a/b.txt")
        assert head["ContentType"] == "text/plain" and head["Metadata"] == {"x": "1"}
        assert s3.get_object(Bucket="rlvr", Key="ckpt/model.safetensors")["Body"].read() == big.read_bytes()
        assert s3.get_object(Bucket="rlvr", Key="copy.txt")["Body"].read() == b"hello"
        assert s3.get_object(Bucket="rlvr", Key="../escape")["Body"].read() == b"not a usable path"
    finally:
        proc.kill()
        proc.wait()


def test_a_write_that_cannot_be_kept_is_refused(tmp_path):
    """Files where the store's folders must go (works as root too, unlike a read-only folder): the PUT gets a
    500 that says the object is not kept, instead of a 200 for an object a restart would lose."""
    from botocore.exceptions import ClientError

    data = tmp_path / "s3"
    proc, s3 = _start(data)
    try:
        s3.create_bucket(Bucket="rlvr")
        (data / "rlvr").write_text("in the way")
        (data / ".objects").write_text("in the way")
        with pytest.raises(ClientError, match="not kept on disk"):
            s3.put_object(Bucket="rlvr", Key="k", Body=b"x")
    finally:
        proc.kill()
        proc.wait()
