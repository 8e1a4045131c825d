"""A heavy stage in a clean child process: `python -m rlvr_core.pipeline.child.stage STAGE REQUEST.json RESULT.json`
(started by the stage task, `tasks/stage_process.py`).

Why a child: GPU memory, DeepSpeed's process-group state and any leaked threads go away with the process, and a
kill (pre-emption, a lost node) is visible to the parent as death by signal, transient unless the kernel's OOM
killer sent it (`death.classify_death`). A retried training stage resumes because `stages.train_stage` keys its
folder on its inputs and `train_grpo` resumes from the last DeepSpeed checkpoint there.

The request holds the resolved config and the input artifacts (dataclasses as dicts); the result file holds the
output artifact, or the child's `ChildFailure` with its own transient/deterministic verdict. No Prefect in the
child: it starts fast and needs no API.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rlvr_core.core.progress import Progress
from rlvr_core.experiment.config import parse_config
from rlvr_core.pipeline import stages
from rlvr_core.pipeline.child.protocol import ChildFailure, serve, watch_parent


def _artifacts(req: dict[str, Any]):
    cfg = parse_config(req["config"], req.get("source", "<stage request>"))
    data = stages.DataArtifact(**req["data"]) if "data" in req else None
    base = stages.ModelArtifact(**req["base"]) if "base" in req else None
    cur = stages.CurriculumArtifact(**req["curriculum"]) if "curriculum" in req else None
    return cfg, data, base, cur


def run(stage: str, req: dict[str, Any]) -> dict[str, Any]:
    cfg, data, base, cur = _artifacts(req)
    progress = Progress(True)
    if stage == "train":
        out = stages.train_stage(cfg, data, base, cur, progress, mlflow_run_id=req.get("mlflow_run_id"),
                                 base_eval=req.get("base_eval"))
        return asdict(out)
    if stage == "evaluate":
        model = stages.ModelArtifact(**req["model"])
        ev = stages.evaluate_stage(cfg, data, model, eval_id=req["eval_id"], checkpoint=req["checkpoint"],
                                   progress=progress)
        # Tables travel as Parquet files next to the result (they can be large).
        import pyarrow.parquet as pq

        out_dir = Path(req["out_dir"])
        out_dir.mkdir(parents=True, exist_ok=True)
        pq.write_table(ev.samples, out_dir / "samples.parquet")
        pq.write_table(ev.metrics, out_dir / "metrics.parquet")
        pq.write_table(ev.curves, out_dir / "curves.parquet")
        return {"samples": str(out_dir / "samples.parquet"), "metrics": str(out_dir / "metrics.parquet"),
                "curves": str(out_dir / "curves.parquet"), "curve": {str(k): v for k, v in ev.curve.items()},
                "summary": ev.summary}
    raise SystemExit(f"unknown stage {stage!r} (train, evaluate)")


def main(argv: list[str]) -> int:
    stage, request, result = argv[1], Path(argv[2]), Path(argv[3])
    # If the task process that launched us dies (a killed flow run), stop too: an orphaned trainer would keep
    # writing checkpoints into the folder a retry is about to resume from.
    watch_parent(interval_s=0.5)
    threads = int(os.environ.get("RLVR_STAGE_THREADS", "0"))
    if threads:
        import torch

        torch.set_num_threads(threads)
    # The request's sealed secrets come from our environment; the child is its only reader and deletes it.
    return serve(request, lambda req: run(stage, req), result=result, failure=result, delete=True,
                 judge=lambda e: ChildFailure.of(e, stage))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
