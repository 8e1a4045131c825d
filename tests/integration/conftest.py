"""A real team stack on 127.0.0.1 for the integration tests, started the way users start it.

`rlvr stack up` (run as `python -m rlvr_cli.stack`, so the test does not depend on the CLI's
registration) starts the S3 server and `mlflow server` (sqlite backend, `--serve-artifacts` proxying to
s3://rlvr/mlflow on that S3); one tiny demo with two GRPO steps then runs through the real `rlvr` CLI
against it, with distinctive S3 credentials, an MLflow token and a password in the tracking URI, so
test_secrets.py can look for them everywhere the run left traces. Both test files share this one
session (stack start-up plus one demo is most of their time).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Distinctive values that appear nowhere unless something leaked them.
SECRETS = {
    "AWS_ACCESS_KEY_ID": "AKIALEAKCANARY7Q3Z",
    "AWS_SECRET_ACCESS_KEY": "s3cret-canary-Zx81qP0vLm",
    "MLFLOW_TRACKING_TOKEN": "tok-canary-9fK2mQ7wB4",
    "MLFLOW_TRACKING_PASSWORD_IN_URI": "pw-canary-Hq5tR1nY6",
}

TINY_DEMO = [
    "--set", "data.synthetic.n_train=200", "--set", "data.synthetic.n_test=20",
    "--set", "model.warm_start.steps=20", "--set", "passk.max_prompts=8", "--set", "passk.n_samples=2",
    "--set", "passk.ks=[1,2]", "--set", "eval.n_samples=2", "--set", "tracking.experiment=team-stack",
    "--set", "grpo.enabled=true", "--set", "grpo.steps=2", "--set", "grpo.prompts_per_step=2",
    "--set", "grpo.group_size=2", "--set", "grpo.checkpoint_every=2", "--set", "grpo.eval_every=2",
    "--set", "grpo.eval_samples=2",
    # A 20-step warm start rarely solves a prompt; keep unsolved ones so two GRPO steps have prompts to run.
    "--set", "passk.drop_never_solved=false",
]


def clean_env(home: Path) -> dict[str, str]:
    """The caller's environment without any MLflow/Prefect/RLVR/AWS settings, and RLVR_HOME=home."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PREFECT_", "RLVR_", "AWS_"))
           and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["RLVR_HOME"] = str(home)
    env.setdefault("OMP_NUM_THREADS", "1")
    # DeepSpeed's JIT-compiled op is compiled once per cache folder (~35 s): share the suite's (tests/conftest.py).
    env["TORCH_EXTENSIONS_DIR"] = os.environ["TORCH_EXTENSIONS_DIR"]
    return env


def stack_cmd(home: Path, *args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlvr_cli.stack", *args], env=clean_env(home), cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def team_stack(tmp_path_factory):
    """`rlvr stack up` on free ports, without Prefect; `down` at the end, and its processes checked gone."""
    import psutil

    home = tmp_path_factory.mktemp("stack-home")
    up = stack_cmd(home, "up", "--mlflow-port", "0", "--s3-port", "0", "--no-prefect", "--json")
    assert up.returncode == 0, up.stderr[-3000:]
    # Each service as it comes up, on stderr (stdout stays the JSON): `up` is not silent for its 10-40 s.
    said = [line.strip() for line in up.stderr.splitlines()]
    for what in ("starting S3, MLflow", "S3 answering on http://127.0.0.1:", "MLflow answering on http://127.0.0.1:"):
        assert any(line.startswith(what) and line.endswith(" s)") for line in said), (what, up.stderr[-3000:])
    state = json.loads(up.stdout.strip().splitlines()[-1])
    try:
        yield home, state
    finally:
        down = stack_cmd(home, "down")
        assert down.returncode == 0, down.stderr
        for name in ("mlflow", "s3"):
            pid = state[name]["pid"]
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, \
                f"{name} (pid {pid}) still running after `rlvr stack down`"


@pytest.fixture(scope="session")
def stack_demo(team_stack):
    """One tiny demo (with 2 GRPO steps) through the `rlvr` CLI against the stack, secrets set."""
    home, state = team_stack
    env = clean_env(home)
    env.update(state["env"])
    mlflow_url = state["env"]["MLFLOW_TRACKING_URI"]
    env.update({k: v for k, v in SECRETS.items() if k != "MLFLOW_TRACKING_PASSWORD_IN_URI"})
    # Credentials inside the tracking URI are accepted by MLflow (basic auth); they must never be recorded.
    env["MLFLOW_TRACKING_URI"] = mlflow_url.replace(
        "http://", f"http://rlvr:{SECRETS['MLFLOW_TRACKING_PASSWORD_IN_URI']}@")
    env["MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL"] = "1"  # a tiny run still gets system metrics
    proc = subprocess.run([str(Path(sys.executable).parent / "rlvr"), "demo", "--json", *TINY_DEMO], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # stdout is the JSON line only (MLflow's "View run … at <URI>" prints would land here).
    *before, line = proc.stdout.strip().splitlines()
    assert not [b for b in before if "://" in b], before[-20:]
    summary = json.loads(line)
    return {"home": home, "state": state, "summary": summary, "stdout": proc.stdout, "stderr": proc.stderr,
            "mlflow": mlflow_url, "s3": state["env"]["RLVR_S3_ENDPOINT_URL"]}


def s3_client(endpoint: str):
    """A boto3 client with the stack's own (dummy) credentials: moto accepts any."""
    import boto3

    from rlvr_core.pipeline.stack import LOCAL_S3_KEY, LOCAL_S3_SECRET

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=LOCAL_S3_KEY,
                        aws_secret_access_key=LOCAL_S3_SECRET, region_name="us-east-1")


@pytest.fixture(scope="session")
def canaries() -> dict[str, str]:
    return dict(SECRETS)


@pytest.fixture(scope="session")
def bucket(stack_demo):
    return s3_client(stack_demo["s3"])


@pytest.fixture(scope="session")
def stack_cli():
    """`rlvr stack …` as a function: stack_cli(home, "status", "--json")."""
    return stack_cmd


@pytest.fixture(scope="session")
def env_for():
    """clean_env as a function, for tests that start their own subprocesses."""
    return clean_env
