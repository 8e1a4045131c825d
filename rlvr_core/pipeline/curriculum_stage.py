"""The curriculum stage: the pass-rate table reconciled with the training set's ids (G-id-mismatch), filtered by
its bounds and ordered; the base model's numbers per prompt travel with the order (the trainer's baselines)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.parquet as pq

from rlvr_core.core.progress import SILENT, Progress
from rlvr_core.data.curriculum import filter_by_pass_rate, order_curriculum, reconcile_ids
from rlvr_core.experiment.config import ExperimentConfig
from rlvr_core.pipeline.cache import cached_dir
from rlvr_core.pipeline.passrate_stage import PassRateArtifact
from rlvr_core.pipeline.stage_outputs import DataArtifact

# Bump when the stage's code changes what it produces, so stale cache entries are not reused.
CURRICULUM_STAGE_VERSION = "2"  # 2: the base model's mean_length and truncation_share per prompt

# The pass-rate table's columns that become the trainer's base_rollouts (and the step rows' base/* columns).
BASE_ROLLOUT_COLUMNS = {"pass_rate": "reward_mean", "truncation_share": "truncation_share",
                        "mean_length": "completion_len_mean"}


@dataclass(frozen=True)
class CurriculumArtifact:
    path: str
    curriculum_id: str
    n_prompts: int
    cached: bool


def curriculum_stage(cfg: ExperimentConfig, data: DataArtifact, passrates: PassRateArtifact,
                     progress: Progress = SILENT) -> CurriculumArtifact:
    """Filter the pass-rate table by its bounds and order the kept prompts; the trainer reads the result.

    The table's ids are reconciled with the training set's first (G-id-mismatch): a table measured on
    another version of the data fails here, naming how many ids and which, instead of silently
    training on a subset.
    """
    c, pk = cfg.curriculum, cfg.passk
    key = {"stage": CURRICULUM_STAGE_VERSION, "table": passrates.table_id, "train": data.train_hash,
           "low": pk.low, "high": pk.high, "drop_never": pk.drop_never_solved, "drop_always": pk.drop_always_solved,
           "strategy": c.strategy, "seed": c.seed, "id_tolerance": c.id_tolerance}

    def build(tmp: Path) -> None:
        table = pq.read_table(passrates.table_path)
        matched = reconcile_ids(table.column("problem_id").to_pylist(), [r["id"] for r in data.train_rows()],
                                tolerance=c.id_tolerance)
        table = table.filter(pa.compute.is_in(table.column("problem_id"), value_set=pa.array(matched, pa.string())))
        kept = filter_by_pass_rate(table, low=pk.low, high=pk.high, drop_never=pk.drop_never_solved,
                                   drop_always=pk.drop_always_solved)
        ordered = order_curriculum(kept, c.strategy, seed=c.seed)
        # The base model's numbers per prompt travel with the order: the trainer's G-collapse baselines.
        cols = ["pass_rate", "n", "c"] + [k for k in BASE_ROLLOUT_COLUMNS if k in ordered.column_names]
        out = pa.table({"position": ordered.column("order"), "problem_id": ordered.column("problem_id"),
                        **{k: ordered.column(k) for k in cols}})
        pq.write_table(out, tmp / "curriculum.parquet")
        (tmp / "manifest.json").write_text(json.dumps({**key, "n_prompts": out.num_rows}, indent=2, sort_keys=True))

    folder, hit = cached_dir("curriculum", key, build)
    n = pq.read_metadata(folder / "curriculum.parquet").num_rows
    progress("curriculum", f"{n} prompts ordered {c.strategy} ({'cached' if hit else 'built'})")
    return CurriculumArtifact(str(folder / "curriculum.parquet"), folder.name, n, hit)
