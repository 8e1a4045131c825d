"""The pipeline's stages as plain functions: files and configs in, files and small summaries out.

Prefect wraps each of these in a task (`tasks/`), but nothing here knows about Prefect, so the same
stage runs from a flow, a subprocess, a notebook or a test. Stages that are pure functions of their
inputs (data, base model, pass-rate table) are content-addressed in the stage cache
(`rlvr_core.pipeline.cache`): re-running with the same inputs reuses the folder instead of recomputing.
The evaluation stage, which the others share, is `rlvr_core.pipeline.evaluation_stage` (re-exported here).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.parquet as pq

from rlvr_core.artifacts.export import MANIFEST_FILE, export_checkpoint, upload_export, verify_local_export
from rlvr_core.core import manifest as manifest_mod
from rlvr_core.core.numerics import numerics
from rlvr_core.core.manifest import file_sha256, rows_sha256
from rlvr_core.core.progress import SILENT, Progress
from rlvr_core.data.curriculum import filter_by_pass_rate, order_curriculum, pass_rate_table, reconcile_ids
from rlvr_core.data.jsonl import read_jsonl, write_jsonl
from rlvr_core.data.loaders import load_problems
from rlvr_core.data.synthetic import SyntheticSpec, make_synthetic_dataset
from rlvr_core.data.templates import get_template, require_template_for_model
from rlvr_core.eval.evaluate import opened_engine
from rlvr_core.core import hub
from rlvr_core.experiment.benchmarks import load_benchmark, split_problems
from rlvr_core.experiment.config import ExperimentConfig, grpo_key_dump, grpo_unkeyed_dump
from rlvr_core.experiment.guard_coverage import guard_coverage
from rlvr_core.pipeline.cache import cached_dir, localize, mark_done, resumable_dir, resumable_path
from rlvr_core.pipeline.evaluation_stage import (EvalArtifact, _eval_limits, _run_settings, _vllm_options,  # noqa: F401
                                               base_reference, evaluate_stage, held_out_eval, held_out_problems,
                                               held_out_spec, periodic_problems)
from rlvr_core.pipeline.launch import train_group
from rlvr_core.pipeline.stage_outputs import DataArtifact, ModelArtifact  # noqa: F401  (stages.DataArtifact)
from rlvr_core.pipeline.traces import TraceSink
from rlvr_core.records.tracking import StepMetricsSink
from rlvr_core.sampling.models import model_hashes
from rlvr_core.sampling.verified import sample_and_verify
from rlvr_core.tiny.spec import WarmStartSpec
from rlvr_core.verifiers.registry import verifier_class

# Bump when a stage's code changes what it produces, so stale cache entries are not reused.
DATA_STAGE_VERSION = "1"
WARMSTART_STAGE_VERSION = "1"
PASSRATE_STAGE_VERSION = "1"
CURRICULUM_STAGE_VERSION = "2"  # 2: the base model's mean_length and truncation_share per prompt
GRPO_STAGE_VERSION = "1"
SYNTHETIC_BENCHMARK_VERSION = "2"  # 2: 32 samples per problem (pass@k to 32); 1 had 8


_PATH_FIELDS = frozenset({"path", "train_path", "test_path", "table_path", "samples_path", "steps_path", "folder"})


def here(artifact):
    """The artifact with every path it names on this worker: a path in another worker's stage cache becomes the
    same folder in this one, fetched from the stage store (`rlvr_core.pipeline.cache.localize`)."""
    changes = {}
    for f in dataclasses.fields(artifact):
        value = getattr(artifact, f.name)
        if f.name in _PATH_FIELDS and isinstance(value, str):
            changes[f.name] = localize(value)
        elif dataclasses.is_dataclass(value):
            changes[f.name] = here(value)
    return dataclasses.replace(artifact, **changes) if changes else artifact


# ----------------------------------------------------------------------------------------------- data
def prepare_data(cfg: ExperimentConfig, progress: Progress = SILENT) -> DataArtifact:
    """Generate (synthetic) or read the train/test problems; returns paths and content hashes."""
    d = cfg.data
    if d.source == "synthetic":
        spec = SyntheticSpec(n_train=d.synthetic.n_train, n_test=d.synthetic.n_test,
                             seed=d.synthetic.seed, difficulty=d.synthetic.difficulty)

        def build(tmp: Path) -> None:
            splits = make_synthetic_dataset(spec)
            write_jsonl(splits["train"], tmp / "train.jsonl")
            write_jsonl(splits["test"], tmp / "test.jsonl")

        folder, hit = cached_dir("data", {"stage": DATA_STAGE_VERSION, "synthetic": asdict(spec)}, build)
        train_path, test_path = folder / "train.jsonl", folder / "test.jsonl"
    elif d.benchmark is not None:
        folder, hit = _benchmark_data(d.benchmark)
        train_path, test_path = folder / "train.jsonl", folder / "test.jsonl"
    else:
        train_path = Path(d.train_path)
        test_path = Path(d.test_path)
        # Real sets are read (and schema-checked) through the loaders; the cache holds the mapped rows.
        def build(tmp: Path) -> None:
            write_jsonl(load_problems(d.source, train_path), tmp / "train.jsonl")
            write_jsonl(load_problems(d.source, test_path), tmp / "test.jsonl")

        key = {"stage": DATA_STAGE_VERSION, "source": d.source,
               "train": file_sha256(train_path), "test": file_sha256(test_path)}
        folder, hit = cached_dir("data", key, build)
        train_path, test_path = folder / "train.jsonl", folder / "test.jsonl"
    train, test = read_jsonl(train_path), read_jsonl(test_path)
    progress("data", f"{len(train)} train / {len(test)} test problems ({'cached' if hit else 'built'})")
    return DataArtifact(str(train_path), str(test_path), rows_sha256(train), rows_sha256(test),
                        len(train), len(test), hit)


def _benchmark_data(name: str) -> tuple[Path, bool]:
    """`data.benchmark`: the benchmark's train split and evaluated split (data root, else hub; hash-checked),
    cached as the data stage's two files, keyed by their contents."""
    spec = load_benchmark(name, check_data=False)
    train, test = split_problems(spec, "train"), split_problems(spec, spec.data.split)

    def build(tmp: Path) -> None:
        write_jsonl(train, tmp / "train.jsonl")
        write_jsonl(test, tmp / "test.jsonl")

    key = {"stage": DATA_STAGE_VERSION, "source": spec.data.source, "benchmark": name,
           "train": rows_sha256(train), "test": rows_sha256(test)}
    return cached_dir("data", key, build)


