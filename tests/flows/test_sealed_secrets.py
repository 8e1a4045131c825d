"""Secrets in a config stay out of what Prefect stores and out of stage request files (flows/sealed.py,
tasks/stage_process.py); the flows and the stage process still run with the real values. (The whole pipeline,
a sweep and the nightly evaluation are checked end to end in tests/artifact_store/test_secrets_all_flows.py.)"""

from __future__ import annotations

import stat
import uuid

import pytest

from flows.sealed import sealed_flow
from rlvr_core.experiment.secrets import SecretUnavailable, seal

NAME = "RLVR_SECRET_CONFIG_TRACKING_TRACKING_URI"


@sealed_flow(name="sealed-echo", validate_parameters=False)
def echo(config: dict, overrides: dict | None = None) -> str:
    return config["tracking"]["tracking_uri"]


def test_prefect_stores_placeholders_and_the_flow_gets_the_secret(prefect_api):
    from prefect.client.orchestration import get_client

    uri = f"http://rlvr:{uuid.uuid4().hex}@mlflow.example:5000"
    for f in (echo, echo.with_options(name="sealed-echo-2")):  # with_options (`rlvr demo` uses it) keeps sealing
        state = f({"tracking": {"tracking_uri": uri}}, {"x": 1}, return_state=True)
        assert state.result() == uri  # the call itself gets the real value
        with get_client(sync_client=True) as client:
            stored = client.read_flow_run(state.state_details.flow_run_id).parameters
        assert stored == {"config": {"tracking": {"tracking_uri": "${secret:" + NAME + "}"}}, "overrides": {"x": 1}}


def test_resolve_config_takes_sealed_secrets_from_the_environment(monkeypatch):
    from flows.pipeline import resolve_config
    from rlvr_core.experiment.config import demo_config

    uri = "http://rlvr:hunter2@mlflow.example:5000"
    stored = {"config": seal(demo_config().resolved(), "config")[0],
              "overrides": seal({"tracking.tracking_uri": uri}, "overrides")[0]}
    with pytest.raises(SecretUnavailable, match="RLVR_SECRET_OVERRIDES_TRACKING_TRACKING_URI"):
        resolve_config(stored["config"], stored["overrides"], "<flow run parameters>")
    monkeypatch.setenv("RLVR_SECRET_OVERRIDES_TRACKING_TRACKING_URI", uri)
    assert resolve_config(stored["config"], stored["overrides"]).tracking.tracking_uri == uri


def test_request_files_are_private_sealed_and_gone_after_the_stage(tmp_path, rlvr_home):
    from rlvr_core.pipeline.child.errors import StageProcessError
    from rlvr_core.pipeline.child.protocol import write_request
    from tasks.stage_process import run_stage_process, tmp_root

    uri = f"http://rlvr:{uuid.uuid4().hex}@127.0.0.1:1"
    request = {"config": {"grpo": {"bogus": 1}, "tracking": {"tracking_uri": uri}}, "source": "trial.yaml"}
    secrets = write_request(tmp_path / "request.json", request)
    assert stat.S_IMODE((tmp_path / "request.json").stat().st_mode) == 0o600
    assert secrets == {NAME: uri} and uri not in (tmp_path / "request.json").read_text()
    # A stage whose config is invalid: the child resolved the secret (else its error would be SecretUnavailable)
    # and reports the config error; nothing of the stage's folder is left.
    with pytest.raises(StageProcessError) as e:
        run_stage_process("train", request)
    assert e.value.error_type == "rlvr_core.experiment.config.ConfigError" and "grpo.bogus" in str(e.value)
    assert uri not in str(e.value)
    assert list((rlvr_home / "tmp").iterdir()) == [] and tmp_root() == str(rlvr_home / "tmp")
