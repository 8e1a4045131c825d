"""One rank of a launched training group: `python -m rlvr_core.pipeline.rank REQUEST` under torch.distributed.run
or deepspeed.launcher.launch (rlvr_core/pipeline/launch.py starts the group; both export RANK, LOCAL_RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT). It reads the sealed request, trains with every other rank through
`stages.train_here`, and rank 0 writes `result.json` next to the request; a failure is written as
`rank<R>.error.json` for the launcher to judge (the child protocol: rlvr_core/pipeline/child.py)."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from rlvr_core.core.progress import Progress
from rlvr_core.experiment.config import parse_config
from rlvr_core.grpo.distributed import shutdown
from rlvr_core.pipeline import stages
from rlvr_core.pipeline.child import read_request
from rlvr_core.pipeline.launch import report_failure, stop_with_launcher


def rank_main(argv: list[str]) -> int:
    """One rank: read the request, train with every other rank, rank 0 writes `result.json`."""
    path = Path(argv[1])
    req = read_request(path, delete=False)  # every rank reads it; the launcher removes it with the next attempt
    rank, work = int(os.environ.get("RANK", "0")), path.parent
    stop_with_launcher(req["launcher_pid"])
    torch.set_num_threads(req["threads"])
    try:
        # The stage checked the launch settings; the hostfile they name may exist only on its host.
        grpo = req["config"]["grpo"]
        launch = {**grpo["launch"], "mode": "local", "hostfile": "", "include": "", "exclude": ""}
        cfg = parse_config({**req["config"], "grpo": {**grpo, "launch": launch}}, str(path))
        data, base = stages.DataArtifact(**req["data"]), stages.ModelArtifact(**req["base"])
        cur = stages.CurriculumArtifact(**req["curriculum"])
        main = rank == 0
        result = stages.train_here(cfg, data, base, cur, Path(req["folder"]), Progress(main),
                                   mlflow_run_id=req["mlflow_run_id"] if main else None, base_eval=req["base_eval"])
        if main:
            tmp = work / "result.json.tmp"
            tmp.write_text(json.dumps(asdict(result), default=str))
            os.replace(tmp, work / "result.json")
        shutdown()
    except BaseException as e:  # noqa: BLE001 - reported to the launcher, which decides for the group
        report_failure(work, rank, e)
        raise
    return 0


if __name__ == "__main__":
    sys.exit(rank_main(sys.argv))