# ---------------------------------------------------------------------------------------------- model
def warm_start_spec(cfg: ExperimentConfig) -> WarmStartSpec:
    m = cfg.model
    return WarmStartSpec(steps=m.warm_start.steps, batch_size=m.warm_start.batch_size, lr=m.warm_start.lr,
                         seed=m.warm_start.seed, vocab_size=m.tiny.vocab_size, hidden_size=m.tiny.hidden_size,
                         num_layers=m.tiny.num_layers, heads=m.tiny.num_heads,
                         teacher_sub_as_add=m.warm_start.teacher_sub_as_add,
                         teacher_stops_early=m.warm_start.teacher_stops_early)


def prepare_base_model(cfg: ExperimentConfig, data: DataArtifact, progress: Progress = SILENT) -> ModelArtifact:
    """Warm-start the tiny base model (cached on data + spec), or point at a local HF model."""
    ref = cfg.model.hub_ref()
    if ref is not None:  # the Hugging Face cache first, then a download (unless HF_HUB_OFFLINE)
        snap = hub.snapshot(ref[0], revision=ref[1])
        mh, th = model_hashes(snap.folder)
        progress("model", f"{snap.repo} at commit {snap.commit} ({snap.folder})")
        return ModelArtifact(str(snap.folder), f"{snap.repo}@{snap.commit}", mh, th, cached=True,
                             info={"hub": snap.record()})
    if cfg.model.source == "hf":
        path = Path(cfg.model.path).expanduser().resolve()
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model.path {path} has no config.json (a local Hugging Face model directory)")
        mh, th = model_hashes(path)
        return ModelArtifact(str(path), path.name, mh, th, cached=True)

    spec = warm_start_spec(cfg)
    template = get_template(cfg.prompt.template)
    key = {"stage": WARMSTART_STAGE_VERSION, "data": data.train_hash, "spec": asdict(spec), "template": template.key,
           "numerics": numerics()}
    report = progress.counter("warm-start", "step")

    def build(tmp: Path) -> None:
        from rlvr_core.tiny.warmstart import warm_start  # torch and transformers: only when it trains

        warm_start(data.train_rows(), tmp, spec, template_id=template.id,
                   progress=lambda step, total, loss: report(step, total, loss))

    folder, hit = cached_dir("base_model", key, build)
    info = json.loads((folder / "warmstart.json").read_text()) if (folder / "warmstart.json").exists() else {}
    mh, th = model_hashes(folder)
    progress("warm-start", f"base model {folder.name} ({'cached' if hit else 'trained'})")
    return ModelArtifact(str(folder), f"tiny-{folder.name}", mh, th, hit, info)


