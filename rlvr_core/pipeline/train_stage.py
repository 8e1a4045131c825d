"""The training stage: GRPO on the curriculum from the base model, in a folder keyed by every input that changes
the weights and resumed there after a crash or retry, in this process (`train_here`) or in a launched group of
ranks (`rlvr_core.pipeline.launch`), with live metrics and traces on the MLflow runs above it."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from rlvr_core.artifacts.layout import SUMMARY_FILE
from rlvr_core.core.numerics import numerics
from rlvr_core.core.progress import SILENT, Progress
from rlvr_core.data.templates import get_template
from rlvr_core.experiment.config import ExperimentConfig
from rlvr_core.experiment.config_base import key_dump
from rlvr_core.experiment.grpo_config import grpo_key_dump, grpo_unkeyed_dump
from rlvr_core.experiment.guard_coverage import guard_coverage
from rlvr_core.experiment.guards import GUARD_NO_SIGNAL, GuardError
from rlvr_core.experiment.no_signal import passrate_no_signal
from rlvr_core.pipeline.base_model_stage import check_template_at_start
from rlvr_core.core import settings
from rlvr_core.pipeline.cache import fetch, localize, mark_done, resumable_dir, resumable_path
from rlvr_core.pipeline.curriculum_stage import BASE_ROLLOUT_COLUMNS, CurriculumArtifact
from rlvr_core.pipeline.evaluation_stage import vllm_options, held_out_eval
from rlvr_core.pipeline.launch import train_group
from rlvr_core.pipeline.stage_outputs import DataArtifact, ModelArtifact
from rlvr_core.pipeline.traces import TraceSink
from rlvr_core.records.tracking import StepMetricsSink
from rlvr_core.sampling.models import model_hashes
from rlvr_core.verifiers.registry import verifier_class

# Bump when the stage's code changes what it produces, so stale runs are not reused.
GRPO_STAGE_VERSION = "1"


@dataclass(frozen=True)
class TrainArtifact:
    model: ModelArtifact  # the trained policy, exported with save_pretrained
    steps_path: str  # Parquet, one row per optimisation step
    folder: str
    cached: bool
    summary: dict[str, Any]


def _rollout_options(cfg: ExperimentConfig) -> dict | None:
    """The GRPO rollout engine's settings: the servers and timeouts for vllm-server, else `vllm_options`."""
    if cfg.sampling.engine == "vllm-server":
        return cfg.sampling.server_options()
    if cfg.sampling.engine == "hf":
        return {"hf_compile": cfg.sampling.hf_compile}
    return vllm_options(cfg)


@contextlib.contextmanager
def _live_metrics(cfg: ExperimentConfig, run_ids: str | Sequence[str] | None):
    """The trainer's `on_step` for one MLflow run id or several (the train stage run and the pipeline run
    above it, so the curves are on the run a person opens; None: no live metrics); every sink is flushed at
    the end, also when training fails, so the steps before a crash or a guard stop are in MLflow."""
    ids = [run_ids] if isinstance(run_ids, str) else [r for r in run_ids or () if r]
    if not ids:
        yield None
        return
    with contextlib.ExitStack() as stack:
        sinks = [stack.enter_context(StepMetricsSink(r, cfg.tracking.tracking_uri)) for r in dict.fromkeys(ids)]
        yield sinks[0] if len(sinks) == 1 else (lambda row: [sink(row) for sink in sinks])


