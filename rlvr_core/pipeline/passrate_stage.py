"""The pass-rate stage: n sampled completions per training prompt from the base model, verified as training scores
them, tabulated as per-problem pass rates and pass@k (cached on data, model, template and sampling settings)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rlvr_core.core.manifest import rows_sha256
from rlvr_core.core.numerics import numerics
from rlvr_core.core.progress import SILENT, Progress
from rlvr_core.data.curriculum import filter_by_pass_rate, pass_rate_table
from rlvr_core.data.templates import get_template
from rlvr_core.eval.evaluate import opened_engine
from rlvr_core.experiment.config import ExperimentConfig
from rlvr_core.pipeline.base_model_stage import check_template_at_start
from rlvr_core.pipeline.cache import cached_dir
from rlvr_core.pipeline.evaluation_stage import run_settings, vllm_options
from rlvr_core.pipeline.stage_outputs import DataArtifact, ModelArtifact
from rlvr_core.sampling.environment_engine import with_environment
from rlvr_core.sampling.verified import sample_and_verify
from rlvr_core.verifiers.registry import verifier_class

# Bump when the stage's code changes what it produces, so stale cache entries are not reused.
PASSRATE_STAGE_VERSION = "1"


@dataclass(frozen=True)
class PassRateArtifact:
    table_path: str
    samples_path: str
    table_id: str
    cached: bool
    summary: dict[str, Any]


def _sampling_kwargs(cfg: ExperimentConfig, *, n: int, temperature: float, max_new_tokens: int) -> dict[str, Any]:
    """Sampling settings for the pass-rate stage, scored as training scores (`reward:`)."""
    return dict(template_id=cfg.prompt.template, n=n, temperature=temperature, top_p=cfg.sampling.top_p,
                max_new_tokens=max_new_tokens, seed=cfg.sampling.seed, batch_size=cfg.sampling.batch_size,
                verifier=cfg.reward.verifier, verifier_mode=cfg.reward.mode,
                verifier_workers=cfg.reward.workers, verifier_timeout_s=cfg.reward.timeout_s)


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
           "dtype": cfg.model.dtype, "engine": run_settings(cfg).engine, "numerics": numerics(),
           "verifier_version": getattr(verifier_class(cfg.reward.verifier), "version", None),
           **{k: v for k, v in kw.items() if k not in ("batch_size", "verifier_workers", "template_id")},
           **({"environment": cfg.environment.key_dump()} if cfg.environment.multi_turn else {})}

    def build(tmp: Path) -> None:
        t0 = time.monotonic()
        with opened_engine(model.path, run_settings(cfg), llm_options=vllm_options(cfg)) as (engine, _):
            engine = with_environment(cfg.environment, engine, get_template(cfg.prompt.template))
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
