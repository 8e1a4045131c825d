"""Runs made through Prefect (a real temporary Prefect API, `prefect_test_harness`) into S3 (moto_server):
a sweep's folder `<experiment>/<sweep id>/` with its index page and pivot, one folder per trial named by
what it varies, each with its own index page linking MLflow; a single `pipeline` run under
`<experiment>/<name>-<run id[:8]>/` with its page; the warehouse ingested all of them from there."""

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

    endpoint, bucket = s3_env
    monkeypatch.setenv("RLVR_ARTIFACT_URI", f"s3://{bucket}/artifacts")
    monkeypatch.setenv("RLVR_S3_ENDPOINT_URL", endpoint)
    settings.configure_environment()
    sweep = tmp_path / "layout.yaml"
    sweep.write_text(yaml.safe_dump({"name": "layout-2", "base": str(ROOT / "configs" / "demo.yaml"), "set": ROOT_SET,
                                     "grid": {"grpo.lr": [1.0e-5, 5.0e-5]}, "seeds": [0], "metric": "accuracy_greedy"}))
    out = ablation_sweep_flow(str(sweep), max_parallel=1, deployment=None)
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
