"""The evaluator: a checkpoint and benchmark files in, one row per sample and the metrics out.

Why one evaluator: the demo's evaluate stage, the trainer's periodic evaluation and `rlvr eval` must give
the same number for the same checkpoint and settings, so all three run `evaluate_spec` below. A benchmark
is a validated `BenchmarkSpec` (`rlvr_core.experiment.benchmarks`, configs/benchmarks/*.yaml); the evaluator

  1. renders each problem with the benchmark's template (few-shot shots included) and samples with the
     sampling engine: one greedy completion per problem when the spec scores `accuracy`, plus `n`
     completions at the spec's temperature (at temperature 0 the one greedy completion is both);
  2. verifies every completion with the headline verifier and with each side-by-side scoring (strict vs
     flexible, ...) in verifier pools that kill hung verifications (G-verifier-hang);
  3. computes the metrics from the per-sample records alone (`compute_metrics` in `rlvr_core.eval.metrics`,
     a pure function that the tests check against hand-computed values), so anyone can recompute them
     from `samples.parquet`.

Metrics (rows of `metrics.parquet`, warehouse table `eval_metrics`): `accuracy_greedy` (the spec's
`accuracy`: the greedy completion is correct) with a 95% Wilson interval and n (G-small-eval); `pass@K`
(unbiased estimator of Chen et al., mean over problems) for the spec's K; `maj@K` (majority vote of the
first K extracted answers, Wilson interval); `mean_reward`; `instruction_accuracy` (ifeval); and always the
diagnostics `truncation_share` (G-truncation), `no_answer_share`, `verifier_error_share`,
`verifier_timeout_share` (G-verifier-error) and `continuation_after_answer_share` (G-stop-seq). A
verifier error share or truncation share above its limit (`EvalLimits`) adds a flag to the benchmark's
summary (`flags`: guard id, metric, value, n, limit); the numbers themselves are unchanged. A metric of a
side-by-side scoring is named `<metric>/<scoring>` (`accuracy_greedy/gsm8k:strict`), a breakdown row
`<metric>[/<scoring>]/<field>=<value>` (`accuracy_greedy/level=Level 3`). The pass@k curve for every k from
1 to n goes to `passk_curves.parquet` (warehouse table `passk_curves`).

Every metric row carries `settings`, the JSON of everything that changes numbers (G-eval-parallel): the
resolved benchmark (its hash, version, data hash, template key, decoding, stops, max tokens, verifier names,
modes and versions) and the run's engine, dtype and parallelism. `rlvr compare` refuses to compare results
whose settings differ.

Output folder (`out`), the run-folder layout of `rlvr_core.records.runrecord` so that a local evaluation and a run
in the artifact store are read the same way::

    evals/samples.parquet   one row per (benchmark, problem, completion)
    evals/metrics.parquet   one row per metric
    passk_curves.parquet    pass@k for k = 1..n, per benchmark and scoring
    eval.json               checkpoint, eval id, per-benchmark settings and summaries, skipped benchmarks
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rlvr_core.artifacts.export import train_template_of
from rlvr_core.core.numerics import numerics
from rlvr_core.core.progress import SILENT, Progress
from rlvr_core.core.stats import wilson_interval
from rlvr_core.data.templates import get_template
from rlvr_core.eval.metrics import (CURVES_FILE, EVAL_FILE, METRICS_FILE, SAMPLES_FILE, EvalLimits, compute_metrics,
                                    continued_after_answer, curves_table, eval_flags, metrics_table, samples_table,
                                    share_row)
from rlvr_core.experiment.benchmarks import (BenchmarkSpec, VerifierSpec, benchmark_data_hash, benchmark_hash,
                                             data_source_record, effective_stop, gold_for, load_benchmark_problems,
                                             parse_benchmark, parse_metric, prompt_template, resolved_benchmark,
                                             scoring_label, scorings)
from rlvr_core.sampling import SamplingParams
from rlvr_core.sampling.models import load_model, model_hashes
from rlvr_core.sampling.vllm import VLLMEngine
from rlvr_core.verifiers.pool import VerifierPool
from rlvr_core.verifiers.registry import can_hang, default_workers

__all__ = ["RunSettings", "BenchmarkResult", "EvalResult", "evaluate", "evaluate_spec", "override_spec", "template_check",
           "template_mismatch_line"]



# --------------------------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class RunSettings:
    """How the completions are produced, beyond the benchmark file: engine, precision, parallelism.

    engine: "hf" (transformers, our decode loop) or "vllm" (an in-process vLLM engine, GPU or its CPU build). dtype: weights dtype. device: torch
    device for hf. tensor_parallel: vLLM tensor-parallel size (hf is always single-process).
    hf_compile: hf's graphed decode step (`HFEngine(compile=)`; None: on for CUDA).
    batch_size: requests decoded together (hf) and problems per engine call = batch_size // n.
    verifier_workers: verifier processes per pool; None = each verifier's default (in-process for verifiers
    that cannot hang, 2 for the others); 0 is refused for a verifier that can hang. verifier_timeout_s: the
    per-verification limit in the item's own time (overruns are killed and counted as `timeout`).
    """

    engine: str = "hf"
    dtype: str = "float32"
    device: str = "cpu"
    tensor_parallel: int = 1
    batch_size: int = 64
    verifier_workers: int | None = None
    verifier_timeout_s: float = 5.0
    hf_compile: bool | None = None

    def pool_workers(self, verifier: str) -> int:
        return default_workers(verifier) if self.verifier_workers is None else self.verifier_workers

    @property
    def parallelism(self) -> str:
        return "single-process" if self.engine == "hf" else f"tp={self.tensor_parallel}"

    def numbers_settings(self) -> dict[str, Any]:
        """The part of these settings stored with every result."""
        return {"engine": self.engine, "dtype": self.dtype, "parallelism": self.parallelism,
                "batch_size": self.batch_size, "verifier_workers": self.verifier_workers,
                "verifier_timeout_s": self.verifier_timeout_s, "numerics": numerics()}


def override_spec(spec: BenchmarkSpec, *, max_problems: int | None = None, n: int | None = None,
                  temperature: float | None = None, max_new_tokens: int | None = None,
                  seed: int | None = None) -> BenchmarkSpec:
    """The spec with command-line overrides applied and validated again (so the hash records them).

    With a new `n`, pass@K / maj@K metrics whose K exceeds it are dropped (and pass@n added), rather than
    refusing the override.
    """
    if all(v is None for v in (max_problems, n, temperature, max_new_tokens, seed)):
        return spec
    d = spec.model_dump(mode="json")
    g = d["generation"]
    if max_problems is not None:
        d["data"]["max_problems"] = max_problems
    if temperature is not None:
        g["temperature"] = temperature
        if temperature == 0:
            g["greedy"], g["n"] = False, 1
    if n is not None:
        g["n"] = n
    if max_new_tokens is not None:
        g["max_new_tokens"] = max_new_tokens
    if seed is not None:
        g["seed"] = seed
    if n is not None or temperature is not None:
        kept = [m for m in d["metrics"] if parse_metric(m)[1] is None or parse_metric(m)[1] <= g["n"]]
        if f"pass@{g['n']}" not in kept and any(parse_metric(m)[0] == "pass" for m in d["metrics"]):
            kept.append(f"pass@{g['n']}")
        if g["temperature"] > 0 and "accuracy" in kept and not g["greedy"]:
            g["greedy"] = True  # a spec that was greedy-only keeps its accuracy when sampled
        d["metrics"] = kept
    return parse_benchmark(d, f"{spec.name} (with overrides)", check_data=False)



# --------------------------------------------------------------------------------------------- results
@dataclass
class BenchmarkResult:
    """One benchmark's evaluation: per-sample records, metric rows, the pass@k curve and a summary."""

    spec: BenchmarkSpec
    settings: dict[str, Any]
    samples: list[dict[str, Any]]
    metrics: list[dict[str, Any]]
    curves: list[dict[str, Any]]
    summary: dict[str, Any]

    @property
    def curve(self) -> dict[int, float]:
        """Headline pass@K for the K the spec lists (what the demo reports)."""
        return {int(k): v for k, v in self.summary["passk"].items()}