def train_stage(cfg: ExperimentConfig, data: DataArtifact, base: ModelArtifact, curriculum: CurriculumArtifact,
                progress: Progress = SILENT, mlflow_run_id: str | Sequence[str] | None = None,
                base_eval: dict[str, float] | None = None) -> TrainArtifact:
    """GRPO on the curriculum, starting from the base model.

    `base_eval`: the base model's score on what the periodic evaluation scores (`base_reference`), handed to
    G-reward-hacking as its reference point (without it, the first eval point during training is).

    With `mlflow_run_id` (one run id or several) each step's metrics reach those runs (in `cfg.tracking`'s
    store) while training runs (`StepMetricsSink`); the caller still records steps.parquet afterwards, which
    logs only what is missing.

    The output folder is keyed by every input (base model hash, curriculum, GRPO settings, template,
    verifier, seed) and used in place, so a killed or retried run resumes from its last checkpoint
    there; finished runs with the same inputs are reused. The thread count and CPU instruction set
    (`numerics`) are recorded, not keyed: a retry on another host or at another thread count resumes
    instead of starting over, and says so (`_track_numerics`). So do the sections of `grpo` declared out of the
    key (`grpo_key_dump`): `grpo.memory`, so a run that ran out of memory resumes with smaller micro-batches, and
    `grpo.launch`: with `grpo.launch.mode: torchrun` or `deepspeed` the training runs in a
    group of ranks the stage starts (`rlvr_core.pipeline.launch.train_group`) instead of this process.
    """
    template_warnings = check_template_at_start(cfg, base.path, progress, "grpo")
    folder, done = resumable_dir("grpo", _train_key(cfg, base, curriculum))
    if not done:
        no_signal_at_start(cfg, curriculum, folder)  # G-no-signal: a stop before any training step
        recorded = grpo_unkeyed_dump(cfg.grpo)
        run_numerics = _track_numerics(folder, progress, {f"grpo.{k}": v for k, v in sorted(recorded.items())})
        if cfg.grpo.launch.mode in ("torchrun", "deepspeed"):
            result = train_group(cfg, data, base, curriculum, folder, progress, mlflow_run_id=mlflow_run_id,
                                 base_eval=base_eval)
        else:
            result = train_here(cfg, data, base, curriculum, folder, progress, mlflow_run_id=mlflow_run_id,
                                base_eval=base_eval)
        # The template it trained with travels to the export (G-prompt-mismatch: every evaluation compares).
        summary = {**result.summary, **run_numerics, "prompt_template": get_template(cfg.prompt.template).key,
                   "template_warnings": template_warnings, "guard_coverage": guard_coverage(cfg)}
        (folder / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        final, steps_path = Path(result.final_model_dir), Path(result.steps_path)
        (folder / "result.json").write_text(json.dumps({"final_model_dir": str(final), "steps_path": str(steps_path)}))
        mark_done(folder)
    paths = {k: localize(v) for k, v in json.loads((folder / "result.json").read_text()).items()}
    final = Path(paths["final_model_dir"])
    mh, th = model_hashes(final)
    summary = json.loads((folder / "summary.json").read_text())
    progress("grpo", f"trained model {folder.name} ({'cached' if done else 'trained'})")
    return TrainArtifact(ModelArtifact(str(final), f"grpo-{folder.name}", mh, th, done), paths["steps_path"],
                         str(folder), done, summary)


def _passrate_samples(curriculum: CurriculumArtifact) -> list[dict[str, Any]]:
    """The pass-rate table's sampled completions (problem_id, status, response) that the curriculum was filtered
    by, from the table's cache folder (named in the curriculum's cache key); [] when it cannot be found."""
    try:
        table_id = json.loads((Path(curriculum.path).parent / "cache_key.json").read_text())["table"]
        folder = settings.paths().cache / "pass_rate_table" / table_id
        if not (folder / "samples.parquet").is_file():
            fetch("pass_rate_table", folder)
        return pq.read_table(folder / "samples.parquet", columns=["problem_id", "status", "response"]).to_pylist()
    except (OSError, KeyError, ValueError):
        return []


def no_signal_at_start(cfg: ExperimentConfig, curriculum: CurriculumArtifact, folder: Path) -> None:
    """G-no-signal before training: when the pass-rate table shows the base model solves none of the curriculum's
    prompts with the configured reward, every group of every step would have zero reward variance. Write the
    stopped summary a guard's stop leaves (tags `collapsed`, stopped at step 0; the flow records it) and raise
    GuardError naming the cause (verifier and mode with unextracted outputs, or the pass-rate temperature)."""

    health = cfg.grpo.guards.health
    if GUARD_NO_SIGNAL not in health.enabled or not health.no_signal.serious:
        return  # switched off, or made a flag (grpo.guards.health.no_signal.serious: false): nothing stops here
    if not {"c", "n"} <= set(pq.read_schema(curriculum.path).names):
        return  # a curriculum without the pass-rate counts (made by hand): nothing to judge
    kept = pq.read_table(curriculum.path, columns=["problem_id", "c", "n"]).to_pylist()
    hit = passrate_no_signal(kept, _passrate_samples(curriculum) if kept and not any(r["c"] for r in kept) else [],
                             verifier=cfg.reward.verifier, mode=cfg.reward.mode, temperature=cfg.grpo.temperature,
                             passrate_temperature=cfg.sampling.temperature)
    if hit is None:
        return
    reason, evidence = hit
    firing = {"guard_id": GUARD_NO_SIGNAL, "step": 0, "serious": True, "reason": reason, "evidence": evidence,
              "key": "passrate", "source": "passrate"}
    summary = {"steps": 0, "done": False, "tags": ["collapsed"], "stopped_at_step": 0, "stopped_by": [GUARD_NO_SIGNAL],
               "health_firings": [firing], "guard_coverage": guard_coverage(cfg),
               "prompt_template": get_template(cfg.prompt.template).key}
    (folder / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, default=str) + "\n")
    raise GuardError(reason, guard=GUARD_NO_SIGNAL, step=0)


