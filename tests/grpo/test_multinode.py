"""The training stage as a group of "nodes" (`grpo.launch.mode: torchrun`, rlvr_core/pipeline/launch.py): two
`torch.distributed.run --nnodes 2 --node_rank i --nproc_per_node 1` processes on 127.0.0.1 (static rendezvous
on loopback, gloo), each the agent of one rank.

* Under ZeRO-2 and ZeRO-3 the group's trained weights are one process's (same folder key, other home), within
  the 1e-5 that test_trainer_distributed.py holds N ranks to.
* SIGKILLing one node's agent fails the stage as transient (the Prefect retry rule's verdict); the real
  `grpo-train` task's retry relaunches both nodes at another thread count, and they resume from the checkpoint:
  every step once in steps.parquet, the thread change recorded from that step.
* A node SIGKILLed while the memory cgroup's OOM-kill counter goes up (what the kernel's OOM killer does) fails
  the group with G-oom, not transient, so the `grpo-train` task's retry rule does not relaunch it
  (`rlvr_core.pipeline.child`); the same kill with the counter unchanged is a lost node, transient.
* `grpo.launch.mode: deepspeed`: a hostfile of two loopback hosts, one `deepspeed.launcher.launch` per node, trains
  the same weights under ZeRO-2; a SIGKILLed node 1 fails the group naming it; a bad hostfile is one error
  naming the file and line.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest

from test_stage_resume import _inputs
from grpo_helpers import model_params

from rlvr_core.experiment.config import parse_config
from rlvr_core.pipeline import stages
from rlvr_core.pipeline.launch import GroupFailure, node_commands
from rlvr_core.pipeline.child.transient import is_transient

pytestmark = pytest.mark.usefixtures("one_torch_thread")
# grpo.launch of a two-node torchrun group on this host.
TWO_NODES = {"mode": "torchrun", "nnodes": 2, "nproc_per_node": 1, "rdzv_endpoint": "127.0.0.1:0"}


def _with(cfg, **grpo):
    d = cfg.resolved()
    return parse_config({**d, "grpo": {**d["grpo"], **grpo}}, "<multinode test>")


def _two_hosts(tmp_path: Path) -> dict:
    """`grpo.launch.mode: deepspeed` over a hostfile of two loopback "hosts"; node 1 starts here (no node_command)."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# two loopback nodes\n127.0.0.1 slots=1\n\nlocalhost slots=1\n")
    return {**TWO_NODES, "mode": "deepspeed", "hostfile": str(hostfile)}


@pytest.fixture(scope="module")
def one_process_runs(tmp_path_factory) -> tuple[Path, dict]:
    """The one-process reference trainings, one per ZeRO stage, each in a home of its own: the torchrun and the
    deepspeed launch of ZeRO-2 compare against the same run (same config, same inputs: the same folder key)."""
    return tmp_path_factory.mktemp("one-process-homes"), {}


@pytest.mark.slow
@pytest.mark.parametrize("launch,zero", [("torchrun", 2), ("torchrun", 3), ("deepspeed", 2)])
def test_two_nodes_train_like_one_process(tiny, rlvr_home, tmp_path, monkeypatch, launch, zero, one_process_runs):
    cfg, data, base, cur = _inputs(tiny, tmp_path)
    cfg = _with(cfg, steps=2, lr=1e-3, checkpoint_every=1, zero_stage=zero)
    group = stages.train_stage(_with(cfg, launch=TWO_NODES if launch == "torchrun" else _two_hosts(tmp_path)),
                               data, base, cur)
    if launch == "deepspeed":  # node 1 ran under DeepSpeed's per-node launcher as global rank 1
        assert "'localhost': [1]" in (Path(group.folder) / "launch" / "node1.log").read_text()
        assert group.summary["numerics"]["grpo.launch"] == "deepspeed"
    homes, runs = one_process_runs
    if zero not in runs:
        monkeypatch.setenv("RLVR_HOME", str(homes / f"zero{zero}"))
        runs[zero] = stages.train_stage(cfg, data, base, cur)
    one = runs[zero]
    # Same inputs, same key: the launch settings are recorded, not keyed.
    assert Path(group.folder).name == Path(one.folder).name and group.folder != one.folder
    assert group.summary["numerics"]["grpo.nnodes"] == 2 and one.summary["numerics"]["grpo.nnodes"] == 1
    a, b = pq.read_table(one.steps_path).to_pylist(), pq.read_table(group.steps_path).to_pylist()
    assert [r["step"] for r in b] == [1, 2]
    for ra, rb in zip(a, b):
        assert rb["reward_mean"] == ra["reward_mean"] and rb["n_tokens"] == ra["n_tokens"]
        assert rb["loss"] == pytest.approx(ra["loss"], rel=1e-5, abs=1e-5)
    wa, wb = model_params(one.model.path), model_params(group.model.path)
    diff = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
    assert diff < 1e-5, f"ZeRO-{zero}: two nodes' weights differ from one process's by {diff}"
    assert max(float(w.abs().max()) for w in (wa[k] - model_params(base.path)[k] for k in wa)) > 1e-4  # it trained


