"""The artifact layout a person can browse (rlvr_core.artifacts.layout, docs/artifacts.md), on a folder and on a real
S3 API (moto_server): readable, unique folder names; every reader (warehouse ingest, run-id lookups,
`rlvr compare`, `rlvr artifacts open`) finds runs under the new names and under the old `<experiment>/<run_id>`."""

from __future__ import annotations

import pyarrow as pa
import pytest
import typer
from typer.testing import CliRunner

from rlvr_core.artifacts.layout import find_run_folders, pipeline_prefix, resolve_run, run_prefix, slug, trial_prefix
from rlvr_core.records import warehouse
from rlvr_core.records.runrecord import upload_run_folder, write_run_folder

LEGACY = "0f" * 16           # an old run folder: rlvr-demo/<full run id>
SINGLE = "a1b2c3d4" + "e" * 24
TRIAL = "c0ffee00" + "1" * 24
SWEEP = "demo-lr-5eed5eed"



def _run(store, prefix: str, run_id: str, tmp_path, experiment: str = "rlvr-demo") -> None:
    metrics = pa.Table.from_pylist([{"eval_id": "e", "benchmark": "synthetic", "checkpoint": "c",
                                     "metric": "accuracy_greedy", "value": 0.5, "n": 4, "ci_low": 0.1,
                                     "ci_high": 0.9, "settings": "{}"}])
    local = write_run_folder(tmp_path / "local" / run_id, run={"run_id": run_id, "experiment": experiment},
                             params={}, manifest={}, config_yaml="", summary={"mlflow_run_id": run_id},
                             tables={"evals/metrics.parquet": metrics})
    upload_run_folder(store, prefix, local)


def test_folder_names_are_readable_unique_and_safe():
    assert run_prefix("rlvr-demo", "demo", SINGLE) == "rlvr-demo/demo-a1b2c3d4"
    assert run_prefix("rlvr-demo", "demo", "ffff" * 8) != run_prefix("rlvr-demo", "demo", SINGLE)  # same name, two runs
    label = "grpo.loss_agg=token-mean grpo.lr=1e-05 seed=0"
    assert trial_prefix("rlvr-sweeps", SWEEP, "t01", label) == \
        f"rlvr-sweeps/{SWEEP}/t01_grpo.loss_agg=token-mean_grpo.lr=1e-05_seed=0"
    assert pipeline_prefix("rlvr-sweeps", "demo", TRIAL, SWEEP, "t01", label) == trial_prefix("rlvr-sweeps", SWEEP,
                                                                                               "t01", label)
    assert pipeline_prefix("rlvr-demo", "my run", SINGLE) == "rlvr-demo/my_run-a1b2c3d4"
    # Never a path separator, '.', '..' or an empty segment, whatever the name holds.
    for bad in ("../../etc", "a/b\\c", "..", "", "x" * 300, "über run?"):
        s = slug(bad)
        assert s and "/" not in s and s not in (".", "..") and len(s) <= 80, s
    assert run_prefix("exp", "eval rlvr-demo/demo-a1b2c3d4", SINGLE).count("/") == 1


