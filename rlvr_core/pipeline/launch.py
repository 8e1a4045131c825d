"""The training stage as a group of ranks: `grpo.launch.mode: torchrun` or `deepspeed` (docs/gpu.md, "Multi-node").

The stage process (`train_stage`) keeps what it always does (the folder keyed by the inputs, the recorded
numerics, the summary and `.done`) and hands only the training itself to `train_group`: one
`torch.distributed.run` per node (`--nnodes N --node_rank i --nproc_per_node K`, static rendezvous at
`grpo.launch.rdzv_endpoint`), or one `deepspeed.launcher.launch` per hostfile host (`--world_info --node_rank i`,
the same endpoint as --master_addr/--master_port); either way every rank runs
`python -m rlvr_core.pipeline.child.rank REQUEST`, which calls `stages.train_here` with the same arguments (N ranks
train like one process: rlvr_core/grpo/distributed.py).

A group stands or falls together: when one node's process ends badly, the others are given a few seconds to
report their own error and are then killed (each node is its own process group; its ranks stop when
their agent is gone), and `GroupFailure` says which node failed and how. The nodes follow the protocol of
every pipeline child (`rlvr_core.pipeline.child`): a sealed request (no secret in the file; the values travel
in the nodes' environment), a parent watch (ranks stop when the stage process that launched them is gone, so
no orphan keeps writing checkpoints a retry resumes from), a typed report, and one death classification. A
rank's own error is judged first, with its own verdict (a guard, a bad input, a missing secret, out of memory:
not transient; G-oom says what to lower). Otherwise the node died: if the memory cgroup's OOM-kill counter went
up while the group ran, the kernel's OOM killer did it and the group fails once with the G-oom line, not
retried; any other kill, or a rank that lost its peers (a gloo/NCCL error), is transient: the retry relaunches
every node and `train_grpo` resumes from the last checkpoint in the folder. Every node exiting 0 without a
result is a bug, deterministic. The counter is this host's: a node on another host killed by its OOM killer
shows as a lost node (the fallback, `child.death.classify_death`).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path

from rlvr_core.core.net import free_port
from rlvr_core.core.progress import SILENT, Progress
from rlvr_core.experiment.hostfile import encode_world_info, read_hostfile
from rlvr_core.pipeline.child.death import classify_death, oom_kill_count
from rlvr_core.pipeline.child.errors import ChildError
from rlvr_core.pipeline.child.protocol import RANK_RESULT, ChildFailure, read_report, write_request
from rlvr_core.pipeline.child.run import child_env, kill_child, start_child
from rlvr_core.pipeline.child.transient import oom_guard

LAUNCH_DIR = "launch"
FAILURES = "failures.jsonl"  # one line per failed attempt of the group, kept across retries
# Variables a launcher sets; inherited from an outer launch they would confuse the nodes' own.
LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "MASTER_ADDR",
               "MASTER_PORT", "TORCHELASTIC_RUN_ID", "CROSS_RANK", "CROSS_SIZE", "LOCAL_SIZE")
GRACE_S = 5.0  # after one node fails: how long the others may take to report their own error


class GroupFailure(ChildError):
    """A launched training group failed. `transient`: a retry (which relaunches every node) can fix it;
    `error_type` "OOMKilled" when the kernel's OOM killer stopped it; `kind` as `ChildError`'s."""


def node_commands(grpo, request: Path, port: int) -> list[list[str]]:
    """The command of each node, node 0 first (it runs where the stage runs); nodes >= 1 behind node_command."""
    launch = grpo.launch
    addr, rank = launch.rdzv_endpoint.rpartition(":")[0], ["rlvr_core.pipeline.child.rank", str(request)]
    if launch.mode == "deepspeed":
        world = read_hostfile(launch.hostfile, launch.include, launch.exclude, nnodes=launch.nnodes,
                              nproc_per_node=launch.nproc_per_node)
        hosts, info = list(world), encode_world_info(world)
        # --no_local_rank: the rank reads LOCAL_RANK from its environment; --module: rank.py is a module.
        agents = [["deepspeed.launcher.launch", f"--world_info={info}", f"--node_rank={i}", f"--master_addr={addr}",
                   f"--master_port={port}", "--no_local_rank", "--module", *rank] for i in range(launch.nnodes)]
    else:
        hosts = [""] + list(launch.hosts) if launch.hosts else [""] * launch.nnodes
        agents = [["torch.distributed.run", "--nnodes", str(launch.nnodes), "--node_rank", str(i), "--nproc_per_node",
                   str(launch.nproc_per_node), "--master_addr", addr, "--master_port", str(port), "-m", *rank]
                  for i in range(launch.nnodes)]
    return [(shlex.split(launch.node_command.format(host=hosts[i])) if i else []) + [sys.executable, "-m", *agent]
            for i, agent in enumerate(agents)]


def train_group(cfg, data, base, curriculum, folder: Path, progress: Progress = SILENT, *,
                mlflow_run_id: str | None = None, base_eval: dict[str, float] | None = None):
    """Launch the group, wait for every node, return rank 0's `GRPOResult`; raise `GroupFailure` otherwise."""
    import torch

    from rlvr_core.grpo.trainer import GRPOResult

    work = folder / LAUNCH_DIR
    work.mkdir(parents=True, exist_ok=True)
    for stale in work.iterdir():  # a previous attempt's reports must not be read as this one's
        if stale.name != FAILURES:
            stale.unlink()
    request = {"config": cfg.resolved(), "data": asdict(data), "base": asdict(base),
               "curriculum": asdict(curriculum), "folder": str(folder), "mlflow_run_id": mlflow_run_id,
               "base_eval": base_eval, "threads": torch.get_num_threads(), "launcher_pid": os.getpid()}
    req = work / "request.json"
    secrets = write_request(req, request)
    port = int(cfg.grpo.launch.rdzv_endpoint.rpartition(":")[2]) or free_port()
    env = child_env(secrets, drop=LAUNCH_VARS,
                    overrides={"OMP_NUM_THREADS": str(request["threads"]), "TOKENIZERS_PARALLELISM": "false"})
    g = cfg.grpo.launch
    progress("grpo", f"launching {g.nnodes} node(s) x {g.nproc_per_node} rank(s) ({g.mode}, rendezvous "
                     f"{g.rdzv_endpoint.rpartition(':')[0]}:{port})")
    oom_kills = oom_kill_count()  # compared after a node's death: was it the OOM killer?
    procs = []
    for i, cmd in enumerate(node_commands(cfg.grpo, req, port)):
        out = None if i == 0 else open(work / f"node{i}.log", "w")  # node 0's lines join the stage's log
        procs.append(start_child(cmd, env, stdout=out, cwd=None, own_session=True))
        (work / f"node{i}.pid").write_text(str(procs[-1].pid))
    _wait_group(procs, work, oom_kills)
    out, _ = read_report(work / RANK_RESULT)
    return GRPOResult(Path(out["final_model_dir"]), Path(out["steps_path"]), Path(out["checkpoints_dir"]),
                      out["summary"], Path(out["rollouts_path"]) if out.get("rollouts_path") else None)