def _sampling_kwargs(cfg: ExperimentConfig, *, n: int, temperature: float, max_new_tokens: int) -> dict[str, Any]:
    """Sampling settings for the pass-rate stage, scored as training scores (`reward:`)."""
    return dict(template_id=cfg.prompt.template, n=n, temperature=temperature, top_p=cfg.sampling.top_p,
                max_new_tokens=max_new_tokens, seed=cfg.sampling.seed, batch_size=cfg.sampling.batch_size,
                verifier=cfg.reward.verifier, verifier_mode=cfg.reward.mode,
                verifier_workers=cfg.reward.workers, verifier_timeout_s=cfg.reward.timeout_s)


def check_template_at_start(cfg: ExperimentConfig, model_path: str, progress: Progress = SILENT,
                            stage: str = "template") -> list[str]:
    """G-chat-template at the start of a sampling stage: the experiment's template against `model.kind` and the
    model's own tokenizer (`require_template_for_model`). A finding that means garbage from the first prompt
    raises `TemplateError` before anything is sampled; the warnings are logged and returned for the summary."""
    from transformers import AutoTokenizer

    if not Path(model_path).is_dir():  # transformers would read a missing folder as a hub repo id
        raise FileNotFoundError(f"{stage}: model folder {model_path} does not exist")
    tok = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
    warnings = require_template_for_model(get_template(cfg.prompt.template), cfg.model.kind, tok,
                                          allow_kind_mismatch=cfg.prompt.allow_kind_mismatch)
    for w in warnings:
        progress(stage, f"warning: {w}")
    return warnings


# -------------------------------------------------------------------------------------- pass rates
@dataclass(frozen=True)
class PassRateArtifact:
    table_path: str
    samples_path: str
    table_id: str
    cached: bool
    summary: dict[str, Any]


def normalise_passk_columns(table: pa.Table) -> pa.Table:
    """`pass@4` → `pass_at_4`, `status_correct` → `n_correct`: the warehouse's SQL-friendly names."""
    return table.rename_columns([("n_" + c.removeprefix("status_") if c.startswith("status_") else c).replace("@", "_at_")
                                 for c in table.column_names])


