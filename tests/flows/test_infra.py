"""infra/prefect: the deployments file names real flows, and every job template placeholder is declared."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra" / "prefect"


def test_prefect_yaml_deploys_the_four_flows_on_the_right_pools():
    spec = yaml.safe_load((INFRA / "prefect.yaml").read_text())
    deps = {d["name"]: d for d in spec["deployments"]}
    flows = {}
    for d in deps.values():
        module, attr = d["entrypoint"].split(":")
        flows[d["name"]] = getattr(importlib.import_module(module.removesuffix(".py").replace("/", ".")), attr).name
    # The CLI addresses them as FLOW_NAME/DEPLOYMENT_NAME.
    assert {f"{flows[n]}/{n}" for n in deps} == {"pipeline/pipeline", "ablation-sweep/demo-lr", "ablation-sweep/sweep",
                                                 "nightly-eval/nightly", "probe/probe"}
    assert deps["nightly"]["schedules"][0]["cron"] == "{{ $RLVR_NIGHTLY_CRON }}"  # stack_env sets it
    assert (deps["pipeline"]["work_pool"]["name"] == deps["nightly"]["work_pool"]["name"] == deps["probe"]["work_pool"]["name"]
            == "{{ $RLVR_GPU_POOL }}")
    assert deps["demo-lr"]["work_pool"]["name"] == deps["sweep"]["work_pool"]["name"] == "{{ $RLVR_CPU_POOL }}"
    assert (ROOT / "configs" / "sweeps" / "demo_lr.yaml").is_file()


@pytest.mark.parametrize("name", ["process", "docker", "kubernetes"])
def test_job_templates_declare_every_placeholder(name):
    template = json.loads((INFRA / f"{name}-base-job-template.json").read_text())
    used = set(re.findall(r"\{\{\s*([a-z_]+)\s*\}\}", json.dumps(template["job_configuration"])))
    declared = set(template["variables"]["properties"])
    assert used and used <= declared, used - declared
    env = template["variables"]["properties"]["env"].get("default", {})
    assert env.get("PREFECT_FLOWS_HEARTBEAT_FREQUENCY") == "30"  # the lost-worker automation depends on it
    text = json.dumps(template)
    if name == "docker":
        assert '"Capabilities": [["gpu"]]' in text
    if name == "kubernetes":
        assert '"nvidia.com/gpu": "{{ gpus }}"' in text