@dataclass
class EvalResult:
    eval_id: str
    checkpoint: str
    benchmarks: list[BenchmarkResult]
    skipped: list[dict[str, str]] = field(default_factory=list)
    out: Path | None = None

    def samples_table(self) -> pa.Table:
        return samples_table([r for b in self.benchmarks for r in b.samples])

    def metrics_table(self) -> pa.Table:
        return metrics_table([r for b in self.benchmarks for r in b.metrics])

    def curves_table(self) -> pa.Table:
        return curves_table([r for b in self.benchmarks for r in b.curves])

    def record(self) -> dict[str, Any]:
        """What eval.json holds."""
        return {"eval_id": self.eval_id, "checkpoint": self.checkpoint, "skipped": self.skipped,
                "benchmarks": {b.spec.name: {"settings": b.settings, "summary": b.summary} for b in self.benchmarks}}

    def write(self, out: str | Path) -> Path:
        out = Path(out)
        (out / "evals").mkdir(parents=True, exist_ok=True)
        pq.write_table(self.samples_table(), out / SAMPLES_FILE)
        pq.write_table(self.metrics_table(), out / METRICS_FILE)
        pq.write_table(self.curves_table(), out / CURVES_FILE)
        (out / EVAL_FILE).write_text(json.dumps(self.record(), indent=2, default=str))
        self.out = out
        return out




