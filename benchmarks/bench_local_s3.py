"""What keeping objects on disk costs: the local stack's S3 (`rlvr_core.artifacts.s3_local`) against plain
`moto_server` (in memory), both started here on 127.0.0.1, same client (boto3), same work.

    python benchmarks/bench_local_s3.py [--mb 64] [--small 300] [--rounds 3]

Work per round: one `--mb` MB checkpoint-like file (multipart upload), `--small` 2 KB files (a run's
metrics, configs and reports), listing them, reading everything back. Prints seconds per phase (median
over rounds) and the ratio s3_local / moto_server.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from rlvr_core.core.net import free_port


def start(kind: str, data: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    if kind == "moto_server":
        argv = [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)]
    else:
        argv = [sys.executable, "-m", "rlvr_core.artifacts.s3_local", "--port", str(port), "--data", str(data)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=1)
            return proc, url
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{kind} did not start")


def one_round(url: str, big: Path, n_small: int, bucket: str) -> dict[str, float]:
    import boto3

    s3 = boto3.client("s3", endpoint_url=url, aws_access_key_id="a", aws_secret_access_key="b",
                      region_name="us-east-1")
    s3.create_bucket(Bucket=bucket)
    t: dict[str, float] = {}
    t0 = time.perf_counter()
    s3.upload_file(str(big), bucket, "ckpt/model.safetensors")
    t["put big"] = time.perf_counter() - t0
    body = os.urandom(2048)
    t0 = time.perf_counter()
    for i in range(n_small):
        s3.put_object(Bucket=bucket, Key=f"run/metrics/{i:05d}.json", Body=body)
    t["put small"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
            for o in page.get("Contents", [])]
    t["list"] = time.perf_counter() - t0
    assert len(keys) == n_small + 1
    t0 = time.perf_counter()
    for k in keys:
        s3.get_object(Bucket=bucket, Key=k)["Body"].read()
    t["get all"] = time.perf_counter() - t0
    return t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--small", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "big.bin"
        big.write_bytes(os.urandom(a.mb * 1024 * 1024))
        results: dict[str, dict[str, float]] = {}
        for kind in ("moto_server", "s3_local"):
            proc, url = start(kind, Path(tmp) / "data")
            try:
                rounds = [one_round(url, big, a.small, f"bench-{r}") for r in range(a.rounds)]
            finally:
                proc.kill()
                proc.wait()
            results[kind] = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    print(f"{a.mb} MB file + {a.small} x 2 KB objects, median of {a.rounds} rounds, seconds")
    print(f"{'phase':10} {'moto_server':>12} {'s3_local':>10} {'ratio':>7}")
    for phase in results["moto_server"]:
        m, s = results["moto_server"][phase], results["s3_local"][phase]
        print(f"{phase:10} {m:12.3f} {s:10.3f} {s / m:7.2f}")


if __name__ == "__main__":
    main()
