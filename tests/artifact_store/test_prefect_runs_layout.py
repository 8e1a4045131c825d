"""Runs made through Prefect (a real temporary Prefect API, `prefect_test_harness`) into S3 (moto_server):
a sweep's folder `<experiment>/<sweep id>/` with its index page and pivot, one folder per trial named by
what it varies, each with its own index page linking MLflow; a single `pipeline` run under
`<experiment>/<name>-<run id[:8]>/` with its page; the warehouse ingested all of them from there. In MLflow
(the sqlite store), the runs table MLflow draws lists the sweep run and the single run, everything else folded
under them, also after a trial is launched again."""

from __future__ import annotations

import json
import re
from urllib.parse import quote

import pytest
import yaml

pytestmark = pytest.mark.slow

# The checks are about where runs land and what their pages link, not about accuracy: the smallest sizes that run
# every stage (8-token generations, a 4-step warm start, 4 held-out problems).
ROOT_SET = {"data.synthetic.n_train": 16, "data.synthetic.n_test": 4, "model.warm_start.steps": 4,
            "passk.max_prompts": 8, "passk.n_samples": 2, "passk.ks": [1, 2], "eval.n_samples": 2,
            "sampling.max_new_tokens": 8, "eval.max_new_tokens": 8, "eval.verifier_workers": 0,
            "tracking.experiment": "layout", "grpo.enabled": True, "grpo.steps": 2, "grpo.warmup_steps": 0,
            "grpo.prompts_per_step": 2, "grpo.group_size": 2, "grpo.dynamic_sampling": False,
            "grpo.checkpoint_every": 2,
            "grpo.guards.health.no_signal.serious": False}  # 2 steps of a tiny base: no signal, by design


def test_prefect_runs_are_browsable_in_s3(prefect_api, rlvr_home, s3_env, monkeypatch, tmp_path):
    from flows.ablation_sweep import ablation_sweep_flow
    from flows.pipeline import pipeline_flow
    from rlvr_core.core import settings
    from rlvr_core.records import warehouse
    from rlvr_core.artifacts.storage import open_store
    from rlvr_core.pipeline.child.run import ROOT
    from rlvr_core.pipeline.sweeps import load_sweep

    endpoint, bucket = s3_env
    monkeypatch.setenv("RLVR_ARTIFACT_URI", f"s3://{bucket}/artifacts")
    monkeypatch.setenv("RLVR_S3_ENDPOINT_URL", endpoint)
    settings.configure_environment()
    sweep = tmp_path / "layout.yaml"
    sweep.write_text(yaml.safe_dump({"name": "layout-2", "base": str(ROOT / "configs" / "demo.yaml"), "set": ROOT_SET,
                                     "grid": {"grpo.lr": [1.0e-5, 5.0e-5]}, "seeds": [0], "metric": "accuracy_greedy"}))
    out = ablation_sweep_flow(str(sweep), max_parallel=1, deployment=None)
    # A trial launched again, as the sweep relaunches one whose worker was lost: the same MLflow runs go on.
    again = load_sweep(sweep).trials[1]
    pipeline_flow(again.config, parent_run_id=out["mlflow_parent_run_id"], sweep_id=out["sweep_id"],
                  trial_id=again.trial_id, trial_label=again.label)
    single = pipeline_flow(str(ROOT / "configs" / "demo.yaml"),
                           {**{k: v for k, v in ROOT_SET.items() if not k.startswith("grpo.")},
                            "grpo.enabled": False})  # evaluation only: a single run, not a trial
    store = open_store()
    sweep_id = out["sweep_id"]
    # The sweep's own folder: index page and pivot, a link per trial.
    page = store.get_text(f"layout/{sweep_id}/index.html")
    assert json.loads(store.get_text(f"layout/{sweep_id}/pivot.json"))[0]["n_seeds"] == 1
    trials = sorted({k.split("/")[2] for k in store.list(f"layout/{sweep_id}") if k.endswith("/run.json")})
    assert trials == ["t00_lr=1e-05_seed=0", "t01_lr=5e-05_seed=0"]  # trial id, then what differs (short keys)
    for t in trials:
        assert page.count(f'href="{quote(t)}/index.html"') == 2
        index = store.get_text(f"layout/{sweep_id}/{t}/index.html")
        assert 'href="checkpoints/final/model.safetensors"' in index and "<svg" in index  # files and figures
        assert json.loads(store.get_text(f"layout/{sweep_id}/{t}/summary.json"))["artifact_uri"] == \
            store.url(f"layout/{sweep_id}/{t}")
    # The single run: <experiment>/<name>-<run id[:8]>/ with its page.
    folder = f"layout/demo-{single['mlflow_run_id'][:8]}"
    assert single["artifact_uri"] == store.url(folder)
    hrefs = set(re.findall(r'href="([^"]+)"', store.get_text(f"{folder}/index.html")))
    assert {"run.json", "manifest.json", "evals/samples.parquet", "report.md"} <= hrefs
    # The warehouse found every run where it is now.
    rows = warehouse.query_records("select run_prefix from ingest_log order by run_prefix")
    assert [r["run_prefix"] for r in rows] == sorted([folder, *(f"layout/{sweep_id}/{t}" for t in trials)])
    _folded_in_mlflow(out["mlflow_parent_run_id"], single["mlflow_run_id"])


def _folded_in_mlflow(sweep_run: str, single_run: str) -> None:
    """MLflow's own runs table (ordered by "Created", its default) draws two rows, the sweep run and the single
    run; each trial is folded under the sweep run, each stage run under its trial or run, once per stage."""
    from mlflow.tracking import MlflowClient

    from rlvr_core.core import settings
    from tests.mlflow_server import table_roots

    client = MlflowClient(settings.mlflow_tracking_uri())
    runs = client.search_runs([client.get_experiment_by_name("layout").experiment_id], "", max_results=100)
    by_id = {r.info.run_id: r for r in runs}
    assert sorted(table_roots(runs)) == sorted(by_id[r].info.run_name for r in (sweep_run, single_run))
    under: dict[str, list[str]] = {}
    for r in runs:
        if r.info.run_id not in (sweep_run, single_run):
            under.setdefault(r.data.tags["mlflow.parentRunId"], []).append(r.data.tags["kind"])
    trials = [r.info.run_id for r in runs if r.data.tags["kind"] == "trial"]
    assert len(trials) == 2 and under[sweep_run] == ["trial", "trial"]
    assert {p: len(kinds) for p, kinds in under.items() if p != sweep_run} == {**{t: 7 for t in trials},
                                                                                single_run: 5}
    assert {k for p, kinds in under.items() if p != sweep_run for k in kinds} == {"stage"}