def _wait_group(procs: list, work: Path, oom_kills: int | None = None) -> None:
    """Wait for every node (`start_child` processes, each its own process group); on the first failure stop the
    group and raise `GroupFailure`."""
    failed: list[int] = []
    try:
        while any(p.poll() is None for p in procs) and not failed:
            failed = [i for i, p in enumerate(procs) if p.poll() not in (None, 0)]
            time.sleep(0.2)
        failed = failed or [i for i, p in enumerate(procs) if p.returncode]
        if failed:
            kill_child(procs[failed[0]], group=True)  # what is left of it; its ranks follow their agent
            deadline = time.monotonic() + GRACE_S
            while time.monotonic() < deadline and any(p.poll() is None for p in procs):
                time.sleep(0.2)
    finally:
        for p in procs:
            kill_child(p, group=True)
    codes = [p.returncode for p in procs]
    if not any(codes) and (work / RANK_RESULT).is_file():
        return
    err = _failure(codes, failed[0] if failed else 0, work, oom_kills)
    with open(work / FAILURES, "a") as f:
        f.write(json.dumps({"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "exit_codes": codes,
                            "transient": err.transient, "message": str(err).splitlines()[0]}) + "\n")
    raise err


def _rank_failures(work: Path) -> list[tuple[int, ChildFailure]]:
    """(rank, its reported failure), by rank."""
    reports = [(int(p.name.split(".")[0].removeprefix("rank")), read_report(p)) for p in work.glob("rank*.error.json")]
    return sorted((rank, failure) for rank, (_, failure) in reports if failure is not None)


def _failure(codes: list[int], first: int, work: Path, oom_kills: int | None = None) -> GroupFailure:
    """Which node failed and why: a rank's own error first (it is the cause; its peers only lost it), with the
    rank's own verdict; then the death of the first failed node, judged by `death.classify_death` with the
    OOM-kill count before the launch. Every node exiting 0 without a result is a bug: deterministic."""
    own = [(r, f) for r, f in _rank_failures(work) if f.kind != "peer_lost"]
    how = f"signal {signal.Signals(-codes[first]).name}" if codes[first] < 0 else f"status {codes[first]}"
    head = f"grpo: node {first} of {len(codes)} exited with {how}; the group was stopped (exit codes {codes})"
    if not any(codes):
        head = f"grpo: every node exited with status 0 but rank 0 wrote no result ({work / RANK_RESULT})"
    if own:
        rank, f = own[0]
        return GroupFailure(f"{head}\nrank {rank}: {f.error_type}: {f.message}\n{f.traceback}",
                            transient=f.transient, kind=f.kind)
    death = classify_death(codes[first], oom_kills, relayed=True)
    if death.kind == "oom":
        return GroupFailure(f"{head}: {death.says}\n{oom_guard('train')}", transient=False, error_type="OOMKilled",
                            kind="oom")
    if death.kind == "crashed":
        return GroupFailure(f"{head}: no rank reported an error and no node was killed: a bug, not retried",
                            transient=False, kind="crashed")
    return GroupFailure(f"{head}: a node was lost, transient (a retry relaunches every node and resumes from the "
                        f"last checkpoint)", transient=True, kind="killed")
