"""The sweep's trial tasks are named by their trial in Prefect (task runs), not `trial-54e`; its shared stages
by what they run, not `shared-stages-db3`."""

from __future__ import annotations

import pytest


def test_a_trial_task_run_is_named_by_its_trial(prefect_api):
    from prefect import flow, get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.ablation_sweep import run_trial, shared_stages
    from rlvr_core.pipeline.sweeps import Trial

    trial = Trial(trial_id="t03", label="lr=1e-05 seed=1", overrides={"grpo.lr": 1e-5, "seed": 1},
                  cell={"grpo.lr": 1e-5}, seed=1, config={})

    @flow(name="trial-names")
    def sweep_like() -> str:
        from prefect.runtime import flow_run

        fut = run_trial.submit(trial, "s-1", "0" * 32, "no-such-flow/no-such-deployment", 5.0)
        fut.wait()  # it fails (no such deployment): only its name matters here
        shared = shared_stages.submit({}, "no-such-flow/no-such-deployment", 5.0)
        shared.wait()
        return flow_run.id

    flow_run_id = sweep_like()
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    assert sorted(r.name for r in runs) == ["shared stages: data, base model, pass rates, curriculum",
                                            "t03 lr=1e-05 seed=1"], [r.name for r in runs]
