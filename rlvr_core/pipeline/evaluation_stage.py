"""The evaluation stage and what the other stages share with it: the held-out benchmark spec of an
experiment (`held_out_spec`, `held_out_problems`), the base and trained evaluation (`evaluate_stage`), the
trainer's periodic evaluation (`held_out_eval`) and the engine settings of a sampling stage (`run_settings`,
`vllm_options`, imported from here by the pass-rate and training stages). Prefect-free, like every stage
(`rlvr_core.pipeline.stages` re-exports the stage functions and artifacts)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from rlvr_core.artifacts.export import train_template_of
from rlvr_core.core.passk import default_ks
from rlvr_core.core.progress import SILENT, Progress
from rlvr_core.data import gold_of
from rlvr_core.data.templates import get_template
from rlvr_core.sampling.environment_engine import with_environment
from rlvr_core.eval.evaluate import RunSettings, evaluate_spec, opened_engine
from rlvr_core.eval.metrics import EvalLimits, curves_table, metrics_table, samples_table
from rlvr_core.experiment.benchmarks import load_benchmark, load_benchmark_problems, parse_benchmark
from rlvr_core.experiment.config import ExperimentConfig
from rlvr_core.pipeline.stage_outputs import DataArtifact, ModelArtifact
from rlvr_core.sampling.vllm import llm_options
from rlvr_core.verifiers.registry import default_mode


# The synthetic benchmark the demo evaluates on (nightly evaluations name their suite by it); bump when what it
# measures changes.
SYNTHETIC_BENCHMARK_VERSION = "2"  # 2: 32 samples per problem (pass@k to 32); 1 had 8


@dataclass(frozen=True)
class EvalArtifact:
    samples: pa.Table
    metrics: pa.Table
    curve: dict[int, float]
    summary: dict[str, Any]
    curves: pa.Table | None = None  # pass@k for k = 1..n per scoring (warehouse `passk_curves` columns)


def vllm_options(cfg: ExperimentConfig) -> dict | None:
    """vLLM engine settings from `sampling` (memory share or KV cache size; the tensor-parallel size travels
    separately: in `RunSettings` for evaluation, and GRPO runs one engine per rank). None for hf."""
    if cfg.sampling.engine not in ("vllm", "vllm-server"):
        return None

    return llm_options(cfg.sampling, tensor_parallel=False)


def _eval_limits(cfg: ExperimentConfig) -> EvalLimits:
    """The shares that flag an evaluation (G-verifier-error, G-truncation), from the `eval:` section."""
    return EvalLimits(max_verifier_error_share=cfg.eval.max_verifier_error_share,
                      max_truncation_share=cfg.eval.max_truncation_share)


def held_out_eval(cfg: ExperimentConfig, data: DataArtifact,
                  on_samples: Callable[[list[dict], list[dict], int], None] | None = None
                  ) -> Callable[[Any, Any], dict[str, float]]:
    """The trainer's periodic evaluation (every `grpo.eval_every` steps and after the last; G-no-eval,
    G-reward-hacking): the evaluator (`rlvr_core.eval.evaluate`) on the same held-out benchmark as
    `evaluate_stage`, so the curve's last point is the trained model's `accuracy_greedy`. Greedy accuracy
    always; pass@k from `grpo.eval_samples` sampled completions per problem at `eval.temperature` when
    both are > 0, on the first `grpo.eval_max_problems` held-out problems (`periodic_problems`). Always the
    hf engine on the trainer's own module: a vLLM engine would need a weight push for a handful of greedy
    problems (docs/engines.md). `on_samples(samples, problems, start_ns)` gets each evaluation's sample rows (the
    rollout traces' wrong evaluation samples)."""
    from rlvr_core.sampling.hf import HFEngine

    n = cfg.grpo.eval_samples
    spec = held_out_spec(cfg, n=n if n else None, greedy_only=not n)
    problems = periodic_problems(cfg, held_out_problems(cfg, data, spec))
    run = run_settings(cfg, engine="hf")

    def evaluate(model: Any, tokenizer: Any) -> dict[str, float]:
        # the trained module itself, DeepSpeed's hooks on it: graphed only when asked for (docs/engines.md)
        engine = HFEngine(model, tokenizer, batch_size=cfg.sampling.batch_size, compile=bool(cfg.sampling.hf_compile))
        engine = with_environment(cfg.environment, engine, get_template(cfg.prompt.template))
        t0 = time.time_ns()
        res = evaluate_spec(engine, tokenizer, spec, run=run, problems=problems, eval_id="periodic")
        if on_samples is not None:
            on_samples(res.samples, problems, t0)
        # `<name>_n` lets the G-reward-hacking guard tell a real drop from binomial noise.
        out = {"greedy_pass_at_1": res.summary["accuracy_greedy"], "greedy_pass_at_1_n": float(len(problems))}
        if n:
            out.update({f"pass_at_{k}": v for k, v in res.curve.items()})
        return out

    return evaluate


