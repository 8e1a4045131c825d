"""The pipeline's stages as plain functions, one module each, re-exported here so callers name one place.

Every stage takes files and configs in and gives files and small summaries out. Prefect wraps each in a task
(`tasks/`), but nothing here knows about Prefect, so the same stage runs from a flow, a subprocess, a notebook or
a test. Stages that are pure functions of their inputs (data, base model, pass-rate table, curriculum) are
content-addressed in the stage cache (`rlvr_core.pipeline.cache`): re-running with the same inputs reuses the
folder instead of recomputing. Where each lives:

- `stage_outputs`: the data and model artifacts, `here` (an artifact's paths on this worker), `experiment_manifest`
- `data_stage`: `prepare_data`
- `base_model_stage`: `prepare_base_model`, `warm_start_spec`
- `passrate_stage`: `pass_rate_stage`, `PassRateArtifact`
- `curriculum_stage`: `curriculum_stage`, `CurriculumArtifact`, `BASE_ROLLOUT_COLUMNS`
- `train_stage`: `train_stage`, `train_here`, `stopped_training`, `no_signal_before_training`,
  `teacher_before_training`, `TrainArtifact`
- `export_stage`: `export_stage`, `ExportArtifact`
- `evaluation_stage`: `evaluate_stage`, the held-out benchmark and the trainer's periodic evaluation
"""

from __future__ import annotations

from rlvr_core.pipeline.base_model_stage import prepare_base_model, warm_start_spec
from rlvr_core.pipeline.curriculum_stage import BASE_ROLLOUT_COLUMNS, CurriculumArtifact, curriculum_stage
from rlvr_core.pipeline.data_stage import prepare_data
from rlvr_core.pipeline.evaluation_stage import (SYNTHETIC_BENCHMARK_VERSION, EvalArtifact, base_reference,
                                                 evaluate_stage, held_out_spec)
from rlvr_core.pipeline.export_stage import ExportArtifact, export_stage
from rlvr_core.pipeline.passrate_stage import PassRateArtifact, pass_rate_stage
from rlvr_core.pipeline.stage_outputs import DataArtifact, ModelArtifact, experiment_manifest, here
from rlvr_core.pipeline.train_stage import (TrainArtifact, no_signal_before_training, stopped_training,
                                            teacher_before_training, train_here, train_stage)

# What callers import from here (`from rlvr_core.pipeline.stages import X`, `stages.X`).
__all__ = ["base_reference", "BASE_ROLLOUT_COLUMNS", "curriculum_stage", "CurriculumArtifact", "DataArtifact",
           "EvalArtifact", "evaluate_stage", "experiment_manifest", "export_stage", "ExportArtifact", "held_out_spec",
           "here", "ModelArtifact", "no_signal_before_training", "pass_rate_stage", "PassRateArtifact",
           "prepare_base_model", "prepare_data", "stopped_training", "SYNTHETIC_BENCHMARK_VERSION", "teacher_before_training",
           "train_here",
           "train_stage", "TrainArtifact", "warm_start_spec"]