# --------------------------------------------------------------------------------------------- sampling
def _verify(spec_v: VerifierSpec, pairs: list[tuple[str, Any]], run: RunSettings):
    """Outcomes of one scoring for (completion, gold) pairs, and the verifier's version."""
    options = dict(spec_v.options) | ({"mode": spec_v.mode} if spec_v.mode is not None else {})
    with VerifierPool(spec_v.name, options, workers=run.pool_workers(spec_v.name),
                      timeout_s=run.verifier_timeout_s) as pool:
        return pool.verify_many(pairs), pool.version


def _instructions(outcome, mode: str | None) -> tuple[int | None, int | None]:
    """ifeval: instructions followed / given, from the outcome's per-instruction lists."""
    lst = (outcome.extra or {}).get(mode or "strict")
    if not isinstance(lst, list):
        return None, None
    return sum(bool(x) for x in lst), len(lst)


def evaluate_spec(engine, tokenizer, spec: BenchmarkSpec, *, run: RunSettings = RunSettings(),
                  problems: list[dict[str, Any]] | None = None, eval_id: str = "eval", checkpoint: str = "",
                  identity: dict[str, Any] | None = None, progress: Progress = SILENT,
                  timings: dict[str, float] | None = None, limits: EvalLimits = EvalLimits(),
                  train_template: str | None = None) -> BenchmarkResult:
    """Evaluate one benchmark with a built sampling engine (an in-memory model works: the trainer uses this).

    problems: the benchmark's problems (default: `load_benchmark_problems(spec)`).
    identity: what was evaluated (model path and hashes), stored next to the settings but not compared.
    train_template: the template (id@version) the checkpoint was trained with (`train_template_of`); None for a
        model we did not train. Compared with the benchmark's (`template_check`, G-prompt-mismatch).
    timings: if given, gets `generate_s` and `verify_s` added (the benchmark's throughput split).
    limits: shares that flag the result (`summary["flags"]`, `eval_flags`; a progress line each).
    """
    t0 = time.monotonic()
    source = data_source_record(spec) if problems is None else {"kind": "given"}
    problems = load_benchmark_problems(spec) if problems is None else problems
    template = prompt_template(spec)
    stop = tuple(effective_stop(spec))
    stage = f"eval/{eval_id}/{spec.name}"
    prompts = [template.render(p["question"], tokenizer=tokenizer) for p in problems]
    generated, t_gen = _generate(engine, prompts, problems, _passes(spec, stop), run, progress, stage)

    t1 = time.monotonic()
    pairs = [(s.text, gold_for(spec, p)) for _, p, s in generated]
    outcomes = {scoring_label(v): _verify(v, pairs, run) for v in scorings(spec)}
    t_ver = time.monotonic() - t1
    if timings is not None:
        timings["generate_s"] = timings.get("generate_s", 0.0) + t_gen
        timings["verify_s"] = timings.get("verify_s", 0.0) + t_ver
        timings["generated_tokens"] = timings.get("generated_tokens", 0) + sum(len(s.token_ids) for _, _, s in generated)
        timings["samples"] = timings.get("samples", 0) + len(generated)

    records = _records(spec, generated, outcomes, run, eval_id=eval_id, checkpoint=checkpoint,
                       template_key=template.key)
    settings = _settings(spec, problems, outcomes, run, template_key=template.key, stop=stop,
                         train_template=train_template)
    if getattr(engine, "environment_settings", None) is not None:  # multi-turn: the environment changes the numbers
        settings["environment"] = engine.environment_settings
    if settings["template_mismatch"]:
        progress(stage, f"warning: {template_mismatch_line(spec, train_template)}")
    metrics, curves, summary = compute_metrics(spec, problems, records, settings, eval_id=eval_id, checkpoint=checkpoint)
    summary.update({"benchmark_hash": settings["benchmark_hash"], "identity": identity or {}, "data_source": source,
                    "train_template": train_template, "template_mismatch": settings["template_mismatch"],
                    "duration_s": round(time.monotonic() - t0, 3), "generate_s": round(t_gen, 3),
                    "verify_s": round(t_ver, 3)})
    environment = environment_summary(generated)
    if environment is not None:
        summary["environment"] = environment
        metrics += environment_rows(environment, metrics[0])
        progress(stage, "tools: greedy tool-call rate {tool_call_rate:.3f} [{lo:.3f}, {hi:.3f}], {turns_mean:.2f} "
                        "turns, tool errors {tool_error_share:.3f}, cut {cut_share:.3f}".format(
                            lo=environment["tool_call_rate_ci"][0], hi=environment["tool_call_rate_ci"][1],
                            **environment))
    summary["flags"] = eval_flags(metrics, limits)
    for f in summary["flags"]:
        progress(stage, "flag " + f["reason"])
    acc = summary.get("accuracy_greedy")
    progress(stage, (f"accuracy {acc:.3f} [{summary['accuracy_greedy_ci'][0]:.3f}, "
                     f"{summary['accuracy_greedy_ci'][1]:.3f}] n={len(problems)}" if acc is not None else
                     f"n={len(problems)}") + "".join(f"; pass@{k} {v:.3f}" for k, v in summary["passk"].items()))
    return BenchmarkResult(spec, settings, records, metrics, curves, summary)


