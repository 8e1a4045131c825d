"""The retry policy on real exception types, a real stage subprocess, and real Prefect retries."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rlvr_core.experiment.config import ConfigError
from rlvr_core.pipeline.child.death import killed_by_signal
from rlvr_core.pipeline.child.errors import StageProcessError
from rlvr_core.pipeline.child.transient import is_transient


def _s3_client_error(code: str, status: int):
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": "x"}, "ResponseMetadata": {"HTTPStatusCode": status}},
                       "PutObject")


def test_transient_failures_are_retried():
    from botocore.exceptions import EndpointConnectionError

    for exc in (ConnectionResetError(errno.ECONNRESET, "reset"), BrokenPipeError(), TimeoutError("lock"),
                socket.timeout("read"), EndpointConnectionError(endpoint_url="http://127.0.0.1:1"),
                _s3_client_error("SlowDown", 503), _s3_client_error("InternalError", 500),
                RuntimeError("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4)"),
                StageProcessError("killed", transient=True, returncode=-9)):
        assert is_transient(exc), repr(exc)


def test_deterministic_failures_are_not_retried():
    import torch

    from rlvr_core.experiment.guards import GuardError

    for exc in (ConfigError("c.yaml", [("grpo.lr", "bad")]), GuardError("G-logprob-temp"), ValueError("bad"),
                KeyError("answer"), TypeError("verifier bug"), FileNotFoundError("x"),
                torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                RuntimeError("CUDA error: out of memory"), MemoryError(), _s3_client_error("AccessDenied", 403),
                _s3_client_error("NoSuchBucket", 404), RuntimeError("something we have never seen"),
                StageProcessError("bad config", transient=False, returncode=1)):
        assert not is_transient(exc), repr(exc)


def test_killed_by_signal_from_a_real_process():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    p.send_signal(signal.SIGKILL)
    assert killed_by_signal(p.wait()) and not killed_by_signal(0) and not killed_by_signal(1)
    assert killed_by_signal(137) and killed_by_signal(143)


def test_stage_process_reports_a_deterministic_failure(tmp_path, rlvr_home):
    """A bad config inside the child comes back as a StageProcessError the policy does not retry."""
    from tasks.stage_process import run_stage_process

    with pytest.raises(StageProcessError) as e:
        run_stage_process("train", {"config": {"grpo": {"bogus": 1}}, "source": "trial.yaml"})
    assert e.value.transient is False and e.value.error_type.endswith("ConfigError")
    assert "trial.yaml: grpo.bogus: unknown key" in str(e.value)


@pytest.mark.slow
def test_prefect_retries_transient_and_not_deterministic(prefect_api, rlvr_home):
    """Real Prefect (temporary server): the condition decides, attempts are counted."""
    from prefect import flow, task

    from tasks.retry import retry_condition_fn

    calls = {"flaky": 0, "broken": 0}

    @task(retries=3, retry_delay_seconds=0, retry_condition_fn=retry_condition_fn)
    def flaky() -> str:
        calls["flaky"] += 1
        if calls["flaky"] < 3:
            raise ConnectionResetError(errno.ECONNRESET, "S3 connection reset")
        return "ok"

    @task(retries=3, retry_delay_seconds=0, retry_condition_fn=retry_condition_fn)
    def broken() -> None:
        calls["broken"] += 1
        raise KeyError("answer")  # a verifier bug: would fail again

    @flow
    def f() -> str:
        out = flaky()
        broken()
        return out

    with pytest.raises(KeyError):
        f()
    assert calls == {"flaky": 3, "broken": 1}


def test_out_of_memory_is_deterministic_and_says_what_to_lower():
    """A real CPU allocation failure (torch's allocator refuses 4 EiB at once, touching no memory) and a CUDA
    OOM are not retried, and the stage child's report ends with the G-oom line naming the settings."""
    import torch

    from dataclasses import asdict

    from rlvr_core.pipeline.child.protocol import ChildFailure

    def failure_report(stage, exc):  # the stage child's report of `exc`
        return asdict(ChildFailure.of(exc, stage))

    with pytest.raises(RuntimeError) as cpu:
        torch.empty(2 ** 62, dtype=torch.uint8)
    for exc in (cpu.value, torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")):
        report = failure_report("train", exc)
        assert report["transient"] is False, repr(exc)
        last = report["traceback"].strip().splitlines()[-1]
        assert last.startswith("G-oom: the train stage ran out of memory"), last
        for setting in ("grpo.memory.micro_batch_size", "grpo.memory.max_tokens_per_micro_batch",
                        "sampling.max_new_tokens", "grpo.memory.gradient_checkpointing"):
            assert setting in last
    assert "G-oom" not in failure_report("train", KeyError("answer"))["traceback"]
    evaluation = failure_report("evaluate", cpu.value)["traceback"].strip().splitlines()[-1]
    assert "sampling.batch_size" in evaluation and "grpo." not in evaluation  # evaluation has no micro-batches


def test_out_of_memory_in_process_says_what_to_lower_too():
    """`rlvr demo` runs its stages in this process: a real CPU allocation failure there ends the same way."""
    import torch

    from tasks.stages import oom_says_what_to_lower

    with pytest.raises(Exception) as e, oom_says_what_to_lower("train"):
        torch.empty(2 ** 62, dtype=torch.uint8)
    assert not is_transient(e.value) and "can't allocate memory" in str(e.value)
    assert str(e.value).splitlines()[-1].startswith("G-oom: the train stage ran out of memory")
    with pytest.raises(KeyError), oom_says_what_to_lower("train"):
        raise KeyError("answer")  # anything else passes through as it was


def test_oom_kill_counter_is_read_from_this_machines_cgroup():
    """Where this machine exposes a memory cgroup, its `oom_kill` counter is found and is a count."""
    from rlvr_core.pipeline.child.death import oom_counter_files, oom_kill_count

    readable = [f for f in oom_counter_files() if os.access(f, os.R_OK)]
    if not readable:
        pytest.skip(f"no readable memory cgroup counter here (looked at {oom_counter_files()})")
    assert isinstance(oom_kill_count(), int) and oom_kill_count() >= 0


class _Kernel:
    """Plays the kernel for the children of this process whose command line holds `marker` (a stage child by
    default): SIGKILLs each as soon as it appears (at most `kills` of them), first raising the cgroup's `oom_kill`
    counter in `counter` when `oom` (what the OOM killer does), or leaving it alone (a pre-emption)."""

    def __init__(self, counter: Path, *, oom: bool, kills: int, marker: str = "rlvr_core.pipeline.child.stage"):
        self.counter, self.oom, self.kills, self.marker = counter, oom, kills, marker
        self.killed: list[int] = []
        self.seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> "_Kernel":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        import psutil

        while not self._stop.wait(0.05):
            for child in psutil.Process().children(recursive=True):
                try:
                    if child.pid in self.seen or self.marker not in child.cmdline():
                        continue
                except psutil.Error:
                    continue
                self.seen.add(child.pid)
                if len(self.killed) < self.kills:
                    if self.oom:
                        n = int(self.counter.read_text().split("oom_kill ")[1])
                        self.counter.write_text(f"oom 1\noom_kill {n + 1}\n")
                    child.kill()
                    self.killed.append(child.pid)


def _killed_training(prefect_api, tmp_path, monkeypatch, *, oom: bool):
    """The real `grpo-train` task (its stage child) inside a task with the sweep trial's retry options, under a
    real Prefect API; the first child is SIGKILLed. Returns (error, kernel, trial attempts, Prefect task runs)."""
    from prefect import flow, task
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.ablation_sweep import TRIAL_RETRY
    from rlvr_core.experiment.config import parse_config
    from rlvr_core.pipeline import stages
    from tasks import stages as t

    counter = tmp_path / "memory.events"
    counter.write_text("oom 0\noom_kill 0\n")
    monkeypatch.setenv("RLVR_OOM_KILL_FILE", str(counter))
    missing = str(tmp_path / "missing")  # a child that is not killed fails on these: deterministic, not retried
    data = stages.DataArtifact(missing, missing, "d", "d", 1, 1, False)
    base = stages.ModelArtifact(missing, "base", "m", "t", False)
    cur = stages.CurriculumArtifact(missing + ".parquet", "c", 1, False)
    attempts = []

    @task(name="trial", **TRIAL_RETRY)
    def trial() -> None:
        attempts.append(1)
        t.train(parse_config({}), data, base, cur)

    @flow
    def sweep() -> None:
        trial()

    with _Kernel(counter, oom=oom, kills=1) as kernel:
        state = sweep(return_state=True)
    with pytest.raises(StageProcessError) as e:
        state.result()
    only_this_run = FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id]))
    with get_client(sync_client=True) as client:
        for _ in range(60):  # the server records task-run states from events, a moment after they happen
            runs = {r.name.rsplit("-", 1)[0]: r for r in client.read_task_runs(flow_run_filter=only_this_run)}
            if runs.keys() == {"trial", "grpo-train"} and all(r.state and r.state.is_final() for r in runs.values()):
                break
            time.sleep(0.5)
    return e.value, kernel, len(attempts), runs


