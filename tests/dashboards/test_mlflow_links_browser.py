"""Every MLflow link rlvr prints or stores for a sweep, followed in headless Chromium against a real MLflow server
(started as `rlvr stack up` starts it), opens MLflow 3's model-training view (runs, charts, "Model registry" in the
navigation), not its GenAI pages (Traces overview, Sessions, Judges): `rlvr stack up`'s address, the experiment,
the runs view, the sweep's view, the parent run and a trial (their pages), the parallel-coordinates compare page,
and the links inside the parent run's description. So do the links MLflow draws itself (an experiment's name, a
run's name in a table, "Child runs"), which carry no `workflowType`: the stack's server makes the model-training
view the browser's default (rlvr_core/records/mlflow_ui.py); a user's walk through them, from a fresh profile,
is the second test, and on its way MLflow's runs table shows the sweep run alone, its trials folded under it and
each trial's stage runs under the trial. Screenshots go to tests/artifacts/ (copied to docs/screenshots/)."""

from __future__ import annotations

import re
import time

import pytest

from flows.ablation_sweep import NOTE_TAG, _save_sweep_view, sweep_note, sweep_view_id
from flows.local_stack import stop_pid
from rlvr_core.pipeline.sweeps import find_sweep, load_sweep, pivot_metric_key
from rlvr_core.records.mlflow_ui import WORKFLOW_KEY
from rlvr_core.records.tracking import RUNS_VIEW_ID, Tracker, ui_home
from tests.dashboards.browser import page, screenshot
from tests.mlflow_server import start_mlflow

pytestmark = pytest.mark.slow

GENAI_ONLY = ("Judges", "Sessions", "Detect Issues")  # navigation and pages of the GenAI view only
# A trial's stage runs, as flows/pipeline.py starts them (a trial trains, so its base model is not evaluated).
STAGES = ("data", "base-model", "passk", "curriculum", "train", "export", "evaluate-trained")


@pytest.fixture(scope="module")
def sweep_runs(tmp_path_factory):
    """A sweep as the flow records it in MLflow: its parent (with its description), its saved view, six trials,
    each with its stage runs."""
    home = tmp_path_factory.mktemp("mlflow-links")
    server = start_mlflow(home)
    try:
        tracker = Tracker("rlvr-sweeps", tracking_uri=server["url"])
        sw = load_sweep(find_sweep("demo-lr"))
        sweep_id = "demo-lr-0a1b2c3d"
        parent = tracker.start_run(f"sweep {sweep_id}", {"kind": "sweep", "sweep_id": sweep_id})
        _save_sweep_view(sw, sweep_id, tracker)
        children = []
        for tr in sw.trials:
            rid = tracker.start_run(f"{tr.trial_id} {tr.label}", {"kind": "trial", "sweep_id": sweep_id,
                                                                   "trial_id": tr.trial_id, "trial_label": tr.label},
                                    parent_run_id=parent)
            tracker.log_params(rid, {k: v for k, v in tr.overrides.items()})
            for step in range(3):
                tracker.log_metrics(rid, {"train/reward_mean": 0.1 * step + tr.seed / 100,
                                          "train/kl_ref_mean": 0.001 * step, "train/loss": 0.5 - 0.1 * step},
                                    step=step)
            tracker.client.log_metric(rid, pivot_metric_key(sw), 0.3 + tr.seed / 100)
            for stage in STAGES:
                with tracker.child_run(rid, "evaluate" if stage.startswith("evaluate") else stage, name=stage):
                    pass
            tracker.end_run(rid)
            children.append(tracker.client.get_run(rid))
        tracker.set_tags(parent, {NOTE_TAG: sweep_note(sw, sweep_id, tracker, children)})
        tracker.end_run(parent)
        yield {"url": server["url"], "tracker": tracker, "parent": parent, "children": children,
               "sweep_id": sweep_id, "n_trials": len(sw.trials)}
    finally:
        stop_pid(server["pid"])


def _settled(pg, must_show: str | None, quiet_s: float = 1.5, timeout_s: float = 60.0) -> str:
    """The page's text once it has settled: `must_show` (and "Model registry" or a GenAI page's name) is shown,
    and neither the address nor the text has changed for `quiet_s`. (MLflow's UI polls its server for as long as
    the page is open, so Playwright's "networkidle" never comes; a GenAI redirect or a late render changes the
    text, which restarts the count.)"""
    wanted = [must_show] if must_show else []
    deadline = time.monotonic() + timeout_s
    last, since = None, time.monotonic()
    while True:
        snap = (pg.url, pg.locator("body").inner_text())
        ready = all(w in snap[1] for w in wanted) and any(w in snap[1] for w in ("Model registry", *GENAI_ONLY))
        if snap != last or not ready:
            last, since = snap, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return snap[1]
        assert time.monotonic() < deadline, (f"page did not settle in {timeout_s:.0f} s", pg.url, wanted,
                                             snap[1][:500])
        time.sleep(0.25)