def no_signal_before_training(cfg: ExperimentConfig, base: ModelArtifact, curriculum: CurriculumArtifact) -> None:
    """`no_signal_at_start` in the training stage's own folder, for a caller that checks before other expensive
    work (the pipeline flow, before the base evaluation); nothing for a folder that finished training already."""
    folder = resumable_path("grpo", _train_key(cfg, base, curriculum))
    if (folder / "result.json").exists():
        return
    folder.mkdir(parents=True, exist_ok=True)
    no_signal_at_start(cfg, curriculum, folder)


def teacher_before_training(cfg: ExperimentConfig, base: ModelArtifact) -> None:
    """On-policy distillation's teacher found and its tokenizer checked against the base model's (ConfigError
    naming `grpo.distill_teacher`; a teacher server that does not answer, naming `grpo.distill_teacher_servers`),
    for a caller that checks before other expensive work (the pipeline flow, right after the base model); the
    training stage checks again at its start. A `run:` teacher's export is
    copied into the cache's `teachers/` folder here."""
    if not cfg.grpo.enabled or cfg.grpo.distill_teacher is None:
        return
    from rlvr_core.grpo.distillation import checked_teacher

    checked_teacher(cfg.grpo, localize(base.path), settings.paths().cache / "teachers")


def base_rollouts(curriculum: CurriculumArtifact) -> dict[str, dict[str, float]]:
    """{prompt id: the base model's reward_mean, truncation_share, completion_len_mean} from the curriculum (the
    pass-rate table's numbers on each prompt), for G-collapse's baselines; only the columns it holds."""
    table = pq.read_table(curriculum.path)
    cols = {src: dst for src, dst in BASE_ROLLOUT_COLUMNS.items() if src in table.column_names}
    data = {src: table.column(src).to_pylist() for src in cols}
    return {pid: {dst: float(data[src][i]) for src, dst in cols.items() if data[src][i] is not None}
            for i, pid in enumerate(table.column("problem_id").to_pylist())}


def train_here(cfg: ExperimentConfig, data: DataArtifact, base: ModelArtifact, curriculum: CurriculumArtifact,
               folder: Path, progress: Progress = SILENT, *, mlflow_run_id: str | None = None,
               base_eval: dict[str, float] | None = None):
    """`train_grpo` into `folder` in this process: the whole stage (launch local) or one rank of a launched group
    (every rank calls it with the same arguments; only rank 0 reports and writes files)."""
    from rlvr_core.grpo.trainer import train_grpo

    ids = pq.read_table(curriculum.path, columns=["problem_id"]).column("problem_id").to_pylist()
    with _live_metrics(cfg, mlflow_run_id) as on_step, _live_traces(cfg, mlflow_run_id) as traces:
        return train_grpo(base.path, data.train_rows(), ids, folder, cfg.grpo, template_id=cfg.prompt.template,
                          reward=cfg.reward, max_new_tokens=cfg.sampling.max_new_tokens, seed=cfg.seed,
                          progress=lambda msg: progress("grpo", msg),
                          evaluate=held_out_eval(cfg, data, on_samples=traces and traces.on_samples),
                          engine=cfg.sampling.engine, engine_options=_rollout_options(cfg), on_step=on_step,
                          base_eval=base_eval, base_rollouts=base_rollouts(curriculum), on_rollouts=traces,
                          environment=cfg.environment, passrate_temperature=cfg.sampling.temperature)