def environment_summary(generated: list[tuple[bool, dict, Any]]) -> dict[str, Any] | None:
    """A multi-turn evaluation's tool use on the greedy completions (all completions when there is no greedy
    pass): the share that called a tool (Wilson 95% interval, n), turns, the share of calls that failed, the share
    a budget cut. None when the engine ran no environment."""
    envs = [s.env for greedy, _, s in generated if greedy and s.env is not None]
    envs = envs or [s.env for _, _, s in generated if s.env is not None]
    if not envs:
        return None
    n, calls = len(envs), sum(e["tool_calls"] for e in envs)
    used, errors = sum(e["tool_calls"] > 0 for e in envs), sum(e["tool_errors"] for e in envs)
    cut = sum(e["end"] != "done" for e in envs)
    return {"n": n, "tool_call_rate": used / n, "tool_call_rate_ci": list(wilson_interval(used, n)),
            "turns_mean": sum(e["turns"] for e in envs) / n, "tool_error_share": errors / calls if calls else 0.0,
            "cut_share": cut / n, "used": used, "calls": calls, "errors": errors, "cut": cut}


def environment_rows(environment: dict[str, Any], like: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool use as metric rows beside accuracy (eval_metrics, the nightly report): the greedy tool-call rate
    and the shares of failed calls and of cut trajectories with Wilson intervals and n, and the mean turns."""
    e, base = environment, {k: like[k] for k in ("eval_id", "benchmark", "benchmark_version", "checkpoint", "settings")}
    rows = [share_row("tool_call_rate", e["used"], e["n"]), share_row("tool_error_share", e["errors"], e["calls"]),
            share_row("cut_share", e["cut"], e["n"]),
            {"metric": "turns_mean", "value": e["turns_mean"], "n": e["n"], "ci_low": None, "ci_high": None}]
    return [{**base, "breakdown_field": None, "breakdown_value": None, "scoring": None, **r} for r in rows]


def _passes(spec: BenchmarkSpec, stop: tuple[str, ...]) -> list[tuple[bool, SamplingParams]]:
    """(greedy, params) per sampling pass: one greedy completion when the spec scores accuracy (or samples
    at temperature 0), plus `n` completions at the spec's temperature."""
    g = spec.generation
    passes: list[tuple[bool, SamplingParams]] = []
    if g.temperature == 0 or g.greedy:
        passes.append((True, SamplingParams(n=1, temperature=0.0, top_p=g.top_p, max_new_tokens=g.max_new_tokens,
                                            stop=stop, seed=g.seed)))
    if g.temperature > 0:
        passes.append((False, SamplingParams(n=g.n, temperature=g.temperature, top_p=g.top_p,
                                             max_new_tokens=g.max_new_tokens, stop=stop, seed=g.seed)))
    return passes


def _generate(engine, prompts: list[str], problems: list[dict[str, Any]], passes: list[tuple[bool, SamplingParams]],
              run: RunSettings, progress: Progress, stage: str) -> tuple[list[tuple[bool, dict, Any]], float]:
    """[(greedy, problem, Sample)] over every pass, and the seconds spent generating."""
    generated: list[tuple[bool, dict, Any]] = []
    t_gen = 0.0
    for is_greedy, params in passes:
        # Problems per engine call: a batch's worth of requests, as the demo always did (progress lines).
        chunk = max(1, run.batch_size // params.n)
        for i in range(0, len(problems), chunk):
            part = problems[i:i + chunk]
            t1 = time.monotonic()
            groups = engine.generate(prompts[i:i + chunk], [p["id"] for p in part], params)
            t_gen += time.monotonic() - t1
            generated += [(is_greedy, p, s) for p, grp in zip(part, groups) for s in grp]
            progress(stage, f"{'greedy' if is_greedy else 'sampled'} {min(i + chunk, len(problems))}/{len(problems)} "
                     f"problems × {params.n}", every_s=5.0)
    return generated, t_gen


def _records(spec: BenchmarkSpec, generated: list[tuple[bool, dict, Any]], outcomes: dict[str, tuple[list, str]],
             run: RunSettings, *, eval_id: str, checkpoint: str, template_key: str) -> list[dict[str, Any]]:
    """One samples.parquet row per completion: the headline scoring's outcome, the side-by-side ones."""
    g = spec.generation
    headline = scoring_label(spec.verifier)
    h_outs, h_version = outcomes[headline]
    spec_hash = benchmark_hash(spec)
    records = []
    for i, (is_greedy, p, s) in enumerate(generated):
        o = h_outs[i]
        followed, total = _instructions(o, spec.verifier.mode) if spec.verifier.name == "ifeval" else (None, None)
        side = {}
        for v in spec.side_by_side:
            lab = scoring_label(v)
            so = outcomes[lab][0][i]
            sf, st = _instructions(so, v.mode) if v.name == "ifeval" else (None, None)
            side[lab] = {"status": so.status.value, "extracted": so.extracted, "reward": float(so.reward),
                         "instructions_followed": sf, "instructions_total": st}
        records.append({
            "eval_id": eval_id, "benchmark": spec.name, "benchmark_version": spec.version,
            "benchmark_hash": spec_hash, "checkpoint": checkpoint, "problem_id": p["id"],
            "sample_index": s.sample_index, "greedy": is_greedy, "response": s.text,
            "extracted": o.extracted, "status": o.status.value, "reward": float(o.reward),
            "finish_reason": s.finish_reason, "length": len(s.token_ids), "prompt_template": template_key,
            "temperature": 0.0 if is_greedy else g.temperature, "top_p": g.top_p, "max_new_tokens": g.max_new_tokens,
            "dtype": run.dtype, "engine": run.engine, "seed": s.seed, "verifier": spec.verifier.name,
            "verifier_mode": spec.verifier.mode, "verifier_version": h_version, "scoring": headline,
            "continued_after_answer": continued_after_answer(s.text), "instructions_followed": followed,
            "instructions_total": total, "side_by_side": side, "meta": p.get("meta") or {},
        })
    return records


def _settings(spec: BenchmarkSpec, problems: list[dict[str, Any]], outcomes: dict[str, tuple[list, str]],
              run: RunSettings, *, template_key: str, stop: tuple[str, ...],
              train_template: str | None) -> dict[str, Any]:
    """Everything that changes the numbers (stored with every metric row; `rlvr compare` checks it)."""
    g = spec.generation
    return {
        "benchmark": spec.name, "benchmark_version": spec.version, "benchmark_hash": benchmark_hash(spec),
        "data_hash": benchmark_data_hash(spec, problems=problems), "n_problems": len(problems),
        "template": template_key, "temperature": g.temperature, "top_p": g.top_p, "n": g.n,
        "greedy": g.temperature == 0 or g.greedy, "seed": g.seed, "stop": list(stop),
        "max_new_tokens": g.max_new_tokens, "verifier": spec.verifier.name, "verifier_mode": spec.verifier.mode,
        "verifier_versions": {lab: outcomes[lab][1] for lab in outcomes},
        "side_by_side": [scoring_label(v) for v in spec.side_by_side],
        "resolved": resolved_benchmark(spec)["resolved"], **run.numbers_settings(),
        **template_check(spec, train_template),
    }


def template_check(spec: BenchmarkSpec, train_template: str | None) -> dict[str, Any]:
    """G-prompt-mismatch: {"train_template", "template_mismatch"} for a checkpoint trained with `train_template`
    evaluated on `spec`. The benchmark's prompt format is its named template (id@version; a few-shot variant of
    it shows the same format), and a mismatch is flagged, not refused: evaluating on a benchmark's own format is
    legitimate, but the number then understates what the model learned. No training template (a base or hub
    model) is no mismatch."""
    eval_template = get_template(spec.prompt.template).key
    return {"train_template": train_template,
            "template_mismatch": train_template is not None and train_template != eval_template}


def template_mismatch_line(spec: BenchmarkSpec, train_template: str | None) -> str:
    return (f"G-prompt-mismatch: {spec.name} prompts with {get_template(spec.prompt.template).key} but the "
            f"checkpoint was trained with {train_template}; the score may understate what it learned")


# --------------------------------------------------------------------------------------------- entry point
def build_engine(checkpoint_dir: str | Path, run: RunSettings, *, chat: bool = False,
                 llm_options: dict[str, Any] | None = None):
    """(engine, tokenizer) for a model folder (from_pretrained on local files only).

    vllm: an in-process engine given the pipeline's tokenizer object (prompts encode as the hf engine's do)
    and `llm_options` (`rlvr_core.sampling.vllm.llm_options`: KV cache size or GPU memory share). Close it
    when done (`opened_engine` does): it holds its KV cache and a torch.distributed group."""
    from transformers import AutoTokenizer

    if run.engine == "hf":
        from rlvr_core.sampling.hf import HFEngine

        model, tok = load_model(checkpoint_dir, run.dtype)
        return HFEngine(model, tok, batch_size=run.batch_size, device=run.device, add_special_tokens=not chat,
                        compile=run.hf_compile), tok
    if run.engine == "vllm":
        tok = AutoTokenizer.from_pretrained(checkpoint_dir, local_files_only=True)
        kw = {**(llm_options or {}), "dtype": run.dtype}
        if run.tensor_parallel > 1:
            kw["tensor_parallel_size"] = run.tensor_parallel
        return VLLMEngine(str(checkpoint_dir), tokenizer=tok, add_special_tokens=not chat, **kw), tok
    raise ValueError(f"unknown engine {run.engine!r}; known: hf, vllm")


@contextlib.contextmanager
def opened_engine(checkpoint_dir: str | Path, run: RunSettings, *, chat: bool = False,
                  llm_options: dict[str, Any] | None = None):
    """`build_engine` as a context: yields (engine, tokenizer) and closes the engine on the way out."""
    engine, tok = build_engine(checkpoint_dir, run, chat=chat, llm_options=llm_options)
    try:
        yield engine, tok
    finally:
        close = getattr(engine, "close", None)
        if close is not None:
            close()


def _check_verifier_workers(specs: Sequence[BenchmarkSpec], run: RunSettings) -> None:
    """In-process verification (`verifier_workers=0`) of a verifier that can hang is refused before any
    sampling, not after it."""
    if run.verifier_workers != 0:
        return
    hangers = sorted({v.name for spec in specs for v in scorings(spec) if can_hang(v.name)})
    if hangers:
        raise ValueError(f"verifier_workers=0 runs verifiers in-process, where nothing can stop a hang, and "
                         f"{', '.join(hangers)} can hang: use verifier workers >= 1 (or leave it unset)")


def evaluate(checkpoint_dir: str | Path, specs: Sequence[BenchmarkSpec], *, out: str | Path | None = None,
             run: RunSettings = RunSettings(), eval_id: str | None = None, checkpoint: str | None = None,
             model_kind: str | None = None, max_problems: int | None = None, n: int | None = None,
             temperature: float | None = None, max_new_tokens: int | None = None, seed: int | None = None,
             progress: Progress = SILENT, timings: dict[str, dict[str, float]] | None = None,
             llm_options: dict[str, Any] | None = None, limits: EvalLimits = EvalLimits(),
             model_source: dict[str, Any] | None = None) -> EvalResult:
    """Evaluate a model folder on benchmarks; write the results to `out` (when given) and return them.

    model_kind: "base" or "chat"; benchmarks for the other kind are skipped and listed in `skipped`
        (G-chat-template). None evaluates every benchmark as written.
    The template the checkpoint was trained with (its `export_manifest.json`) is compared with each benchmark's:
        a mismatch is logged and flagged in the settings and summary (`template_check`, G-prompt-mismatch).
    max_problems, n, temperature, max_new_tokens, seed: overrides applied to every spec (`override_spec`);
        they change the benchmark hash, so the results say they were overridden.
    llm_options: for the vllm engine (`build_engine`).
    limits: shares that flag a benchmark's result (`EvalLimits`; its summary's `flags`).
    model_source: where the folder came from (a hub snapshot's `record()`: repo, revision, commit, file
        hashes), stored in every summary's `identity.hub`.
    """
    path = Path(checkpoint_dir)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"checkpoint {path} has no config.json (a Hugging Face model folder, e.g. an "
                                "exported checkpoint)")
    checkpoint = checkpoint or str(path)
    eval_id = eval_id or path.name
    model_hash, tok_hash = model_hashes(path)
    identity = {"model_path": str(path.resolve()), "model_hash": model_hash, "tokenizer_hash": tok_hash}
    if model_source:
        identity["hub"] = model_source
    train_template = train_template_of(path)
    todo, skipped = [], []
    for spec in specs:
        if model_kind is not None and spec.prompt.model_kind != model_kind:
            skipped.append({"benchmark": spec.name, "why": f"for {spec.prompt.model_kind} models; this is a "
                            f"{model_kind} model (G-chat-template)"})
            continue
        todo.append(override_spec(spec, max_problems=max_problems, n=n, temperature=temperature,
                                  max_new_tokens=max_new_tokens, seed=seed))
    _check_verifier_workers(todo, run)
    results: list[BenchmarkResult | None] = [None] * len(todo)
    # One engine per prompt kind (chat prompts skip the tokenizer's special tokens), one engine at a time.
    for chat in (False, True):
        mine = [i for i, spec in enumerate(todo) if (spec.prompt.model_kind == "chat") == chat]
        if not mine:
            continue
        with opened_engine(path, run, chat=chat, llm_options=llm_options) as (engine, tok):
            for i in mine:
                t = {} if timings is not None else None
                results[i] = evaluate_spec(engine, tok, todo[i], run=run, eval_id=eval_id, checkpoint=checkpoint,
                                           identity=identity, progress=progress, timings=t, limits=limits,
                                           train_template=train_template)
                if timings is not None:
                    timings[todo[i].name] = t
    result = EvalResult(eval_id, checkpoint, results, skipped)
    if out is not None:
        result.write(out)
    return result