def pass_rate_stage(cfg: ExperimentConfig, data: DataArtifact, model: ModelArtifact,
                    progress: Progress = SILENT) -> PassRateArtifact:
    """Sample n completions per training prompt, verify, and tabulate per-problem pass rates (cached)."""
    template_warnings = check_template_at_start(cfg, model.path, progress, "pass@k")
    rows = data.train_rows()
    if cfg.passk.max_prompts:
        rows = rows[: cfg.passk.max_prompts]
    kw = _sampling_kwargs(cfg, n=cfg.passk.n_samples, temperature=cfg.sampling.temperature,
                          max_new_tokens=cfg.sampling.max_new_tokens)
    key = {"stage": PASSRATE_STAGE_VERSION, "data": rows_sha256(rows), "model": model.model_hash,
           "tokenizer": model.tokenizer_hash, "template": get_template(cfg.prompt.template).key,
           "dtype": cfg.model.dtype, "engine": _run_settings(cfg).engine, "numerics": numerics(),
           "verifier_version": getattr(verifier_class(cfg.reward.verifier), "version", None),
           **{k: v for k, v in kw.items() if k not in ("batch_size", "verifier_workers", "template_id")}}

    def build(tmp: Path) -> None:
        t0 = time.monotonic()
        with opened_engine(model.path, _run_settings(cfg), llm_options=_vllm_options(cfg)) as (engine, _):
            records = sample_and_verify(None, None, rows, progress=progress, stage="pass@k", engine=engine, **kw)
        pq.write_table(pa.Table.from_pylist(records), tmp / "samples.parquet")
        table = normalise_passk_columns(pass_rate_table(records, ks=cfg.passk.ks))
        pq.write_table(table, tmp / "pass_rate_table.parquet")
        # What produced the table travels with it: a table without its settings is not reusable.
        manifest = {**key, "model_id": model.model_id, "n_problems": len(rows),
                    "verifier_version": records[0]["verifier_version"] if records else None,
                    "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "duration_s": round(time.monotonic() - t0, 3)}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))

    folder, hit = cached_dir("pass_rate_table", key, build)
    table = pq.read_table(folder / "pass_rate_table.parquet")
    kept = filter_by_pass_rate(table, low=cfg.passk.low, high=cfg.passk.high,
                               drop_never=cfg.passk.drop_never_solved, drop_always=cfg.passk.drop_always_solved)
    samples = pq.read_table(folder / "samples.parquet", columns=["unique_frac", "finish_reason"])
    cols = table.to_pydict()
    n_problems = table.num_rows
    summary = {
        "n_problems": n_problems,
        "n_samples": cfg.passk.n_samples,
        "n_kept": kept.num_rows,
        "never_solved": sum(1 for c in cols["c"] if c == 0),
        "always_solved": sum(1 for c, n in zip(cols["c"], cols["n"]) if c == n),
        "mean_pass_rate": sum(cols["pass_rate"]) / max(n_problems, 1),
        "mean_unique_frac": sum(samples.column("unique_frac").to_pylist()) / max(samples.num_rows, 1),
        "truncation_share": samples.column("finish_reason").to_pylist().count("length") / max(samples.num_rows, 1),
        "template_warnings": template_warnings,
    }
    for k in cfg.passk.ks:
        col = f"pass_at_{k}"
        if col in cols:
            summary[f"pass@{k}"] = sum(cols[col]) / max(n_problems, 1)
    progress("pass@k", f"{n_problems} prompts, mean pass rate {summary['mean_pass_rate']:.3f}, "
             f"kept {kept.num_rows} ({'cached' if hit else 'sampled'})")
    return PassRateArtifact(str(folder / "pass_rate_table.parquet"), str(folder / "samples.parquet"),
                            folder.name, hit, summary)


# -------------------------------------------------------------------------------------- curriculum
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


# ----------------------------------------------------------------------------------------- training
@dataclass(frozen=True)
class TrainArtifact:
    model: ModelArtifact  # the trained policy, exported with save_pretrained
    steps_path: str  # Parquet, one row per optimisation step
    folder: str
    cached: bool
    summary: dict[str, Any]


def _rollout_options(cfg: ExperimentConfig) -> dict | None:
    """The GRPO rollout engine's settings: the servers and timeouts for vllm-server, else `_vllm_options`."""
    if cfg.sampling.engine == "vllm-server":
        return cfg.sampling.server_options()
    if cfg.sampling.engine == "hf":
        return {"hf_compile": cfg.sampling.hf_compile}
    return _vllm_options(cfg)


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


# The pass-rate table's columns that become the trainer's base_rollouts (and the step rows' base/* columns).
BASE_ROLLOUT_COLUMNS = {"pass_rate": "reward_mean", "truncation_share": "truncation_share",
                        "mean_length": "completion_len_mean"}


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
                          base_eval=base_eval, base_rollouts=base_rollouts(curriculum), on_rollouts=traces)


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
    """What names a training folder (see `train_stage`): every input that changes the trained weights."""
    return {"stage": GRPO_STAGE_VERSION, "base": base.model_hash, "curriculum": curriculum.curriculum_id,
            "grpo": grpo_key_dump(cfg.grpo),
            "template": get_template(cfg.prompt.template).key,
            "reward": cfg.reward.model_dump(mode="json", exclude={"workers"}),
            "verifier_version": getattr(verifier_class(cfg.reward.verifier), "version", None),
            "max_new_tokens": cfg.sampling.max_new_tokens, "seed": cfg.seed, "engine": cfg.sampling.engine}


