"""`rlvr report RUN`: a static HTML report with figures, written into the run's folder in the artifact store
(local and S3), showing the warehouse's numbers; self-contained (figures as data: URIs), so the page alone,
copied out of the store, shows them in a real browser. No report for a run whose folder is gone."""

from __future__ import annotations

import base64
import re
import shutil
import sys

import pytest
import sample_runs
import typer
from browser import free_port, page, screenshot, server
from typer.testing import CliRunner

from rlvr_cli import records
from rlvr_core.artifacts.storage import LocalStore, open_store
from rlvr_core.records import report
from rlvr_core.records import warehouse_queries as wq

PNG = b"\x89PNG\r\n\x1a\n"


def _images(html: str) -> dict[str, bytes]:
    """{figure file name: PNG bytes} of the page's embedded images."""
    return {name: base64.b64decode(data) for data, name in
            re.findall(r'<img src="data:image/png;base64,([^"]+)" alt="[^"]*" title="figures/([^"]+)">', html)}


@pytest.fixture
def store(sample_warehouse, tmp_path) -> LocalStore:
    """A copy of the sample runs' store (reports are written into the runs' own folders)."""
    shutil.copytree(sample_warehouse.runs.store.root, tmp_path / "store")
    return LocalStore(tmp_path / "store")


def test_report_holds_the_runs_numbers_and_its_figures(sample_warehouse, store):
    run_id = sample_runs.PROBED
    url = report.build_report(run_id, store=store, warehouse_path=sample_warehouse.db)
    key = f"{sample_runs.EXPERIMENT}/{run_id}/reports/index.html"
    assert url == store.url(key)
    html = store.get_text(key)
    imgs = _images(html)
    assert html.count("<img ") == 4 and sorted(imgs) == ["passk_curves.png", "per_problem_diff.png", "probe.png",
                                                          "training_curves.png"]
    for name, png in imgs.items():  # embedded, and the same bytes as the file beside the page
        assert png.startswith(PNG)
        assert store.get_bytes(f"{sample_runs.EXPERIMENT}/{run_id}/reports/figures/{name}") == png
    # The run's own index page now lists the report.
    assert 'href="reports/index.html"' in store.get_text(f"{sample_runs.EXPERIMENT}/{run_id}/index.html")
    truth = sample_warehouse.runs.truth[run_id]
    for (bench, ckpt), acc in truth["accuracy"].items():  # every eval number of the run, as the table prints it
        assert f"<td>{bench}</td><td>{ckpt}</td><td>accuracy_greedy</td><td class=num>{acc:.4g}</td>" in html
    for f in truth["firings"]:
        assert f["reason"] in html
    # The per-problem change counts (base → trained), from the raw samples.
    counts: dict[str, int] = {}
    for (bench, ck, pid), g_base in truth["greedy"].items():
        if ck == "base":
            g_tr = truth["greedy"][(bench, "trained", pid)]
            c = {(False, True): "fixed", (True, False): "broken", (True, True): "both_right",
                 (False, False): "both_wrong"}[(g_base, g_tr)]
            counts[c] = counts.get(c, 0) + 1
    for change, n in counts.items():
        assert f"<td>{change}</td><td class=num>{n}</td>" in html


def test_report_without_probes_or_training_and_a_missing_run(sample_warehouse, store, tmp_path):
    html = store.get_text(report.build_report(sample_runs.COLLAPSED, store=store,
                                              warehouse_path=sample_warehouse.db).split(str(store.root) + "/")[1])
    assert "3 of 4 collapse signals" in html and "figures/probe.png" not in html
    with pytest.raises(report.ReportError, match="run 'nope' is not in the warehouse"):
        report.build_report("nope", store=store, warehouse_path=sample_warehouse.db)
    # In the warehouse, but its files are gone from the store: no report of missing files.
    empty = LocalStore(tmp_path / "empty")
    with pytest.raises(report.ReportError, match=f"run '{sample_runs.PROBED}' is in the warehouse but its folder "
                                                 f"{sample_runs.EXPERIMENT}/{sample_runs.PROBED} is not in the artifact"):
        report.build_report(sample_runs.PROBED, store=empty, warehouse_path=sample_warehouse.db)
    assert empty.list() == []


def test_report_to_s3(sample_warehouse, s3_env):
    endpoint, bucket = s3_env
    store = open_store(f"s3://{bucket}/artifacts", endpoint_url=endpoint)
    run = f"{sample_runs.EXPERIMENT}/{sample_runs.PROBED}"
    store.put_dir(run, sample_warehouse.runs.store.root / run)
    url = report.build_report(sample_runs.PROBED, store=store, warehouse_path=sample_warehouse.db)
    prefix = f"{run}/reports"
    assert url == f"s3://{bucket}/artifacts/{prefix}/index.html"
    keys = store.list(prefix)
    assert f"{prefix}/index.html" in keys
    imgs = _images(store.get_text(f"{prefix}/index.html"))
    assert len(imgs) == 4
    for name in imgs:
        assert f"{prefix}/figures/{name}" in keys


def test_report_and_dashboard_commands(sample_warehouse, store, monkeypatch):
    app = typer.Typer()
    app.command("report")(records.report_command)
    app.command("dashboard")(records.dashboard_command)
    monkeypatch.setenv("RLVR_WAREHOUSE", str(sample_warehouse.db))
    runner = CliRunner()
    ok = runner.invoke(app, ["report", sample_runs.COLLAPSED, "--artifact-uri", store.uri])
    assert ok.exit_code == 0, ok.output
    assert ok.output.strip().endswith(f"{sample_runs.EXPERIMENT}/{sample_runs.COLLAPSED}/reports/index.html")
    bad = runner.invoke(app, ["report", "nope", "--artifact-uri", store.uri])
    assert bad.exit_code == 1 and "not in the warehouse" in bad.output
    assert "--port" in runner.invoke(app, ["dashboard", "--help"]).output
    assert wq.load("run_overview")  # the report's queries are the dashboard's files


@pytest.mark.slow
def test_static_report_in_a_browser(sample_warehouse, store, tmp_path):
    report.build_report(sample_runs.PROBED, store=store, warehouse_path=sample_warehouse.db)
    # The page alone, as a user downloads it from a bucket: no figures/ folder beside it.
    folder = tmp_path / "downloaded"
    folder.mkdir()
    shutil.copy(store.root / sample_runs.EXPERIMENT / sample_runs.PROBED / "reports" / "index.html", folder)
    port = free_port()
    url = f"http://127.0.0.1:{port}/index.html"
    cmd = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(folder)]
    with server(cmd, url), page(height=1000) as (pg, errors):
        pg.goto(url)
        pg.get_by_role("heading", name=f"Run {sample_runs.PROBED}").wait_for()
        pg.wait_for_load_state("load")
        sizes = pg.eval_on_selector_all("img", "els => els.map(e => [e.getAttribute('title'), e.complete, e.naturalWidth])")
        assert len(sizes) == 4 and all(done and width > 0 for _, done, width in sizes), sizes
        screenshot(pg, "report.png")
        assert errors == [], "\n".join(errors)