def test_kernel_oom_kill_fails_the_stage_once_and_no_outer_layer_retries_it(prefect_api, rlvr_home, tmp_path,
                                                                              monkeypatch):
    err, kernel, trial_attempts, runs = _killed_training(prefect_api, tmp_path, monkeypatch, oom=True)
    assert err.transient is False and err.error_type == "OOMKilled" and err.returncode == -signal.SIGKILL
    assert "killed by the kernel's OOM killer (the memory cgroup's oom_kill count went 0 -> 1)" in str(err)
    assert str(err).splitlines()[-1].startswith("G-oom: the train stage ran out of memory")
    assert len(kernel.seen) == 1 and trial_attempts == 1  # one stage process, one trial: nothing nested
    assert runs["grpo-train"].run_count == 1 and runs["trial"].run_count == 1
    assert runs["grpo-train"].state.is_failed() and runs["trial"].state.is_failed()


def test_a_kill_without_oom_evidence_is_retried_by_the_stage_alone(prefect_api, rlvr_home, tmp_path, monkeypatch):
    """A pre-emption-like SIGKILL (the counter did not move) is transient: the stage task runs again (its second
    child fails on the missing inputs, deterministic); the trial around it still runs once."""
    err, kernel, trial_attempts, runs = _killed_training(prefect_api, tmp_path, monkeypatch, oom=False)
    assert len(kernel.killed) == 1 and len(kernel.seen) == 2 and trial_attempts == 1
    assert err.transient is False and "G-oom" not in str(err) and "FileNotFoundError" in str(err)
    assert runs["grpo-train"].run_count == 2 and runs["trial"].run_count == 1


