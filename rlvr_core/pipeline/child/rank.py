"""One rank of a launched training group: `python -m rlvr_core.pipeline.child.rank REQUEST` under
torch.distributed.run or deepspeed.launcher.launch (`rlvr_core.pipeline.launch` starts the group; both export
RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT). The same skeleton as a stage child (`protocol.serve`):
it reads the sealed request, trains with every other rank through `stages.train_here`, and rank 0 writes
`result.json` next to the request; a failure, including one while reading the request, is written as
`rank<R>.error.json` for the launcher to judge. A rank whose error only says its peers went away (a gloo/NCCL
error) reports kind "peer_lost", transient: the cause is elsewhere."""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from rlvr_core.core.progress import Progress
from rlvr_core.experiment.config import parse_config
from rlvr_core.grpo.distributed import shutdown
from rlvr_core.pipeline import stages
from rlvr_core.pipeline.child.protocol import RANK_RESULT, ChildFailure, rank_error_file, serve, watch_parent
from rlvr_core.pipeline.child.transient import is_dist_error

# A rank's error that only says its peers went away (the real failure is elsewhere).
_PEER_LOST = ("gloo", "nccl", "connection", "socket", "broken pipe", "timed out", "peer")


def rank_failure(exc: BaseException) -> ChildFailure:
    """The rank's account of `exc`: its own error (out of memory ends with G-oom), or "peer_lost" when it only
    says the rank lost its peers."""
    failure = ChildFailure.of(exc, "train")
    text = f"{type(exc).__name__}: {exc}".lower()
    if failure.kind != "oom" and (is_dist_error(exc) or any(t in text for t in _PEER_LOST)):
        return replace(failure, kind="peer_lost", transient=True)
    return failure


def train(req: dict[str, Any], rank: int, source: str) -> dict[str, Any] | None:
    """Train with every other rank; rank 0's result (the others return None)."""
    # Exit when the stage process that launched the group is gone (a killed stage, a lost worker), or this node's
    # agent is: torchrun starts each rank in a session of its own.
    watch_parent(launcher_pid=req["launcher_pid"])
    torch.set_num_threads(req["threads"])
    # The stage checked the launch settings; the hostfile they name may exist only on its host.
    grpo = req["config"]["grpo"]
    launch = {**grpo["launch"], "mode": "local", "hostfile": "", "include": "", "exclude": ""}
    cfg = parse_config({**req["config"], "grpo": {**grpo, "launch": launch}}, source)
    data, base = stages.DataArtifact(**req["data"]), stages.ModelArtifact(**req["base"])
    cur = stages.CurriculumArtifact(**req["curriculum"])
    main = rank == 0
    result = stages.train_here(cfg, data, base, cur, Path(req["folder"]), Progress(main),
                               mlflow_run_id=req["mlflow_run_id"] if main else None, base_eval=req["base_eval"])
    shutdown()
    return asdict(result) if main else None


def rank_main(argv: list[str]) -> int:
    path = Path(argv[1])
    rank, work = int(os.environ.get("RANK", "0")), path.parent
    # Every rank reads the request; the launcher removes it with the next attempt.
    return serve(path, lambda req: train(req, rank, str(path)), result=work / RANK_RESULT,
                 failure=rank_error_file(work, rank), delete=False, judge=rank_failure, echo=True)


if __name__ == "__main__":
    sys.exit(rank_main(sys.argv))
