"""`rlvr artifacts open|ls|get` take every form rlvr prints (rlvr_core.records.locate), on a local folder and
on S3 (moto_server): the `artifacts:` line of a sweep and of `rlvr demo` (an s3:// URI or a path, with or
without the trailing slash), a folder key, a sweep id, a run id; `ls` groups keys by run and sweep folder.
(MLflow run ids, through a real tracking server: tests/integration/test_mlflow_server_s3.py and
tests/flows/test_stack_e2e.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from rlvr_core.artifacts.artifacts_index import write_run_index, write_sweep_index
from rlvr_core.artifacts.layout import run_prefix, sweep_prefix, trial_prefix

SWEEP_ID = "demo-lr-40e69213"
RUN_ID = "a1b2c3d4e5f60718293a4b5c6d7e8f90"
TRIALS = {"t00": ("lr=1e-05 seed=0", "11112222333344445555666677778888"),
          "t01": ("lr=5e-05 seed=0", "99990000aaaabbbbccccddddeeeeffff")}


def _write(store) -> dict[str, str]:
    """A finished sweep of two trials (one with a checkpoint) and a single demo run."""
    sweep = sweep_prefix("rlvr-sweeps", SWEEP_ID)
    for tid, (label, rid) in TRIALS.items():
        folder = trial_prefix("rlvr-sweeps", SWEEP_ID, tid, label)
        store.put_text(f"{folder}/summary.json", json.dumps({"trial_id": tid, "accuracy_greedy": 0.05}))
        store.put_bytes(f"{folder}/checkpoints/final/model.safetensors", b"w" * 1000)
        store.put_text(f"{folder}/run.json", json.dumps({"run_id": rid, "status": "FINISHED"}))
        write_run_index(store, folder)
    write_sweep_index(store, sweep, pivot=[{"grpo.lr": 1e-5, "mean": 0.05, "n_seeds": 1, "per_seed": [0.05],
                                            "trial_ids": ["t00"]}], swept_keys=["grpo.lr"], metric="accuracy_greedy")
    run = run_prefix("rlvr-demo", "demo", RUN_ID)
    store.put_bytes(f"{run}/evals/samples.parquet", b"x" * 2048)
    store.put_text(f"{run}/run.json", json.dumps({"run_id": RUN_ID, "status": "FINISHED"}))
    write_run_index(store, run)
    return {"sweep": sweep, "run": run}


@pytest.fixture
def cli(store, rlvr_home, monkeypatch):
    from rlvr_cli.artifacts import artifacts_get, artifacts_ls, artifacts_open

    if hasattr(store, "endpoint_url"):
        monkeypatch.setenv("RLVR_S3_ENDPOINT_URL", store.endpoint_url)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{rlvr_home / 'none.db'}")  # no MLflow store: not created
    app = typer.Typer()
    for name, fn in (("open", artifacts_open), ("ls", artifacts_ls), ("get", artifacts_get)):
        app.command(name)(fn)

    def run(*args: str):
        return CliRunner().invoke(app, [*args, "--artifact-uri", store.uri])
    return run


def test_open_takes_every_form_the_sweep_and_the_demo_print(store, cli, rlvr_home):
    where = _write(store)
    sweep_url, run_url = store.url(where["sweep"]), store.url(where["run"])
    # The `MLflow compare view:` line of `rlvr sweep` (the sweep's saved view on the tracking server).
    compare = (f"http://127.0.0.1:5000/#/experiments/3/runs?workflowType=machine_learning"
               f"&viewStateShareKey=sweep-{SWEEP_ID}&compareRunsMode=CHART")
    forms = {"sweep": [sweep_url + "/", sweep_url, where["sweep"], where["sweep"] + "/", SWEEP_ID, compare],
             "run": [run_url, run_url + "/", where["run"], RUN_ID, RUN_ID[:8], "demo-a1b2c3d4"]}
    for what, refs in forms.items():
        title = f"rlvr sweep {where['sweep']}" if what == "sweep" else f"rlvr run {where['run']}"
        for ref in refs:
            res = cli("open", ref, "--print")
            assert res.exit_code == 0, (ref, res.output)
            page = Path(res.output.strip().splitlines()[-1])
            assert page.name == "index.html" and title in page.read_text(), (ref, page)
    trial = cli("open", TRIALS["t01"][1], "--print")  # a trial by its run id
    assert trial.exit_code == 0 and "t01_lr=5e-05_seed=0/index.html" in trial.output, trial.output
    if hasattr(store, "endpoint_url"):  # the sweep's copy leaves out every trial's checkpoints
        view = rlvr_home / "cache" / "artifact-views" / store.bucket / "artifacts" / where["sweep"]
        assert (view / "t00_lr=1e-05_seed=0" / "index.html").is_file()
        assert not list(view.rglob("model.safetensors"))
    one = cli("open", run_url + "/run.json", "--print")  # a file by its URI
    assert one.exit_code == 0 and json.loads(Path(one.output.strip()).read_text())["run_id"] == RUN_ID


def test_errors_are_one_line_saying_what_was_tried(store, cli):
    _write(store)
    for ref in ("nosuchrun", "rlvr-sweeps/nope", "0" * 32):
        res = cli("open", ref, "--print")
        assert res.exit_code == 1 and len(res.output.strip().splitlines()) == 1, res.output
        assert f"no artifact, folder or run {ref!r} in {store.uri}: tried a key, a folder" in res.output
    res = cli("open", "0" * 32, "--print")
    assert "as an MLflow run id in sqlite:///" in res.output and "no such store" in res.output
    bad = "s3://" if hasattr(store, "endpoint_url") else "/no/such/folder/"
    for ref in (bad, f"{store.url('rlvr-sweeps')}/no-such-sweep/"):
        res = cli("ls", ref)
        assert res.exit_code == 1 and len(res.output.strip().splitlines()) == 1, res.output
        assert "Traceback" not in res.output and res.output.startswith("rlvr artifacts ls: ")


def test_ls_groups_by_run_and_sweep_folder_with_sizes(store, cli):
    where = _write(store)
    res = cli("ls", "")
    assert res.exit_code == 0, res.output
    lines = res.output.strip().splitlines()
    rows = {ln.split()[1]: ln.split() for ln in lines[:-1]}
    sizes = store.sizes("")
    t00 = trial_prefix("rlvr-sweeps", SWEEP_ID, "t00", TRIALS["t00"][0])
    assert set(rows) == {where["run"] + "/", where["sweep"] + "/", t00 + "/",
                         trial_prefix("rlvr-sweeps", SWEEP_ID, "t01", TRIALS["t01"][0]) + "/"}
    assert rows[where["sweep"] + "/"][0] == "sweep" and rows[t00 + "/"][0] == "run"
    n_t00 = len([k for k in sizes if k.startswith(t00 + "/")])
    assert rows[t00 + "/"][2:4] == [str(n_t00), "files"] and n_t00 == 4
    assert rows[where["sweep"] + "/"][2] == "2"  # index.html, pivot.json
    assert lines[-1].startswith(f"4 folders, {len(sizes)} files, ")
    one = cli("ls", SWEEP_ID)  # by sweep id: the sweep's folder and its trials
    assert one.exit_code == 0 and len(one.output.strip().splitlines()) == 4, one.output
    run = cli("ls", store.url(where["run"]) + "/")  # one run: its files, key by key, with sizes
    assert f"   2.0 KB  {where['run']}/evals/samples.parquet\n" in run.output, run.output
    flat = cli("ls", "rlvr-demo", "--flat")
    assert flat.output.split() == sorted(k for k in sizes if k.startswith("rlvr-demo/"))


def test_a_folder_without_an_index_opens_as_its_listing(store, cli, tmp_path):
    store.put_text("notes/a/b.txt", "hello")
    res = cli("open", "notes", "--print")
    assert res.exit_code == 0 and res.output.split()[:2] == ["folder", "notes/a/"], res.output
    got = cli("get", store.url("notes/a/b.txt"), str(tmp_path / "b.txt"))
    assert got.exit_code == 0 and (tmp_path / "b.txt").read_text() == "hello"
    res = cli("get", "notes", str(tmp_path / "x"))
    assert res.exit_code == 1 and "is a folder; list it with: rlvr artifacts ls notes" in res.output


def test_a_full_mlflow_run_id_asks_mlflow_before_reading_every_trials_run_json(tmp_path):
    """A trial's folder is named by its trial, so the store alone finds a run id only by reading every trial's
    run.json (a request each on S3: seconds on a stack with a few sweeps). A full run id asks MLflow first: the
    sweep's parent and a trial are found without reading one run.json."""
    from mlflow.tracking import MlflowClient

    from rlvr_core.artifacts.storage import LocalStore
    from rlvr_core.records.locate import locate

    class CountingStore(LocalStore):  # the real local store, recording which run.json files it reads
        reads: list[str] = []

        def get_text(self, key: str) -> str:
            if key.endswith("run.json"):
                self.reads.append(key)
            return super().get_text(key)

    store = CountingStore(tmp_path / "store")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("rlvr-sweeps")
    parent = client.create_run(exp, tags={"kind": "sweep", "sweep_id": SWEEP_ID}).info.run_id
    trial = client.create_run(exp, tags={"kind": "trial", "sweep_id": SWEEP_ID, "trial_id": "t01",
                                         "mlflow.parentRunId": parent}).info.run_id
    for tid, (label, _) in TRIALS.items():
        folder = trial_prefix("rlvr-sweeps", SWEEP_ID, tid, label)
        store.put_text(f"{folder}/run.json", json.dumps({"run_id": trial if tid == "t01" else "0" * 32}))
    store.put_text(sweep_prefix("rlvr-sweeps", SWEEP_ID) + "/index.html", "<html></html>")
    assert locate(parent, store, uri).key == sweep_prefix("rlvr-sweeps", SWEEP_ID)
    assert locate(trial, store, uri).key == trial_prefix("rlvr-sweeps", SWEEP_ID, "t01", TRIALS["t01"][0])
    assert store.reads == []
    # Without MLflow (a run id it does not know) the store's run.json files still find the trial.
    assert locate(trial, store, f"sqlite:///{tmp_path / 'other.db'}").key.endswith("/t01_lr=5e-05_seed=0")


