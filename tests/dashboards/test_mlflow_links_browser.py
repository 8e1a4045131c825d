"""Every MLflow link rlvr prints or stores for a sweep, followed in headless Chromium against a real MLflow server,
opens MLflow 3's model-training view (runs, charts, "Model registry" in the navigation), not its GenAI pages
(Traces overview, Sessions, Judges): `rlvr stack up`'s address, the experiment, the runs view, the sweep's view,
the parent run and a trial (their pages), the parallel-coordinates compare page, and the links inside the parent
run's description. MLflow 3.17 decides the view from the link's `workflowType` (else its GenAI/Model training
switch, kept in the browser, default GenAI): a link MLflow itself draws (a run's name in a table) has no
`workflowType`, and docs/tracking.md asks for the one click on that switch. Screenshots go to tests/artifacts/ (copied to docs/screenshots/)."""

from __future__ import annotations

import time

import pytest

from flows.ablation_sweep import NOTE_TAG, _save_sweep_view, sweep_note, sweep_view_id
from flows.local_stack import stop_pid
from rlvr_core.pipeline.sweeps import find_sweep, load_sweep, pivot_metric_key
from rlvr_core.records.tracking import RUNS_VIEW_ID, Tracker, ui_home
from tests.dashboards.browser import page, screenshot
from tests.mlflow_server import start_mlflow

pytestmark = pytest.mark.slow

GENAI_ONLY = ("Judges", "Sessions", "Detect Issues")  # navigation and pages of the GenAI view only


@pytest.fixture(scope="module")
def sweep_runs(tmp_path_factory):
    """A sweep as the flow records it in MLflow: its parent (with its description), its saved view, six trials."""
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
            tracker.end_run(rid)
            children.append(tracker.client.get_run(rid))
        tracker.set_tags(parent, {NOTE_TAG: sweep_note(sw, sweep_id, tracker, children)})
        tracker.end_run(parent)
        yield {"url": server["url"], "tracker": tracker, "parent": parent, "children": children,
               "sweep_id": sweep_id, "n_trials": len(sw.trials)}
    finally:
        stop_pid(server["pid"])


def _assert_model_training(pg, what: str, must_show: str | None = None) -> None:
    """The page shows the model-training view: "Model registry" in the navigation, none of the GenAI pages."""
    pg.get_by_text("Model registry").first.wait_for(timeout=60_000)
    if must_show:
        pg.get_by_text(must_show).first.wait_for(timeout=60_000)
    time.sleep(1)  # let the page settle: a GenAI redirect would happen now
    text = pg.locator("body").inner_text()
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
        "parent run (rlvr sweep: MLflow parent run)": (t.run_url(parent), "The sweep's view"),
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
