"""Shared fixtures (an isolated RLVR_HOME per test, a real S3 API on 127.0.0.1, one temporary Prefect API per
test session) and how the suite is spread over pytest-xdist workers (docs/testing.md: the time budget)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rlvr_core.core.net import free_port

ROOT = Path(__file__).resolve().parent.parent

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Two computing workers share two cores: one torch/BLAS thread each (and in every process a test starts,
    # unless the test sets its own), instead of two threads per worker contending for the same cores. Set before
    # torch is imported: torch reads it once.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")

# DeepSpeed JIT-compiles its shared-memory all-reduce op the first time several processes train together (~50 CPU
# seconds). Every test and every process it starts shares one cache for it, the project's .rlvr/torch_extensions
# (the product's default is $RLVR_HOME/torch_extensions, one per test home), so a run compiles it once. Not a
# machine-wide folder: torch keys the build on its command, which holds the venv's path, so checkouts with
# different venvs sharing one folder rebuild it in turn.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".rlvr" / "torch_extensions"))

# Stacks the tests start deploy nightly-eval on its cron. The default (03:00 UTC) comes due whenever the suite runs
# around 03:00, and that run then shows up in (or collides with) the runs a test counts. Twelve hours from now
# never comes due within a test session; a test that wants the cron to fire passes its own.
os.environ.setdefault("RLVR_NIGHTLY_CRON", f"0 {(time.gmtime().tm_hour + 12) % 24} * * *")


def pytest_runtest_setup(item):
    """Tests marked `shared_data` read real benchmark files that are not part of the repository: a clone
    without them skips those tests and says where it looked, instead of failing on a missing file."""
    if item.get_closest_marker("shared_data"):
        from rlvr_core.experiment.benchmarks import data_root

        root = data_root()
        if not root.is_dir():
            pytest.skip(f"shared data not found at {root} (set RLVR_DATA_DIR)")


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module's tests, restored afterwards: what a test worker has under xdist (two
    workers share two cores), and what bounds that compare two orders of the same sums are measured at.
    Use with `pytestmark = pytest.mark.usefixtures("one_torch_thread")`."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory):
    """One temporary Prefect API (`prefect_test_harness`: a real server on a temporary SQLite database) for every
    test that runs flows in this process, started once per test session instead of once per test (each start is
    a server process and a database migration)."""
    os.environ.setdefault("PREFECT_HOME", str(tmp_path_factory.mktemp("prefect-home")))
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def demo_stage_cache(tmp_path_factory):
    """The demo's data and base-model stages, built once per test session for every xdist worker
    (tests/demo_stages.py): `demo_stage_cache.seed(home)` copies them into an RLVR_HOME's cache before a test
    runs the demo recipe there, so its runs find them cached instead of training the warm start again."""
    from tests.demo_stages import DemoStages

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the workers' common folder
    return DemoStages(shared / "demo-stages", lambda: tmp_path_factory.mktemp("demo-stages-own"))


@pytest.fixture
def rlvr_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "rlvr-home"
    monkeypatch.setenv("RLVR_HOME", str(home))
    for var in ("MLFLOW_TRACKING_URI", "RLVR_ARTIFACT_URI", "RLVR_WAREHOUSE", "RLVR_S3_ENDPOINT_URL"):
        monkeypatch.delenv(var, raising=False)
    return home


@pytest.fixture(scope="session")
def moto_endpoint():
    """A moto_server process serving the S3 API over HTTP on loopback, for the whole session."""
    exe = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or shutil.which("moto_server")
    if exe is None:
        pytest.fail("moto_server not installed (pip install 'moto[server]'); S3 tests need a real S3 API")
    port = free_port()
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            if proc.poll() is not None:
                pytest.fail("moto_server exited at start-up")
            time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("moto_server did not start within 60 s")
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture
def s3_env(moto_endpoint, monkeypatch):
    """Dummy credentials for moto; returns (endpoint_url, fresh bucket name)."""
    import uuid

    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    bucket = f"rlvr-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_endpoint).create_bucket(Bucket=bucket)
    return moto_endpoint, bucket


# ------------------------------------------------------------------ spreading the suite over xdist workers
# `make test` runs the suite on two computing pytest-xdist workers and a waiting one (`-n 3`, docs/testing.md).
# The scheduler below hands a worker a whole group at a time, so a group's module- and session-scoped fixtures
# are built once:
#   * by default a group is one test file;
#   * the files that use one of the expensive session fixtures form the fixture's group (SHARED_GROUPS), so
#     every test that reads the fixture runs on the worker that built it (once per run, not once per worker);
#   * a file in SPLIT_BY_TEST (no module or session fixtures, independent slow tests) is one group per test.
# (xdist's own `--dist loadgroup` cannot do this with pytest 9: it renames each test's node id to add the
# group, and pytest 9 derives node ids from a structured id that rename does not reach, so every test became
# its own group and module fixtures were built once per worker.)
SHARED_GROUPS = {
    "team_stack": ("tests/integration/test_mlflow_server_s3.py", "tests/integration/test_secrets.py"),
    "tiny_checkpoints": ("tests/eval/test_cli.py", "tests/eval/test_cli_inputs.py", "tests/eval/test_eval_limits.py",
                         "tests/eval/test_evaluator.py", "tests/eval/test_hub.py", "tests/eval/test_vllm_engine_stages.py"),
    "taught_engine": ("tests/environments/test_environments.py", "tests/environments/test_replay.py",
                      "tests/environments/test_trainer_environment.py", "tests/environments/test_eval_environment.py"),
    "sample_warehouse": ("tests/dashboards/test_dashboard_browser.py", "tests/dashboards/test_dashboard_queries.py",
                         "tests/dashboards/test_dashboard_signal.py", "tests/dashboards/test_report.py",
                         "tests/dashboards/test_runs_report.py"),
}
SPLIT_BY_TEST = ("tests/test_benchmarks.py",)
# The groups (or single tests of a split file) that take minutes, longest first, from the `--durations` table
# of a whole run: groups are handed out in this order, so the long ones start at once and the short ones fill
# in around them. A new slow file belongs here, or it may start last and leave one worker idle at the end.
# A worker is handed the next group when two tests or fewer are left of its current ones. The HumanEval check
# (80 s) goes before the stack e2e module, on the other worker than the vLLM pair: the stack's sweep then finds
# the demo's shared base model (demo_stage_cache), which the pair's worker builds first, ready instead of waiting
# idle for it.
SLOWEST_FIRST = (
    "tests/e2e/test_demo_vllm.py",                  # two demos, 10 GRPO steps each (~3-4 min)
    "tests/verifiers/test_humaneval_reference.py",
    "tests/flows/test_stack_e2e.py",                # Prefect stack, a 4-trial sweep, nightly runs, a lost worker
    "tests/e2e/test_demo.py",
    "tiny_checkpoints",
    "tests/test_benchmarks.py::test_bench_engines_smoke",
    "tests/grpo/test_micro_batches.py",
    "tests/grpo/test_determinism_under_load.py",
    "tests/grpo/test_multinode.py",                 # two torchrun "nodes": ZeRO-2/3 parity, a killed node's retry
    "tests/flows/test_two_workers.py",              # a Prefect server, two workers, two pipelines and a reference
    "tests/artifact_store/test_secrets_all_flows.py",
    "tests/integration/test_stack_lifecycle.py",
    "tests/grpo/test_trainer_vllm.py",
    "tests/grpo/test_vllm_server.py",               # one vllm serve (50-100 s to start), 4 short GRPO runs
    "tests/environments/test_vllm_multi_turn.py",   # vLLM in a subprocess (~40 s)
    "tests/artifact_store/test_prefect_runs_layout.py",
    "tests/test_benchmarks.py::test_bench_verifier_load_smoke",  # mostly waiting on pools and hangs (~70 s)
    "tests/test_benchmarks.py::test_bench_grpo_vs_trl_smoke",  # three arms on a 5-step smoke base (~40 s)
    "tests/eval/test_demo_bar.py",
    "tests/verifiers/test_verifier_peers.py",
    "tests/grpo/test_stage_resume.py",
    "tests/verifiers/test_verifier_peers_math.py",
    "team_stack",
    "tests/grpo/test_trainer_distributed.py",
    "tests/test_export.py",
    "tests/flows/test_probe_flow.py",
    "tests/core/test_numerics_portable.py",         # four warm starts of two steps, one process each (~75 s)
)


def xdist_group(nodeid: str) -> str:
    """The group a test runs in (see above), from its node id alone: the controller has no items."""
    path = nodeid.split("::", 1)[0]
    for name, files in SHARED_GROUPS.items():
        if path in files:
            return name
    return nodeid if path in SPLIT_BY_TEST else path


# Groups that mostly wait (on a cron minute, on a server's schedule) rather than compute. With three workers or
# more, the last one is their lane: it runs these and nothing else, beside the two that compute, so their waiting
# no longer holds one of the two cores' workers idle. Without such a worker, they go out like any other group.
WAITING_LANE = ("tests/integration/test_stack_lifecycle.py",)  # sleeps through two waits for a per-minute cron


@pytest.hookimpl(optionalhook=True)  # pytest without xdist (-p no:xdist) runs too
def pytest_xdist_make_scheduler(config, log):
    """xdist's scope scheduler (a worker takes a whole scope; scopes go out in collection order with
    `--no-loadscope-reorder`) with our groups as the scopes, and the waiting lane above."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid)

        def _lane(self):
            nodes = sorted(self.assigned_work, key=lambda n: int(n.gateway.id.removeprefix("gw")))
            return nodes[-1] if len(nodes) >= 3 else None

        def _assign_work_unit(self, node) -> None:
            """The next group for this node: the lane worker takes only waiting groups (and stops when none is
            left), the others take the rest, and a waiting group too once nothing else is left."""
            lane = self._lane()
            if lane is None:
                return super()._assign_work_unit(node)
            waiting = [scope for scope in self.workqueue if scope in WAITING_LANE]
            if node is lane:
                if not waiting:
                    node.shutdown()  # it finishes what it has first
                    return
                pick = waiting[0]
            else:
                rest = [scope for scope in self.workqueue if scope not in WAITING_LANE]
                pick = (rest or waiting)[0]
            self.workqueue.move_to_end(pick, last=False)
            super()._assign_work_unit(node)

    return GroupScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Slowest groups first (stable: a group's tests, and every file's, stay in order). Refuses a file that uses
    one of SHARED_GROUPS' session fixtures without being listed there: it would build the fixture again on the
    other worker."""
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        for name in SHARED_GROUPS:
            if name in item.fixturenames and path not in SHARED_GROUPS[name]:
                raise pytest.UsageError(f"{path} uses the session fixture {name!r}: add it to SHARED_GROUPS[{name!r}] "
                                        "in tests/conftest.py")
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}

    def order(item) -> int:
        group = xdist_group(item.nodeid)
        return rank.get(group, rank.get(item.nodeid.split("::", 1)[0], len(rank)))

    items.sort(key=order)