def test_node_commands_start_remote_nodes_through_the_prefix(tmp_path):
    cfg = parse_config({"grpo": {"launch": {**TWO_NODES, "nnodes": 3, "nproc_per_node": 8,
                                            "rdzv_endpoint": "10.0.0.5:29500",
                                            "node_command": "ssh -o BatchMode=yes {host}", "hosts": ["gpu-b", "gpu-c"]}}},
                       "<t>")
    cmds = node_commands(cfg.grpo, tmp_path / "request.json", 29500)
    assert cmds[0][1:4] == ["-m", "torch.distributed.run", "--nnodes"]  # node 0 runs here, no prefix
    assert [c[:4] for c in cmds[1:]] == [["ssh", "-o", "BatchMode=yes", "gpu-b"], ["ssh", "-o", "BatchMode=yes", "gpu-c"]]
    for i, c in enumerate(cmds):
        flags = dict(zip(c[c.index("--nnodes"):-3:2], c[c.index("--nnodes") + 1:-3:2]))
        assert flags == {"--nnodes": "3", "--node_rank": str(i), "--nproc_per_node": "8",
                         "--master_addr": "10.0.0.5", "--master_port": "29500"}
    with pytest.raises(ValueError, match="hosts needs nnodes - 1 = 2 entries"):
        parse_config({"grpo": {"launch": {**TWO_NODES, "nnodes": 3, "node_command": "ssh {host}", "hosts": ["a"]}}},
                     "<t>")


def _kill_node_one_after_a_checkpoint(home: Path, stop: threading.Event, killed: list) -> None:
    """SIGKILL node 1's torchrun agent once the group has saved a checkpoint; the retry then gets 2 threads."""
    while not stop.wait(0.05):
        if list((home / "cache" / "grpo").glob("*/checkpoints/latest")):
            [pid_file] = (home / "cache" / "grpo").glob("*/launch/node1.pid")
            pid = int(pid_file.read_text())
            os.environ["RLVR_STAGE_THREADS"] = "2"  # the retry's host has another thread count
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            return


@pytest.mark.slow
def test_a_killed_node_fails_the_stage_and_the_retry_resumes_both(tiny, rlvr_home, tmp_path, monkeypatch,
                                                                   prefect_api):
    from prefect import flow

    from tasks import stages as t

    steps = 20  # ~0.1 s each: the kill lands a few steps after the first checkpoint
    cfg, data, base, cur = _inputs(tiny, tmp_path)
    cfg = _with(cfg, steps=steps, lr=1e-3, checkpoint_every=2, zero_stage=2, launch=TWO_NODES)
    monkeypatch.setenv("RLVR_STAGE_THREADS", "1")
    counter = tmp_path / "memory.events"
    counter.write_text("oom_kill 0\n")  # the kill below is a lost node, not the OOM killer
    monkeypatch.setenv("RLVR_OOM_KILL_FILE", str(counter))
    stop, killed = threading.Event(), []
    threading.Thread(target=_kill_node_one_after_a_checkpoint, args=(rlvr_home, stop, killed), daemon=True).start()

    @flow
    def train_only():
        return t.train(cfg, data, base, cur, return_state=True)

    t0 = time.monotonic()
    try:
        state = train_only()
    finally:
        stop.set()
    assert killed, "node 1 was never killed"
    assert not psutil.pid_exists(killed[0]) or psutil.Process(killed[0]).status() == psutil.STATUS_ZOMBIE
    trained = state.result()
    summary = trained.summary
    at = summary["resumed_from_step"]
    assert 2 <= at < steps, at
    assert [r["step"] for r in pq.read_table(trained.steps_path).to_pylist()] == list(range(1, steps + 1))
    [change] = summary["numerics_changes"]
    assert change["from_step"] == at
    assert (change["before"]["torch_threads"], change["after"]["torch_threads"]) == (1, 2)
    assert summary["numerics"]["grpo.nnodes"] == 2
    [failure] = [json.loads(line) for line in (Path(trained.folder) / "launch" / "failures.jsonl").open()]
    assert failure["message"].startswith("grpo: node 1 of 2 exited with signal SIGKILL"), failure
    assert failure["transient"]
    print(f"node 1 killed after step {at}; both relaunched and finished in {time.monotonic() - t0:.1f} s")