@contextlib.contextmanager
def _live_traces(cfg: ExperimentConfig, run_ids: str | Sequence[str] | None):
    """The trainer's `on_rollouts`: a TraceSink on the run a person opens (the last of `run_ids`: the pipeline or
    trial run above the train stage run), or None without a run or with `tracking.traces.enabled` off."""
    ids = [run_ids] if isinstance(run_ids, str) else [r for r in run_ids or () if r]
    if not ids or not cfg.tracking.traces.enabled:
        yield None
        return
    with TraceSink(ids[-1], cfg.tracking.tracking_uri, cfg.tracking.traces, last_step=cfg.grpo.steps,
                   eval_interval=cfg.grpo.eval_interval()) as sink:
        yield sink


def _train_key(cfg: ExperimentConfig, base: ModelArtifact, curriculum: CurriculumArtifact) -> dict[str, Any]:
    """What names a training folder (see `train_stage`): every input that changes the trained weights, and the settings
    that only name the run (`NamesRun`: keyed since runs were keyed with them). The config's part is declared on its
    fields (`InKey`, `NamesRun`, a GRPO section's `IN_KEY`), not picked here."""
    return {"stage": GRPO_STAGE_VERSION, "base": base.model_hash, "curriculum": curriculum.curriculum_id,
            "grpo": grpo_key_dump(cfg.grpo),
            "template": get_template(cfg.prompt.template).key,
            "reward": key_dump(cfg.reward),
            "verifier_version": getattr(verifier_class(cfg.reward.verifier), "version", None),
            **key_dump(cfg.sampling), "seed": cfg.seed,
            # multi-turn only: every config from before environments keeps its key
            **({"environment": cfg.environment.key_dump()} if cfg.environment.multi_turn else {})}


def stopped_training(cfg: ExperimentConfig, base: ModelArtifact,
                     curriculum: CurriculumArtifact) -> tuple[Path, dict[str, Any]] | None:
    """(folder, the trainer's summary) when a serious guard stopped this training stage (the trainer writes
    its rows and a summary tagged `collapsed`, then raises), else None. The flow records such a run (its
    steps, health events and the `collapsed` tag) before it fails, so the warehouse and the report show why."""
    folder = resumable_path("grpo", _train_key(cfg, base, curriculum))
    path = folder / SUMMARY_FILE
    if (folder / "result.json").exists() or not path.is_file():
        return None
    summary = json.loads(path.read_text())
    return (folder, summary) if "collapsed" in (summary.get("tags") or []) else None


def _track_numerics(folder: Path, progress: Progress, memory: dict[str, Any]) -> dict[str, Any]:
    """{"numerics": what the training started with, "numerics_changes": [{"from_step", "before", "after"}]},
    kept in the folder's numerics.json; numerics here are what changes the rounding but not the maths: the
    thread count, CPU and torch version (`numerics()`) and the memory settings (`memory`). Resuming from a
    checkpoint under other numerics (another host, smaller micro-batches) adds a change and logs one line; steps
    after the checkpoint are redone, so changes recorded from a later step are dropped, and without a
    checkpoint the run starts afresh under the current numerics."""
    from rlvr_core.grpo.checkpointing import CHECKPOINTS

    now, path, latest = {**numerics(), **memory}, folder / "numerics.json", folder / CHECKPOINTS / "latest"
    step = int(latest.read_text().strip().removeprefix("step")) if latest.is_file() else 0
    if step == 0 or not path.is_file():
        record = {"numerics": now, "numerics_changes": []}
    else:
        record = json.loads(path.read_text())
        record["numerics_changes"] = [c for c in record["numerics_changes"] if c["from_step"] < step]
        last = record["numerics_changes"][-1]["after"] if record["numerics_changes"] else record["numerics"]
        if last != now:
            record["numerics_changes"].append({"from_step": step, "before": last, "after": now})
            changed = ", ".join(f"{k} {last.get(k)} -> {v}" for k, v in now.items() if last.get(k) != v)
            progress("grpo", f"numerics changed since the checkpoint at step {step} ({changed}): resuming from it; "
                             f"the steps after it run with the new numerics (summary: numerics_changes)")
    path.write_text(json.dumps(record, indent=2))
    return record