def _nightly_report(store) -> str:
    """A nightly report as flows/nightly_eval.py links it (its own link functions, `_rel` and
    `_checkpoint_links`; the page's anchors as rlvr_core.eval.nightly_report writes them): per checkpoint the
    training run's page, the evaluation's folder page and the checkpoint's manifest; the base evaluation's
    folder (no page). The training run keeps its weights in checkpoints/final/."""
    from types import SimpleNamespace

    from flows.nightly_eval import BASE_EVALS, EXPERIMENT, _checkpoint_links, _rel
    from rlvr_core.artifacts.export import MANIFEST_FILE
    from rlvr_core.eval.nightly_report import _a

    run = run_prefix("rlvr-demo", "demo", RUN_ID)
    ckpt = f"{run}/checkpoints/final"
    store.put_text(f"{ckpt}/{MANIFEST_FILE}", json.dumps({"created_at": "2026-12-06T03:00:00Z"}))
    store.put_bytes(f"{ckpt}/model.safetensors", b"w" * 4096)
    store.put_text(f"{run}/run.json", json.dumps({"run_id": RUN_ID, "status": "FINISHED"}))
    store.put_bytes(f"{run}/evals/samples.parquet", b"x" * 2048)
    write_run_index(store, run)
    evaluation = run_prefix(EXPERIMENT, "eval", "c" * 32)
    store.put_bytes(f"{evaluation}/evals/metrics.parquet", b"m" * 512)
    store.put_text(f"{evaluation}/run.json", json.dumps({"run_id": "c" * 32, "status": "FINISHED"}))
    write_run_index(store, evaluation)
    base = f"{BASE_EVALS}/synthetic@2-x/{'b' * 20}"
    store.put_bytes(f"{base}/evals/metrics.parquet", b"b" * 256)
    report = f"{EXPERIMENT}/reports/20261206T030000-synthetic@2-x.html"
    cfg = SimpleNamespace(tracking=SimpleNamespace(tracking_uri="sqlite:///none.db"))  # no MLflow links
    links = {**_checkpoint_links(store, cfg, ckpt, {"run_prefix": evaluation, "mlflow_run_id": ""}, report, {}),
             "base evaluation": _rel(report, f"{base}/evals")}
    store.put_text(report, "<!doctype html><html><head><title>nightly</title></head><body><p>"
                   + " · ".join(_a(href, label) for label, href in links.items()) + "</p></body></html>")
    return report