def periodic_problems(cfg: ExperimentConfig, problems: list[dict]) -> list[dict]:
    """The fixed slice the periodic evaluation scores: the first `grpo.eval_max_problems` held-out problems."""
    return problems[: cfg.grpo.eval_max_problems or None]


def base_reference(cfg: ExperimentConfig, data: DataArtifact, base_eval: "EvalArtifact") -> dict[str, float]:
    """The base model's `greedy_pass_at_1` on the periodic evaluation's slice, from the base evaluation's greedy
    samples (same problems, template and greedy decoding), for G-reward-hacking's reference point; `{}` when
    the base evaluation lacks a problem of the slice."""
    keep = {p["id"] for p in periodic_problems(cfg, held_out_problems(cfg, data, held_out_spec(cfg)))}
    hits = {r["problem_id"]: r["status"] == "correct" for r in base_eval.samples.to_pylist()
            if r["greedy"] and r["problem_id"] in keep}
    if set(hits) != keep:
        return {}
    return {"greedy_pass_at_1": sum(hits.values()) / len(hits), "greedy_pass_at_1_n": float(len(hits))}


def held_out_spec(cfg: ExperimentConfig, *, n: int | None = None, greedy_only: bool = False):
    """The experiment's held-out evaluation as a benchmark spec, so it runs through the evaluator.

    Synthetic data: configs/benchmarks/synthetic.yaml with the config's data, template, decoding and
    verifier written into it; with the demo's defaults it is that file exactly (same benchmark hash), so
    `rlvr eval CHECKPOINT --benchmark synthetic` reproduces the demo's numbers. Other data sources: the
    same settings on the config's test file (benchmark `<source>_heldout`, zero-shot).
    n: sampled completions (default eval.n_samples). greedy_only: the greedy completion alone (temperature 0).
    eval.temperature 0 is greedy-only as well (n samples at temperature 0 would all be the greedy one).
    """
    base = load_benchmark("synthetic").model_dump(mode="json")
    d = json.loads(json.dumps(base))
    template = get_template(cfg.prompt.template)
    if cfg.data.source == "synthetic":
        d["data"]["synthetic"] = cfg.data.synthetic.model_dump(mode="json")
    elif cfg.data.benchmark is not None:  # the benchmark's evaluated split, read where the data stage read it
        bench = load_benchmark(cfg.data.benchmark, check_data=False)
        d["name"] = f"{cfg.data.source}_heldout"
        d["description"] = f"the evaluated split of benchmark {bench.name}, with the experiment's settings"
        d["data"] = bench.data.model_dump(mode="json", exclude={"max_problems", "subset_seed"})
    else:
        d["name"] = f"{cfg.data.source}_heldout"
        d["description"] = f"the held-out split of the experiment's {cfg.data.source} data"
        d["data"] = {"source": cfg.data.source, "split": "test", "path": str(Path(cfg.data.test_path).resolve())}
    d["data"]["max_problems"] = cfg.eval.max_problems
    d["prompt"] = {"template": template.id, "model_kind": template.kind}
    n = cfg.eval.n_samples if n is None else n
    greedy_only = greedy_only or cfg.eval.temperature == 0
    d["generation"] = {"temperature": 0.0 if greedy_only else cfg.eval.temperature, "top_p": cfg.sampling.top_p,
                       "max_new_tokens": cfg.eval.max_new_tokens, "n": 1 if greedy_only else n,
                       "greedy": not greedy_only, "seed": cfg.sampling.seed}
    verifier = {"name": cfg.eval.verifier, "mode": cfg.eval.verifier_mode or default_mode(cfg.eval.verifier)}
    d["verifier"] = verifier
    # The file's side-by-side scorings (gsm8k strict next to flexible) where they are another mode of the
    # same verifier; none for other verifiers.
    d["side_by_side"] = [v for v in base["side_by_side"]
                         if v["name"] == verifier["name"] and v.get("mode") != verifier["mode"]]
    d["metrics"] = ["accuracy"] + [f"pass@{k}" for k in default_ks(d["generation"]["n"])]
    d["breakdown"] = []
    return parse_benchmark(d, "<held-out evaluation of the experiment config>", check_data=False)


