"""The artifact store behaves the same on a local folder and on S3 (moto_server over HTTP)."""

import hashlib
from pathlib import Path

import pytest

from rlvr_core.artifacts.storage import LocalStore, S3Store, open_store


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    endpoint, bucket = request.getfixturevalue("s3_env")
    return open_store(f"s3://{bucket}/root/prefix", endpoint_url=endpoint)


def test_round_trip_list_and_exists(store, tmp_path):
    store.put_text("exp/run1/config.yaml", "a: 1\n")
    store.put_bytes("exp/run1/evals/samples.parquet", b"\x00\x01binary")
    f = tmp_path / "local.txt"
    f.write_text("hello")
    store.put_file("exp/run10/manifest.json", f)
    assert store.get_text("exp/run1/config.yaml") == "a: 1\n"
    assert store.get_bytes("exp/run1/evals/samples.parquet") == b"\x00\x01binary"
    assert store.exists("exp/run10/manifest.json") and not store.exists("exp/run1/nothing")
    # "exp/run1" must not match "exp/run10": prefixes are folders, not string prefixes.
    assert store.list("exp/run1") == ["exp/run1/config.yaml", "exp/run1/evals/samples.parquet"]
    assert store.list() == ["exp/run1/config.yaml", "exp/run1/evals/samples.parquet", "exp/run10/manifest.json"]
    assert store.sha256("exp/run10/manifest.json") == hashlib.sha256(b"hello").hexdigest()
    out = store.get_file("exp/run10/manifest.json", tmp_path / "back" / "m.json")
    assert out.read_text() == "hello"


def test_missing_key_and_bad_keys(store):
    with pytest.raises(FileNotFoundError, match="nope"):
        store.get_bytes("exp/nope")
    for bad in ("../escape", "a/../../b", "", "a//b"):
        with pytest.raises(ValueError):
            store.put_text(bad, "x")


def test_put_dir(store, tmp_path):
    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    (d / "a.txt").write_text("A")
    (d / "sub" / "b.txt").write_text("B")
    assert store.put_dir("exp/r", d) == ["exp/r/a.txt", "exp/r/sub/b.txt"]
    assert store.get_text("exp/r/sub/b.txt") == "B"


def test_s3_objects_are_where_the_uri_says(s3_env):
    import boto3

    endpoint, bucket = s3_env
    store = open_store(f"s3://{bucket}/team", endpoint_url=endpoint)
    assert isinstance(store, S3Store)
    store.put_text("exp/run/x.txt", "x")
    assert store.url("exp/run/x.txt") == f"s3://{bucket}/team/exp/run/x.txt"
    # Read back with a plain boto3 client: the layout is a real S3 layout, not our private format.
    body = boto3.client("s3", endpoint_url=endpoint).get_object(Bucket=bucket, Key="team/exp/run/x.txt")["Body"].read()
    assert body == b"x"


def test_open_store_resolution(rlvr_home, monkeypatch, tmp_path):
    assert open_store().uri == str(rlvr_home / "artifacts")
    monkeypatch.setenv("RLVR_ARTIFACT_URI", str(tmp_path / "elsewhere"))
    assert open_store().uri == str(tmp_path / "elsewhere")
    assert isinstance(open_store(f"file://{tmp_path}/f"), LocalStore)
    with pytest.raises(ValueError, match="scheme"):
        open_store("gs://bucket/x")


def test_sizes_and_get_dir(store, tmp_path):
    store.put_bytes("exp/run/a.bin", b"12345")
    store.put_text("exp/run/checkpoints/final/model.safetensors", "w" * 10)
    store.put_text("exp/run-other/x", "x")
    assert store.sizes("exp/run") == {"exp/run/a.bin": 5, "exp/run/checkpoints/final/model.safetensors": 10}
    got = store.get_dir("exp/run", tmp_path / "copy", skip=("checkpoints/",))
    assert got == [tmp_path / "copy" / "a.bin"] and (tmp_path / "copy" / "a.bin").read_bytes() == b"12345"


def test_run_index_links_every_file_relatively(store):
    import json
    import re

    from rlvr_core.artifacts.artifacts_index import write_run_index

    store.put_text("exp/r1/run.json", json.dumps({"experiment": "exp", "status": "FINISHED", "duration_s": 1.23456}))
    store.put_text("exp/r1/manifest.json", "{}")
    store.put_text("exp/r1/reports/summary report.html", "<p>hi</p>")
    store.put_bytes("exp/r1/evals/samples.parquet", b"x" * 2048)
    key = write_run_index(store, "exp/r1", links={"MLflow run": "http://mlflow:5000/#/experiments/1/runs/r1"})
    assert key == "exp/r1/index.html"
    page = store.get_text(key)
    hrefs = re.findall(r'href="([^"]+)"', page)
    assert set(hrefs) == {"run.json", "manifest.json", "reports/summary%20report.html", "evals/samples.parquet",
                          "http://mlflow:5000/#/experiments/1/runs/r1"}
    assert hrefs.count("reports/summary%20report.html") == 2  # listed under Reports and under reports/
    assert "2.0 KB" in page and "1.23" in page and "1.23456" not in page
    # Rewriting after a stage adds a file picks it up; the index never lists itself.
    store.put_text("exp/r1/probes/kl.parquet", "k")
    assert "probes/kl.parquet" in store.get_text(write_run_index(store, "exp/r1"))
    assert 'href="index.html"' not in store.get_text(key)
    with pytest.raises(FileNotFoundError, match="no run folder 'exp/none'"):
        write_run_index(store, "exp/none")


def test_artifacts_open_prints_a_local_path(store, rlvr_home, monkeypatch):
    """`open --print` on a run folder gives its index page; on S3 the folder is copied to a local cache
    (without checkpoints/), so the page's relative links resolve there."""
    import typer
    from typer.testing import CliRunner

    from rlvr_cli.artifacts import artifacts_open
    from rlvr_core.artifacts.artifacts_index import write_run_index

    endpoint = getattr(store, "endpoint_url", None)
    if endpoint:
        monkeypatch.setenv("RLVR_S3_ENDPOINT_URL", endpoint)
    store.put_text("exp/r2/manifest.json", "{}")
    store.put_text("exp/r2/checkpoints/final/model.safetensors", "w")
    write_run_index(store, "exp/r2")
    app = typer.Typer()
    app.command("open")(artifacts_open)
    app.command("noop")(lambda: None)  # two commands, so typer keeps the command name
    run = CliRunner().invoke(app, ["open", "exp/r2", "--print", "--artifact-uri", store.uri])
    assert run.exit_code == 0, run.output
    page = Path(run.output.strip().splitlines()[-1])
    assert page.name == "index.html" and (page.parent / "manifest.json").read_text() == "{}"
    if endpoint:
        assert page.is_relative_to(rlvr_home / "cache" / "artifact-views" / store.bucket)
        assert not (page.parent / "checkpoints").exists()
    else:
        assert page == store.root / "exp" / "r2" / "index.html"
    one = CliRunner().invoke(app, ["open", "exp/r2/manifest.json", "--print", "--artifact-uri", store.uri])
    assert one.exit_code == 0 and Path(one.output.strip()).read_text() == "{}"
    missing = CliRunner().invoke(app, ["open", "exp/nope", "--print", "--artifact-uri", store.uri])
    assert missing.exit_code == 1 and "no artifact, folder or run 'exp/nope'" in missing.output