def _assert_model_training(pg, what: str, must_show: str | None = None) -> None:
    """The page shows the model-training view: "Model registry" in the navigation, none of the GenAI pages."""
    text = _settled(pg, must_show)
    shown = [w for w in GENAI_ONLY if w in text]
    assert "Model registry" in text and not shown, (what, pg.url, shown)


def test_every_link_rlvr_prints_for_a_sweep_opens_the_model_training_view(sweep_runs):
    t, parent = sweep_runs["tracker"], sweep_runs["parent"]
    trial = sweep_runs["children"][0]
    links = {  # what each link is: where rlvr prints or stores it
        "stack up: MLflow UI": (ui_home(sweep_runs["url"]), "rlvr-sweeps"),
        "experiment": (t.experiment_url(), None),
        "runs view (no stage runs)": (t.view_url(RUNS_VIEW_ID, charts=False), None),
        "sweep view (rlvr sweep: MLflow compare view)": (t.view_url(sweep_view_id(sweep_runs["sweep_id"])),
                                                          "Sweep pivot: accuracy_greedy"),
        "parent run (rlvr sweep: MLflow parent run)": (t.run_url(parent), "Compare the trials"),
        "trial run (sweep artifact, index page)": (t.run_url(trial.info.run_id), trial.info.run_name),
        "parallel coordinates (sweep index page)": (t.compare_url([c.info.run_id for c in sweep_runs["children"]]),
                                                    None),
    }
    with page(width=1600, height=1000) as (pg, _errors):
        for what, (url, text) in links.items():
            # Each link in a fresh browser context (no switch remembered), as a new user opens it from the terminal.
            new = pg.context.browser.new_page(viewport={"width": 1600, "height": 1000})
            new.goto(url)
            _assert_model_training(new, what, text)
            if what.startswith("sweep view"):
                # The view counts the trials, not their parent too ("7 matching runs" for 6 trials before).
                new.get_by_text(sweep_runs["children"][-1].info.run_name).first.wait_for(timeout=60_000)
                new.get_by_text(f"{sweep_runs['n_trials']} matching runs").first.wait_for(timeout=60_000)
                # Ordered by run name, as MLflow's sort menu names that order ("Sort: undefined" before).
                sort = new.get_by_text(re.compile(r"^Sort: ")).first.inner_text()
                assert sort == "Sort: Run Name", sort
                screenshot(new, "mlflow_sweep_view_model_training.png")
            if what.startswith("parent run"):
                screenshot(new, "mlflow_parent_description.png")
                # The description's links: the sweep's view and each trial, each in the model-training view.
                hrefs = new.locator("a[href*='workflowType=machine_learning']").evaluate_all(
                    "els => els.map(e => e.href)")
                assert any("viewStateShareKey=sweep-" in h for h in hrefs), hrefs
                assert sum(f"/runs/{c.info.run_id}" in h for c in sweep_runs["children"] for h in hrefs) \
                    == sweep_runs["n_trials"], hrefs
                link = new.locator(f"a[href*='/runs/{trial.info.run_id}?workflowType=machine_learning']").first
                if link.get_attribute("target") == "_blank":  # MLflow opens a description's links in a new tab
                    with new.context.expect_page() as opened:
                        link.click()
                    target = opened.value
                else:
                    link.click()
                    target = new
                target.wait_for_url(f"**/runs/{trial.info.run_id}**", timeout=60_000, wait_until="commit")
                _assert_model_training(target, "a trial link in the parent's description", "Model metrics")
            new.close()


def _open(pg, link, url_part: str):
    """Click `link` as a user does (Playwright's click: it fails when something covers the link, as MLflow's
    "Show more" gradient did); the page it opened (a new tab for a description's links), at `url_part`."""
    if link.get_attribute("target") == "_blank":
        with pg.context.expect_page() as opened:
            link.click(timeout=30_000)
        pg = opened.value
    else:
        link.click(timeout=30_000)
    pg.wait_for_url(f"**{url_part}**", timeout=60_000, wait_until="commit")
    return pg