def test_the_trial_layer_relaunches_only_a_crashed_flow_run(prefect_api, rlvr_home):
    """With the trial's retry options (real Prefect): a stage failure that was transient, after the stage's own
    retries, reaches the trial and is not retried there; a crashed flow run (a lost worker) is launched again."""
    from prefect import flow, task

    from flows.ablation_sweep import TRIAL_RETRY
    from tasks.retry import FlowRunCrashed

    calls = {"stage_gave_up": 0, "crashed_once": 0}
    options = {**TRIAL_RETRY, "retry_delay_seconds": 0, "retry_jitter_factor": None}

    @task(**options)
    def stage_gave_up() -> None:
        calls["stage_gave_up"] += 1
        raise StageProcessError("train process 1 exited with status -9 without a result", transient=True,
                                returncode=-9)

    @task(**options)
    def crashed_once() -> str:
        calls["crashed_once"] += 1
        if calls["crashed_once"] == 1:
            raise FlowRunCrashed("trial t00 crashed: worker lost (flow run x)")
        return "ok"

    @flow
    def sweep() -> str:
        out = crashed_once()
        stage_gave_up()
        return out

    with pytest.raises(StageProcessError):
        sweep()
    assert calls == {"stage_gave_up": 1, "crashed_once": 2}


def test_a_probe_child_killed_by_the_oom_killer_is_g_oom_and_not_retried(prefect_api, rlvr_home, tmp_path,
                                                                        monkeypatch):
    """The probe flow's real `probe-analysis` task (its `rlvr probe` child) under a real Prefect API: the child
    is SIGKILLed while the cgroup's `oom_kill` count rises. Like a stage's, that is the kernel's OOM killer: one
    attempt, ending with the G-oom line, not retried."""
    from prefect import flow

    from flows.probe import run_analysis

    counter = tmp_path / "memory.events"
    counter.write_text("oom 0\noom_kill 0\n")
    monkeypatch.setenv("RLVR_OOM_KILL_FILE", str(counter))
    missing = str(tmp_path / "missing")  # a child that is not killed fails on these: deterministic

    @flow
    def probe_only():
        return run_analysis("report", missing, [missing], str(tmp_path / "out"), {}, None, None)

    with _Kernel(counter, oom=True, kills=1, marker="rlvr_cli.probe") as kernel:
        state = probe_only(return_state=True)
    with pytest.raises(StageProcessError) as e:
        state.result()
    assert len(kernel.killed) == 1 and len(kernel.seen) == 1  # one child: the task was not retried
    assert e.value.transient is False and e.value.error_type == "OOMKilled" and e.value.returncode == -signal.SIGKILL
    assert "killed by the kernel's OOM killer (the memory cgroup's oom_kill count went 0 -> 1)" in str(e.value)
    assert str(e.value).splitlines()[-1].startswith("G-oom: the probe stage ran out of memory")