def test_readers_find_runs_in_both_layouts(store, tmp_path):
    _run(store, f"rlvr-demo/{LEGACY}", LEGACY, tmp_path)
    _run(store, run_prefix("rlvr-demo", "demo", SINGLE), SINGLE, tmp_path)
    trial = trial_prefix("rlvr-demo", SWEEP, "t00", "grpo.lr=1e-05 seed=0")
    _run(store, trial, TRIAL, tmp_path)
    store.put_text(f"rlvr-demo/{SWEEP}/index.html", "<p>sweep</p>")  # a sweep folder holds no run.json
    expected = sorted([f"rlvr-demo/{LEGACY}", "rlvr-demo/demo-a1b2c3d4", trial])
    assert warehouse.find_runs(store) == find_run_folders(store) == expected
    db = tmp_path / "w.duckdb"
    out = warehouse.ingest_all(store, db)
    assert sorted(out["ingested"]) == sorted([LEGACY, SINGLE, TRIAL])
    prefixes = warehouse.query_records("select run_id, run_prefix from ingest_log order by run_id", path=db)
    assert {r["run_id"]: r["run_prefix"] for r in prefixes} == {LEGACY: f"rlvr-demo/{LEGACY}",
                                                                 SINGLE: "rlvr-demo/demo-a1b2c3d4", TRIAL: trial}
    # A run is found by its folder, by its id (full or its first 8 characters) and by EXPERIMENT/RUN_ID.
    for ref, folder in ((SINGLE, "rlvr-demo/demo-a1b2c3d4"), (SINGLE[:8], "rlvr-demo/demo-a1b2c3d4"),
                        (f"rlvr-demo/{SINGLE}", "rlvr-demo/demo-a1b2c3d4"), (TRIAL, trial), (LEGACY, f"rlvr-demo/{LEGACY}"),
                        (f"rlvr-demo/{LEGACY}", f"rlvr-demo/{LEGACY}"), (trial + "/", trial)):
        assert resolve_run(store, ref) == folder, ref
    for ref in ("nope", "a1b2", f"other-exp/{SINGLE}", f"rlvr-demo/{SWEEP}", ""):
        with pytest.raises(FileNotFoundError, match=f"run {ref!r} not found in the artifact store {store.uri}"):
            resolve_run(store, ref)


def test_compare_names_the_run_it_cannot_find(store, tmp_path, monkeypatch):
    """Before: `bad artifact key ''` (the store's root URL was built from an empty key)."""
    from rlvr_cli.eval import app

    if hasattr(store, "endpoint_url"):
        monkeypatch.setenv("RLVR_S3_ENDPOINT_URL", store.endpoint_url)
    monkeypatch.setenv("RLVR_ARTIFACT_URI", store.uri)
    _run(store, run_prefix("rlvr-demo", "demo", SINGLE), SINGLE, tmp_path)
    for missing in ("nosuchrun", "rlvr-demo/nosuchrun"):
        res = CliRunner().invoke(app, ["compare", missing, SINGLE])
        assert res.exit_code == 2, res.output
        assert f"run {missing!r} not found" in res.output and store.uri in res.output
        assert "bad artifact key" not in res.output and "Traceback" not in res.output
    # Found, but it holds no evaluation: says which run and which file.
    res = CliRunner().invoke(app, ["compare", SINGLE[:8], SINGLE])
    assert res.exit_code == 2 and "has no evals/samples.parquet" in res.output and "demo-a1b2c3d4" in res.output


def test_open_resolves_run_ids_and_refuses_folders_without_an_index(store, tmp_path, rlvr_home, monkeypatch):
    """`rlvr artifacts open`: a run id opens its folder's page; a folder without index.html is listed (as
    `ls` lists it), never a path to a page that does not exist."""
    from rlvr_cli.artifacts import artifacts_open
    from rlvr_core.artifacts.artifacts_index import write_run_index

    if hasattr(store, "endpoint_url"):
        monkeypatch.setenv("RLVR_S3_ENDPOINT_URL", store.endpoint_url)
    folder = run_prefix("rlvr-demo", "demo", SINGLE)
    _run(store, folder, SINGLE, tmp_path)
    app = typer.Typer()
    app.command("open")(artifacts_open)
    app.command("noop")(lambda: None)

    def open_(*args):
        return CliRunner().invoke(app, ["open", *args, "--print", "--artifact-uri", store.uri])

    res = open_(folder)  # no page: the folder's listing instead, and how to get a page
    assert res.exit_code == 0 and res.output.split()[:2] == ["run", folder + "/"], res.output
    assert f"no index.html in this run folder; write one with: rlvr artifacts index {folder}" in res.output
    res = open_("rlvr-demo")  # not a run: its listing, one line per run folder
    assert res.exit_code == 0 and res.output.split()[:2] == ["run", folder + "/"], res.output
    write_run_index(store, folder)
    for ref in (folder, SINGLE, SINGLE[:8]):
        res = open_(ref)
        assert res.exit_code == 0, res.output
        page = res.output.strip().splitlines()[-1]
        assert page.endswith("demo-a1b2c3d4/index.html") and "rlvr run rlvr-demo/demo-a1b2c3d4" in open(page).read()
    res = open_("nosuchrun")
    assert res.exit_code == 1 and f"no artifact, folder or run 'nosuchrun' in {store.uri}" in res.output