def test_a_node_killed_while_the_oom_counter_rises_is_g_oom_and_any_other_kill_is_transient(tmp_path, monkeypatch):
    """The launcher's wait and verdict over real node processes (sleepers): a node SIGKILLed while the cgroup's
    `oom_kill` count rises fails the group as G-oom, not transient; the same kill with the count unchanged is a
    lost node, transient. The kernel's OOM killer is stood in for, honestly but not for real: a child that
    allocates until the kernel kills it would take the test machine's memory with it, and no test may set up a
    cgroup; so the test raises the count of a cgroup `memory.events` file that `RLVR_OOM_KILL_FILE` points the
    launcher at, then SIGKILLs the node. Before `rlvr_core.pipeline.child`, the launcher called this kill a lost
    node: transient, retried."""
    import subprocess
    import sys

    from rlvr_core.pipeline import launch
    from rlvr_core.pipeline.child.death import oom_kill_count

    monkeypatch.setattr(launch, "GRACE_S", 0.2)  # the sleepers would not report an error of their own anyway
    counter = tmp_path / "memory.events"
    monkeypatch.setenv("RLVR_OOM_KILL_FILE", str(counter))
    verdicts = {}
    for oom in (True, False):
        counter.write_text("oom 0\noom_kill 0\noom_group_kill 0\n")
        work = tmp_path / f"launch-{oom}"
        work.mkdir()
        before = oom_kill_count()
        nodes = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
                 for _ in range(2)]
        if oom:
            counter.write_text("oom 1\noom_kill 1\noom_group_kill 0\n")
        nodes[1].send_signal(signal.SIGKILL)
        with pytest.raises(GroupFailure) as e:
            launch._wait_group(nodes, work, before)
        assert all(p.returncode is not None for p in nodes)  # the whole group was stopped
        verdicts[oom] = e.value
        [failure] = [json.loads(line) for line in (work / launch.FAILURES).open()]
        assert failure["transient"] is e.value.transient
    assert not is_transient(verdicts[True]) and verdicts[True].error_type == "OOMKilled"
    assert str(verdicts[True]).startswith("grpo: node 1 of 2 exited with signal SIGKILL")
    assert str(verdicts[True]).splitlines()[-1].startswith("G-oom: the train stage ran out of memory")
    assert is_transient(verdicts[False]) and "G-oom" not in str(verdicts[False])


def _nodes(*scripts: list[str]) -> list:
    import subprocess

    return [subprocess.Popen(cmd, start_new_session=True) for cmd in scripts]


def test_every_node_exiting_0_without_a_result_is_deterministic(tmp_path, monkeypatch):
    """Every node (real processes) exits with status 0 and rank 0 wrote no result: no node was lost, no rank
    reported an error, so it is a bug, which a retry on every node would repeat. Not transient."""
    import sys

    from rlvr_core.pipeline import launch

    monkeypatch.setattr(launch, "GRACE_S", 0.2)
    nodes = _nodes(*[[sys.executable, "-c", "pass"]] * 2)
    with pytest.raises(GroupFailure) as e:
        launch._wait_group(nodes, tmp_path, None)
    assert [p.returncode for p in nodes] == [0, 0]
    assert str(e.value).startswith("grpo: every node exited with status 0 but rank 0 wrote no result")
    assert not is_transient(e.value)
    [failure] = [json.loads(line) for line in (tmp_path / launch.FAILURES).open()]
    assert failure["transient"] is False


def test_a_rank_failing_before_its_first_line_is_its_own_deterministic_error(tmp_path, monkeypatch):
    """A real rank process (the rank module of the group's node command, run as node 0) whose request holds a
    sealed secret its node's environment lacks: it fails while reading the request, before any line of its
    own. That is the rank's own error, named in the group's failure and not retried, not a lost node."""
    import sys

    from rlvr_core.pipeline import launch
    from rlvr_core.pipeline.child.protocol import write_request

    monkeypatch.setattr(launch, "GRACE_S", 0.2)
    request = tmp_path / "request.json"
    config = {"grpo": {"launch": TWO_NODES}, "tracking": {"password": "on-the-stage-host-only"}}
    secrets = write_request(request, {"config": config, "launcher_pid": os.getpid(), "threads": 1})
    assert secrets and not any(name in os.environ for name in secrets)  # the node's environment lacks them
    rank_module = node_commands(parse_config({"grpo": {"launch": TWO_NODES}}).grpo, request, 29500)[0][-2:]
    nodes = _nodes([sys.executable, "-m", *rank_module])
    with pytest.raises(GroupFailure) as e:
        launch._wait_group(nodes, tmp_path, None)
    assert nodes[0].returncode == 1
    assert "SecretUnavailable" in str(e.value) and "RLVR_SECRET_" in str(e.value)
    assert not is_transient(e.value)


