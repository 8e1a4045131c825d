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
                                                 "nightly-eval/nightly", "probe/probe", "pipeline/shared-stages"}
    assert deps["shared-stages"]["work_pool"]["name"] == "{{ $RLVR_CPU_POOL }}"
    assert deps["shared-stages"]["parameters"]["stop_after"] == "curriculum"
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


# ------------------------------------------------------------------ the cluster's two pools, through Prefect's checks
def _render(template: dict) -> dict:
    """The job a worker would submit with the pool's defaults: Prefect's own defaults pick-up and templating."""
    from prefect.utilities.templating import apply_values
    from prefect.workers.base import BaseJobConfiguration

    values = BaseJobConfiguration._get_base_config_defaults(template["variables"]["properties"])
    return apply_values(template["job_configuration"], {**values, "name": "run-1", "command": "python -m x"})


@pytest.mark.parametrize("kind", ["process", "docker", "kubernetes"])
@pytest.mark.parametrize("role", ["cpu", "gpu"])
def test_pool_templates_pass_prefects_validation(kind, role):
    from prefect.server.schemas.actions import WorkPoolCreate
    from prefect.utilities.schema_tools import validate

    from flows.pools import pool_template

    template = pool_template(kind, role)
    WorkPoolCreate(name=f"rlvr-{role}", type=kind, base_job_template=template)  # the server's own check
    defaults = {k: v["default"] for k, v in template["variables"]["properties"].items() if "default" in v}
    assert validate(defaults, template["variables"], raise_on_error=True, allow_none_with_default=True) == []
    broken = json.loads(json.dumps(template))
    broken["job_configuration"]["command"] = "{{ not_declared }}"
    with pytest.raises(ValueError, match="undeclared variable"):  # the check is live: it refuses a bad template
        WorkPoolCreate(name="bad", type=kind, base_job_template=broken)


def test_kubernetes_pools_request_gpus_on_gpu_nodes_and_share_one_credentials_secret():
    from flows.pools import pool_template

    jobs = {role: _render(pool_template("kubernetes", role))["job_manifest"]["spec"]["template"]["spec"]
            for role in ("cpu", "gpu")}
    for role, gpus in (("gpu", 1), ("cpu", 0)):
        [container] = jobs[role]["containers"]
        assert container["resources"]["requests"]["nvidia.com/gpu"] == gpus
        assert container["resources"]["limits"]["nvidia.com/gpu"] == gpus
        assert container["envFrom"] == [{"secretRef": {"name": "rlvr-credentials"}}]
        assert container["args"] == "python -m x"
    assert jobs["gpu"]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert jobs["cpu"]["nodeSelector"] == {"rlvr.io/pool": "cpu"}


def test_docker_pools_device_requests_are_what_docker_accepts():
    docker_types = pytest.importorskip("docker.types")
    from flows.pools import pool_template

    for role, want in (("gpu", [{"Driver": "nvidia", "Count": -1, "Capabilities": [["gpu"]]}]), ("cpu", [])):
        kwargs = _render(pool_template("docker", role))["container_create_kwargs"]
        host = docker_types.HostConfig(version="1.44", **kwargs)  # docker-py's own checks of these arguments
        assert [dict(r) for r in host["DeviceRequests"]] == [
            {"Driver": w["Driver"], "Count": w["Count"], "DeviceIDs": [], "Capabilities": w["Capabilities"],
             "Options": {}} for w in want]
        assert host["ShmSize"] == {"gpu": 16 * 1024 ** 3, "cpu": 1024 ** 3}[role]


def test_both_pools_are_created_on_a_real_prefect_api(prefect_api):
    import uuid

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    from flows.pools import pool_template

    with get_client(sync_client=True) as client:
        for role in ("cpu", "gpu"):
            name = f"rlvr-{role}-{uuid.uuid4().hex[:6]}"
            template = pool_template("kubernetes", role)
            client.create_work_pool(WorkPoolCreate(name=name, type="kubernetes", base_job_template=template))
            stored = client.read_work_pool(name).base_job_template
            assert stored["variables"]["properties"]["gpus"]["default"] == (1 if role == "gpu" else 0)


def test_pools_cli_writes_a_template_and_refuses_an_unknown_pool(capsys):
    from flows.pools import main

    assert main(["pools", "kubernetes", "cpu"]) == 0
    assert json.loads(capsys.readouterr().out)["variables"]["properties"]["gpus"]["default"] == 0
    assert main(["pools", "kubernetes", "tpu"]) == 2
    assert capsys.readouterr().err.strip() == "error: no pool 'kubernetes'/'tpu': kinds process, docker, kubernetes, roles cpu, gpu"