def test_a_child_that_hangs_with_its_output_open_is_stopped_at_its_time_limit(tmp_path):
    """A real child that prints a line and then hangs, its output still open: `run_child` stops it at its time
    limit (the wait does not wait for the output to close), and the stage's verdict is a timeout, not retried."""
    from rlvr_core.pipeline.child.run import child_env, run_child, stage_verdict

    lines: list[str] = []
    cmd = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(120)"]
    t0 = time.monotonic()
    outcome = run_child("train", cmd, child_env(), timeout_s=3, log=lines.append)
    assert time.monotonic() - t0 < 15 and outcome.timed_out and outcome.returncode == -signal.SIGKILL
    assert outcome.tail == ["started"] and "train: started" in lines
    with pytest.raises(StageProcessError) as e:
        stage_verdict("train", outcome, tmp_path / "result.json", 3)
    assert e.value.kind == "timeout" and not is_transient(e.value) and "time limit of 3 s" in str(e.value)


def test_a_stage_childs_lines_reach_the_prefect_run_log(prefect_api, rlvr_home):
    """`run_child` reads the child's output on a thread of its own (so its time limit works): each line still
    reaches the task run's log on the Prefect API, as the stage's did when it was read on the task's thread."""
    from prefect import flow, get_run_logger, task
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    from rlvr_core.pipeline.child.run import child_env, run_child

    @task
    def stage() -> int:
        cmd = [sys.executable, "-c", "print('line one'); print('line two')"]
        return run_child("train", cmd, child_env(), log=get_run_logger().info).returncode

    @flow
    def one_stage() -> int:
        return stage()

    state = one_stage(return_state=True)
    assert state.result() == 0
    only = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[state.state_details.flow_run_id]))
    with get_client(sync_client=True) as client:
        for _ in range(60):  # the API receives logs in batches, a moment after they are written
            messages = [log.message for log in client.read_logs(log_filter=only)]
            if "train: line two" in messages:
                break
            time.sleep(0.5)
    assert "train: line one" in messages and "train: line two" in messages


def test_a_childs_verdict_survives_pickling():
    """Prefect may pickle a failed task's exception: the verdict (transient, kind, exit status) comes back."""
    import pickle

    from rlvr_core.pipeline.launch import GroupFailure

    for err in (StageProcessError("train process 1 exited with status -9", transient=True, returncode=-9,
                                  kind="killed"),
                GroupFailure("grpo: node 1 of 2 exited with signal SIGKILL", transient=False, error_type="OOMKilled",
                             kind="oom")):
        back = pickle.loads(pickle.dumps(err))
        assert (type(back), str(back), back.transient, back.returncode, back.error_type, back.kind) == \
            (type(err), str(err), err.transient, err.returncode, err.error_type, err.kind)
        assert is_transient(back) is err.transient