def test_every_relative_link_of_an_opened_nightly_report_resolves(store, cli, rlvr_home):
    """`rlvr artifacts open` on a report: every relative link of the local copy resolves (13 of 19 were dead);
    the pages it links to work too, and one whose links need --with-checkpoints says so."""
    from rlvr_core.artifacts.artifacts_index import CHECKPOINTS_NOTE_ID, relative_links

    report = _nightly_report(store)
    res = cli("open", store.url(report), "--print")
    assert res.exit_code == 0, res.output
    page = Path(res.output.strip().splitlines()[-1])
    links = relative_links(page.read_text())
    assert len(links) == 4, links  # training run, evaluation folder, checkpoint, base evaluation
    for rel in links:
        assert (page.parent / rel).exists(), (rel, sorted(p.name for p in page.parent.parent.rglob("*")))
    run_page = (page.parent / links[0]).resolve()
    assert run_page.name == "index.html" and relative_links(run_page.read_text())
    dead = [rel for rel in relative_links(run_page.read_text()) if not (run_page.parent / rel).exists()]
    if hasattr(store, "endpoint_url"):  # a copy: the weights only with --with-checkpoints, and the page says so
        assert dead == ["checkpoints/final/model.safetensors"], dead
        assert CHECKPOINTS_NOTE_ID in run_page.read_text() and "--with-checkpoints" in run_page.read_text()
        full = cli("open", store.url(report), "--print", "--with-checkpoints")
        assert full.exit_code == 0 and (run_page.parent / dead[0]).is_file()
        assert CHECKPOINTS_NOTE_ID not in run_page.read_text()
    else:  # the store itself: every link is there
        assert dead == [] and CHECKPOINTS_NOTE_ID not in run_page.read_text()
    trial = cli("open", _write(store)["sweep"] + "/t00_lr=1e-05_seed=0", "--print")  # a trial page, opened alone
    assert trial.exit_code == 0, trial.output
    assert ("--with-checkpoints" in trial.output) == hasattr(store, "endpoint_url"), trial.output