def held_out_problems(cfg: ExperimentConfig, data: DataArtifact, spec) -> list[dict]:
    """The spec's problems, checked against the data stage's held-out rows (same ids, same order).

    Synthetic: the benchmark generates them itself (as `rlvr eval` does) and they must be the data stage's
    test rows; a mismatch means the generator changed under one of them. Other sources: the data stage's
    rows (already read through the loaders).
    """
    rows = data.test_rows()[: cfg.eval.max_problems or None]
    if spec.data.source != "synthetic":
        return rows
    problems = load_benchmark_problems(spec)
    if [p["id"] for p in problems] != [r["id"] for r in rows] or any(
            p["question"] != r["question"] or p["answer"] != gold_of(r)
            for p, r in zip(problems, rows)):
        raise ValueError(f"the synthetic benchmark's problems differ from the data stage's test rows "
                         f"({data.test_path}): the generator and the cached data disagree")
    return problems


def run_settings(cfg: ExperimentConfig, engine: str | None = None):
    """How a sampling stage produces completions: `sampling.engine` unless told otherwise (vllm-server serves
    GRPO rollouts; pass rates and evaluation then run on the in-process vllm engine)."""
    engine = engine or cfg.sampling.engine
    engine = "vllm" if engine == "vllm-server" else engine
    tp = cfg.sampling.vllm_tensor_parallel_size if engine == "vllm" else 1
    return RunSettings(engine=engine, dtype=cfg.model.dtype, batch_size=cfg.sampling.batch_size, tensor_parallel=tp,
                       verifier_workers=cfg.eval.verifier_workers, verifier_timeout_s=cfg.eval.verifier_timeout_s,
                       hf_compile=cfg.sampling.hf_compile)


def evaluate_stage(cfg: ExperimentConfig, data: DataArtifact, model: ModelArtifact, *, eval_id: str = "base",
                   checkpoint: str = "base", progress: Progress = SILENT) -> EvalArtifact:
    """Greedy accuracy (with Wilson 95% CI and n) and sampled pass@k on the held-out split, through the
    evaluator (`rlvr_core.eval.evaluate`) with `held_out_spec(cfg)`: the code path of `rlvr eval`.

    An exported checkpoint's training template (its export manifest) is compared with the config's: the
    pipeline evaluates with the training template by construction, the nightly flow with its own config's, so
    a mismatch there is flagged in the settings and the summary (`train_template`, `template_mismatch`)."""
    spec = held_out_spec(cfg)
    problems = held_out_problems(cfg, data, spec)
    run = run_settings(cfg)
    identity = {"model_path": model.path, "model_hash": model.model_hash, "tokenizer_hash": model.tokenizer_hash}
    with opened_engine(model.path, run, llm_options=vllm_options(cfg)) as (engine, tok):
        engine = with_environment(cfg.environment, engine, get_template(cfg.prompt.template))
        res = evaluate_spec(engine, tok, spec, run=run, problems=problems, eval_id=eval_id,
                            checkpoint=checkpoint, identity=identity, progress=progress, limits=_eval_limits(cfg),
                            train_template=train_template_of(model.path))
    s = res.summary
    summary = {"accuracy_greedy": s["accuracy_greedy"], "accuracy_greedy_ci": s["accuracy_greedy_ci"], "n": s["n"],
               "passk": s["passk"],
               **{k: s[k] for k in ("truncation_share", "verifier_error_share", "verifier_timeout_share",
                                    "no_answer_share", "continuation_after_answer_share", "train_template",
                                    "template_mismatch")},
               "benchmark": spec.name, "benchmark_version": spec.version, "benchmark_hash": s["benchmark_hash"],
               "duration_s": s["duration_s"], "flags": s["flags"],
               **({"environment": s["environment"]} if "environment" in s else {})}
    return EvalArtifact(samples_table(res.samples), metrics_table(res.metrics), res.curve, summary,
                        curves_table(res.curves))