def test_a_lost_node_is_transient_and_a_ranks_own_error_is_not():
    lost = GroupFailure("grpo: node 1 of 2 exited with signal SIGKILL", transient=True)
    guard = GroupFailure("grpo: node 0 of 2 exited with status 1\nrank 0: GuardError: ...", transient=False)
    assert is_transient(lost) and not is_transient(guard)


def test_deepspeed_nodes_are_the_hostfiles_hosts_in_its_order(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("gpu-a slots=8\ngpu-b slots=8  # DeepSpeed ignores what follows the slots\ngpu-c slots=8\n")
    cfg = parse_config({"grpo": {"launch": {"mode": "deepspeed", "hostfile": str(hostfile), "nnodes": 2,
                                            "nproc_per_node": 8, "exclude": "gpu-b", "rdzv_endpoint": "10.0.0.5:29500",
                                            "node_command": "ssh -o BatchMode=yes {host}"}}}, "<t>")
    cmds = node_commands(cfg.grpo, tmp_path / "request.json", 29500)
    assert cmds[0][1:3] == ["-m", "deepspeed.launcher.launch"]  # node 0 runs here, no prefix
    assert cmds[1][:4] == ["ssh", "-o", "BatchMode=yes", "gpu-c"]  # gpu-b excluded: node 1 is gpu-c
    for i, c in enumerate(cmds):
        flags = dict(a.split("=", 1) for a in c if a.startswith("--") and "=" in a)
        world = json.loads(base64.urlsafe_b64decode(flags["--world_info"]))
        assert world == {"gpu-a": list(range(8)), "gpu-c": list(range(8))}  # DeepSpeed's --world_info
        assert (flags["--node_rank"], flags["--master_addr"], flags["--master_port"]) == (str(i), "10.0.0.5", "29500")
        assert c[-4:] == ["--no_local_rank", "--module", "rlvr_core.pipeline.child.rank", str(tmp_path / "request.json")]


@pytest.mark.parametrize("text,grpo,error", [
    (None, {}, r"hostfile .*/hostfile: no such file"),
    ("a slots=1\n\nb slot=1\n", {}, r"/hostfile:3: not 'HOST slots=N': 'b slot=1'"),
    ("a slots=1\na slots=1\n", {}, r"/hostfile:2: host a is already on line 1"),
    ("a slots=1\nb slots=2\n", {}, r"/hostfile:2: host b has 2 slot\(s\) in use, but grpo.launch.nproc_per_node is 1"),
    ("a slots=1\n", {}, r"/hostfile: 1 host\(s\) after include/exclude \(a\), but grpo.launch.nnodes is 2"),
    ("a slots=1\nb slots=1\n", {"include": "c"}, r"/hostfile: grpo.launch.include/exclude: Hostname 'c' not found"),
])
def test_a_bad_hostfile_is_one_error_naming_file_and_line(tmp_path, text, grpo, error):
    from rlvr_core.experiment.config import ConfigError

    if text is not None:
        (tmp_path / "hostfile").write_text(text)
    with pytest.raises(ConfigError, match=error) as e:
        parse_config({"grpo": {"launch": {**TWO_NODES, "mode": "deepspeed", "hostfile": str(tmp_path / "hostfile"),
                                          **grpo}}}, "exp.yaml")
    assert "exp.yaml: grpo.launch:" in str(e.value) and "Traceback" not in str(e.value)


@pytest.mark.slow
def test_a_killed_deepspeed_node_fails_the_group_naming_it(tiny, rlvr_home, tmp_path, monkeypatch):
    cfg, data, base, cur = _inputs(tiny, tmp_path)
    cfg = _with(cfg, steps=20, lr=1e-3, checkpoint_every=2, zero_stage=2, launch=_two_hosts(tmp_path))
    monkeypatch.setenv("RLVR_STAGE_THREADS", "1")  # restored after the killer's change for a retry
    stop, killed = threading.Event(), []
    threading.Thread(target=_kill_node_one_after_a_checkpoint, args=(rlvr_home, stop, killed), daemon=True).start()
    try:
        with pytest.raises(GroupFailure) as e:
            stages.train_stage(cfg, data, base, cur)
    finally:
        stop.set()
    assert killed, "node 1 was never killed"
    assert str(e.value).startswith("grpo: node 1 of 2 exited with signal SIGKILL") and e.value.transient, e.value
    [failure] = [json.loads(p.read_text()) for p in (rlvr_home / "cache" / "grpo").glob("*/launch/failures.jsonl")]
    assert failure["transient"] and failure["exit_codes"][1] == -signal.SIGKILL, failure
    left = [p.pid for p in psutil.process_iter(["cmdline"]) if str(rlvr_home) in " ".join(p.info["cmdline"] or [])]
    assert left == [], f"ranks outlived their group: {left}"  # rank 1 stops with its launcher, rank 0 is killed