def test_a_users_clicks_from_the_stack_address_stay_in_the_model_training_view(sweep_runs):
    """Fresh profile, a laptop's screen: the stack's address → the experiment (its name in MLflow's list) → the
    sweep's parent run (its name in the runs table) → a trial ("Child runs") → back → the parent's comparison
    link (its description's first line, clicked without "Show more") → a trial's name in that comparison. Every
    page after the first is reached by a link MLflow draws, without `workflowType`."""
    t, parent = sweep_runs["tracker"], sweep_runs["parent"]
    trial = sweep_runs["children"][0]
    parent_name = f"sweep {sweep_runs['sweep_id']}"
    with page(width=1280, height=720) as (pg, _errors):
        pg.goto(ui_home(sweep_runs["url"]))  # `page()` is a new browser: a fresh profile, no switch remembered
        _assert_model_training(pg, "the stack's address", "rlvr-sweeps")
        # The default the server's page stored (mlflow_ui.SCRIPT), where MLflow's switch reads it.
        assert pg.evaluate(f"localStorage.getItem('{WORKFLOW_KEY}')") == '"machine_learning"'
        link = pg.get_by_role("link", name="rlvr-sweeps", exact=True).first
        assert "workflowType" not in (link.get_attribute("href") or ""), link.get_attribute("href")  # MLflow's own
        pg = _open(pg, link, f"/experiments/{t.experiment_id}")  # (MLflow may then add the mode it is in)
        assert "workflowType=genai" not in pg.url, pg.url
        _assert_model_training(pg, "the experiment, from its name in MLflow's list", parent_name)
        _runs_table_folds_the_stage_runs(pg, sweep_runs)
        pg = _open(pg, pg.get_by_role("link", name=parent_name, exact=True).first, f"/runs/{parent}")
        _assert_model_training(pg, "the parent run, from its name in the runs table", "Child runs")
        # "Child runs" links end at the run id; the description's links to the same run carry `workflowType`.
        child = pg.locator(f"a[href$='/runs/{trial.info.run_id}']", has_text=trial.info.run_name).first
        assert "workflowType" not in (child.get_attribute("href") or "")
        pg = _open(pg, child, f"/runs/{trial.info.run_id}")
        assert "workflowType=genai" not in pg.url, pg.url
        _assert_model_training(pg, "a trial, from the parent's Child runs", "Model metrics")
        pg.go_back()
        pg.wait_for_url(f"**/runs/{parent}**", timeout=60_000, wait_until="commit")
        _assert_model_training(pg, "back on the parent run", "Compare the trials")
        screenshot(pg, "mlflow_parent_comparison_link.png")
        compare = _open(pg, pg.get_by_role("link", name=re.compile("^Compare the trials")).first,
                        f"viewStateShareKey={sweep_view_id(sweep_runs['sweep_id'])}")
        _assert_model_training(compare, "the comparison, from the parent's description",
                               f"{sweep_runs['n_trials']} matching runs")
        last = sweep_runs["children"][-1]
        compare = _open(compare, compare.get_by_role("link", name=last.info.run_name, exact=True).first,
                        f"/runs/{last.info.run_id}")
        _assert_model_training(compare, "a trial, from its name in the comparison", "Model metrics")


def _run_rows(pg, want: set[str], timeout_s: float = 60.0) -> None:
    """The runs table's rows (their run names) are `want` and stay so for a second (rows render as the runs load)."""
    deadline = time.monotonic() + timeout_s
    last, since = None, time.monotonic()
    while True:
        rows = pg.locator("[role=gridcell] a[href*='/runs/']").evaluate_all("els => els.map(e => e.innerText)")
        snap = sorted(rows)
        if snap != last:
            last, since = snap, time.monotonic()
        elif set(snap) == want and len(snap) == len(want) and time.monotonic() - since >= 1.0:
            return
        assert time.monotonic() < deadline, ("runs table rows", sorted(want), snap)
        time.sleep(0.25)


def _runs_table_folds_the_stage_runs(pg, sweep_runs) -> None:
    """MLflow's runs table as the experiment opens (ordered by "Created", its default): one row, the sweep run;
    expanded, its trials; a trial expanded, its stage runs. The count under the table is MLflow's: every run,
    folded ones too."""
    parent_name = f"sweep {sweep_runs['sweep_id']}"
    trials = {c.info.run_name for c in sweep_runs["children"]}
    n_runs = 1 + len(trials) * (1 + len(STAGES))

    def expand(name: str) -> None:
        link = pg.get_by_role("link", name=name, exact=True)
        pg.locator("[role=gridcell][col-id*='Run Name']", has=link).locator("button").first.click()

    pg.get_by_text(f"{n_runs} matching runs").first.wait_for(timeout=60_000)
    _run_rows(pg, {parent_name})
    expand(parent_name)
    _run_rows(pg, {parent_name, *trials})
    trial = sweep_runs["children"][0].info.run_name
    expand(trial)
    _run_rows(pg, {parent_name, *trials, *STAGES})
    screenshot(pg, "mlflow_runs_folded.png")
    expand(trial)
    expand(parent_name)  # folded again, as the walk found it
    _run_rows(pg, {parent_name})


def test_the_ui_page_always_carries_the_default_view_script(sweep_runs):
    """The server answers the UI's page with the script, also to a browser that asks whether its cached copy is
    still good (a 304 would keep a page cached from a plain `mlflow server` on the same port); the API and the
    static files are MLflow's, unchanged."""
    import urllib.request

    from rlvr_core.records.mlflow_ui import SCRIPT

    for headers in ({}, {"If-None-Match": "*", "If-Modified-Since": "Sun, 06 Dec 2099 00:00:00 GMT"}):
        with urllib.request.urlopen(urllib.request.Request(sweep_runs["url"] + "/", headers=headers)) as r:
            body = r.read()
            assert r.status == 200 and r.headers["Content-Length"] == str(len(body)), (headers, r.headers)
            assert body.startswith(b"<!doctype html>") and body.count(SCRIPT.encode()) == 1, body[:300]
            assert body.index(SCRIPT.encode()) < body.index(b"<script defer")  # before MLflow's own script
    with urllib.request.urlopen(sweep_runs["url"] + "/static-files/manifest.json") as r:
        assert b"<script" not in r.read()