def stopped_training(cfg: ExperimentConfig, base: ModelArtifact,
                     curriculum: CurriculumArtifact) -> tuple[Path, dict[str, Any]] | None:
    """(folder, the trainer's summary) when a serious guard stopped this training stage (the trainer writes
    its rows and a summary tagged `collapsed`, then raises), else None. The flow records such a run (its
    steps, health events and the `collapsed` tag) before it fails, so the warehouse and the report show why."""
    from rlvr_core.grpo.checkpointing import SUMMARY_FILE

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


@dataclass(frozen=True)
class ExportArtifact:
    model: ModelArtifact  # the exported, verified folder (from_pretrained-loadable)
    uri: str  # where it was uploaded and verified in the artifact store
    step: int
    dtype: str
    manifest_sha256: str


def export_stage(trained: TrainArtifact, base: ModelArtifact, store: Any, prefix: str, *, dtype: str = "float32",
                 run_manifest: dict[str, Any] | None = None, progress: Progress = SILENT) -> ExportArtifact:
    """Export the training run's last DeepSpeed checkpoint to safetensors, upload it under `prefix`
    and verify every checksum there (G-lost-ckpt: a checkpoint only counts once exported and verified).

    The local export sits in the training stage's folder and is reused when its files still match its
    manifest; the upload is verified every time.
    """
    local = Path(trained.folder) / f"export-{dtype}"
    try:
        verify_local_export(local)
        progress("export", f"reusing the verified export in {local}")
    except Exception:  # noqa: BLE001 — absent, partial or damaged: export again
        export_checkpoint(Path(trained.folder) / "checkpoints", base_model_dir=base.path, out_dir=local,
                          dtype=dtype, run_manifest=run_manifest, overwrite=True,
                          train_template=trained.summary.get("prompt_template"))
    manifest = json.loads((local / MANIFEST_FILE).read_text())
    upload_export(local, store, prefix)
    mh, th = model_hashes(local)
    progress("export", f"step {manifest['step']} {dtype} exported, uploaded and verified at {store.url(prefix)}")
    return ExportArtifact(ModelArtifact(str(local), f"{trained.model.model_id}-export", mh, th, trained.cached),
                          store.url(prefix), int(manifest["step"]), dtype, file_sha256(local / MANIFEST_FILE))


def experiment_manifest(cfg: ExperimentConfig, data: DataArtifact, model: ModelArtifact, *, config_hash: str,
                        resolved_config: dict[str, Any], template_key: str, extra: dict[str, Any]) -> dict[str, Any]:
    """The run manifest of one experiment (demo or pipeline): config, data hashes, every seed, the base model
    and the template, plus `extra` (run ids, artifact ids)."""
    return manifest_mod.build_manifest(
        config_hash=config_hash, resolved_config=resolved_config,
        datasets={"train": data.train_hash, "test": data.test_hash},
        seeds={"experiment": cfg.seed, "sampling": cfg.sampling.seed, "data": cfg.data.synthetic.seed,
               "warm_start": cfg.model.warm_start.seed, "curriculum": cfg.curriculum.seed},
        model={"id": model.model_id, "hash": model.model_hash, "tokenizer_hash": model.tokenizer_hash,
               "path": model.path, "source": cfg.model.source, "kind": cfg.model.kind, "dtype": cfg.model.dtype,
               "hub": model.info.get("hub")},
        template=template_key, extra={"numerics": numerics(), **extra})
