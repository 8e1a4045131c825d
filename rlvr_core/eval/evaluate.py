"""The evaluator: a checkpoint and benchmark files in, one row per sample and the metrics out.

Why one evaluator: the demo's evaluate stage, the trainer's periodic evaluation and `rlvr eval` must give
the same number for the same checkpoint and settings, so all three run `evaluate_spec` below. A benchmark
is a validated `BenchmarkSpec` (`rlvr_core.experiment.benchmarks`, configs/benchmarks/*.yaml); the evaluator

  1. renders each problem with the benchmark's template (few-shot shots included) and samples with the
     sampling engine: one greedy completion per problem when the spec scores `accuracy`, plus `n`
     completions at the spec's temperature (at temperature 0 the one greedy completion is both);
  2. verifies every completion with the headline verifier and with each side-by-side scoring (strict vs
     flexible, ...) in verifier pools that kill hung verifications (G-verifier-hang);
  3. computes the metrics from the per-sample records alone (`compute_metrics`, a pure function that the
     tests check against hand-computed values), so anyone can recompute them from `samples.parquet`.

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
import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rlvr_core.artifacts.export import train_template_of
from rlvr_core.core.numerics import numerics
from rlvr_core.core.passk import pass_at_k, passk_curve
from rlvr_core.core.progress import SILENT, Progress
from rlvr_core.core.stats import wilson_interval
from rlvr_core.data.templates import get_template
from rlvr_core.experiment.benchmarks import (BenchmarkSpec, VerifierSpec, benchmark_data_hash, benchmark_hash,
                                             data_source_record,
                                             effective_stop, gold_for, load_benchmark_problems, parse_benchmark,
                                             parse_metric, prompt_template, resolved_benchmark, scoring_label, scorings)
from rlvr_core.sampling import SamplingParams
from rlvr_core.sampling.models import load_model, model_hashes
from rlvr_core.sampling.vllm import VLLMEngine
from rlvr_core.verifiers.pool import VerifierPool
from rlvr_core.verifiers.registry import can_hang, default_workers

__all__ = ["RunSettings", "EvalLimits", "eval_flags", "BenchmarkResult", "EvalResult", "evaluate", "evaluate_spec", "compute_metrics",
           "override_spec", "continued_after_answer", "vote_key", "SAMPLES_FILE", "METRICS_FILE", "CURVES_FILE",
           "EVAL_FILE", "COMPARE_EXEMPT", "template_check", "template_mismatch_line"]

SAMPLES_FILE = "evals/samples.parquet"
METRICS_FILE = "evals/metrics.parquet"
CURVES_FILE = "passk_curves.parquet"
EVAL_FILE = "eval.json"

# Settings keys that identify *what* was evaluated or *how fast*, not *how*: two results that differ only
# here are comparable. batch_size is here because every request has its own seed (rlvr_core.core.seeding), so
# a completion does not depend on which requests shared its batch (tests/sampling checks this).
# numerics (thread count, CPU instruction set) changes the exact samples like a different machine would, not what
# is measured: it is stored with every result and two results that differ only there are still comparable.
# train_template / template_mismatch describe the checkpoint (the format it was trained on), not how it was evaluated:
# a base model and its trained checkpoint evaluated the same way compare (the mismatch is stamped on the report).
COMPARE_EXEMPT = frozenset({"batch_size", "verifier_workers", "numerics", "train_template", "template_mismatch"})

# The first final-answer line of a completion: GSM8K's "#### N", the CoT "The answer is N", Minerva's
# "Final Answer: The final answer is X". Text after that line is a continuation (G-stop-seq).
_ANSWER_LINE = re.compile(r"####|[Tt]he (?:final )?answer is|Final Answer:")


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


@dataclass(frozen=True)
class EvalLimits:
    """Shares above which an evaluation is flagged (the numbers stay as they are): G-verifier-error (a checker
    that crashes scores every model 0 %; any scoring counts) and G-truncation (a cap too short cuts answers
    off; the reported case had 13 % truncated). Defaults: `EvalConfig.max_*` in rlvr_core.experiment.config."""

    max_verifier_error_share: float = 0.05
    max_truncation_share: float = 0.1


def eval_flags(metric_rows: list[dict[str, Any]], limits: EvalLimits) -> list[dict[str, Any]]:
    """The flags of one benchmark's evaluation from its metric rows (plain rows; breakdowns are skipped):
    one dict per share over its limit, with guard id, metric, value, n, limit and a sentence."""
    checks = (("G-verifier-error", "verifier_error_share", limits.max_verifier_error_share, "verifier errors"),
              ("G-truncation", "truncation_share", limits.max_truncation_share, "truncated completions"))
    flags = []
    for r in metric_rows:
        if r.get("breakdown_field") or r.get("value") is None:
            continue
        for guard, name, limit, what in checks:
            if r["metric"].split("/")[0] == name and r["value"] > limit:
                flags.append({"guard_id": guard, "benchmark": r.get("benchmark"), "metric": r["metric"],
                              "value": r["value"], "n": r["n"], "limit": limit,
                              "reason": f"{guard}: {r.get('benchmark')}: {what} {r['value']:.1%} of {r['n']} "
                                        f"completions ({r['metric']}; limit {limit:.0%})"})
    return flags


def regression_flag(greedy_delta: dict[str, Any] | None, benchmark: str) -> dict[str, Any] | None:
    """G-regression: the trained model is worse than its base on the same problems beyond the paired 95 %
    interval (trained − base greedy accuracy, `ci_high` < 0). The flag in eval_flags' form, or None. A run can
    pass every training guard and still come out worse than it went in (a learning rate that wrecks the model
    slowly, a reward that pays for the wrong thing): the numbers say so, and so should the summary."""
    d = greedy_delta
    if not d or d.get("ci_high") is None or not d["ci_high"] < 0:
        return None
    return {"guard_id": "G-regression", "benchmark": benchmark, "metric": "accuracy_greedy_delta",
            "value": d["delta"], "n": d["n"], "limit": 0.0,
            "reason": f"G-regression: {benchmark}: the trained model is worse than its base by "
                      f"{-100 * d['delta']:.1f} points of greedy accuracy (paired 95% CI {100 * d['ci_low']:+.1f} "
                      f"to {100 * d['ci_high']:+.1f}, n={d['n']})"}


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


# Column types, so that an all-null column (e.g. no extracted answer anywhere) still has the warehouse's type.
_SAMPLE_SCHEMA = pa.schema([
    ("eval_id", pa.string()), ("benchmark", pa.string()), ("benchmark_version", pa.string()),
    ("benchmark_hash", pa.string()), ("checkpoint", pa.string()), ("problem_id", pa.string()),
    ("sample_index", pa.int64()), ("greedy", pa.bool_()), ("response", pa.string()), ("extracted", pa.string()),
    ("status", pa.string()), ("reward", pa.float64()), ("finish_reason", pa.string()), ("length", pa.int64()),
    ("prompt_template", pa.string()), ("temperature", pa.float64()), ("top_p", pa.float64()),
    ("max_new_tokens", pa.int64()), ("dtype", pa.string()), ("engine", pa.string()), ("seed", pa.int64()),
    ("verifier", pa.string()), ("verifier_mode", pa.string()), ("verifier_version", pa.string()),
    ("scoring", pa.string()), ("continued_after_answer", pa.bool_()), ("instructions_followed", pa.int64()),
    ("instructions_total", pa.int64()), ("side_by_side", pa.string()), ("meta", pa.string()),
])
_METRIC_SCHEMA = pa.schema([
    ("eval_id", pa.string()), ("benchmark", pa.string()), ("benchmark_version", pa.string()),
    ("checkpoint", pa.string()), ("metric", pa.string()), ("value", pa.float64()), ("n", pa.int64()),
    ("ci_low", pa.float64()), ("ci_high", pa.float64()), ("scoring", pa.string()), ("breakdown_field", pa.string()),
    ("breakdown_value", pa.string()), ("settings", pa.string()),
])
_CURVE_SCHEMA = pa.schema([
    ("source", pa.string()), ("eval_id", pa.string()), ("benchmark", pa.string()), ("checkpoint", pa.string()),
    ("scoring", pa.string()), ("k", pa.int64()), ("value", pa.float64()), ("n_problems", pa.int64()),
])


def samples_table(records: list[dict[str, Any]]) -> pa.Table:
    rows = [{**r, "side_by_side": json.dumps(r.get("side_by_side") or {}, sort_keys=True),
             "meta": json.dumps(r.get("meta") or {}, sort_keys=True, default=str)} for r in records]
    return pa.Table.from_pylist(rows, schema=_SAMPLE_SCHEMA)


def metrics_table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=_METRIC_SCHEMA)


def curves_table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=_CURVE_SCHEMA)


def read_samples(table: pa.Table) -> list[dict[str, Any]]:
    """Records back from a samples table (JSON columns decoded)."""
    out = table.to_pylist()
    for r in out:
        r["side_by_side"] = json.loads(r["side_by_side"]) if r.get("side_by_side") else {}
        r["meta"] = json.loads(r["meta"]) if r.get("meta") else {}
    return out


# --------------------------------------------------------------------------------------------- helpers
def continued_after_answer(text: str) -> bool:
    """G-stop-seq: does the completion keep writing after its first final-answer line?

    A completion that writes "#### 12" and then a new "Question: ..." (or anything else) has run past its
    answer: a last-number extractor may read the continuation. Completions without an answer line count
    as not continued.
    """
    m = _ANSWER_LINE.search(text)
    if m is None:
        return False
    rest = text[m.start():].split("\n", 1)
    return len(rest) > 1 and rest[1].strip() != ""


def vote_key(extracted: str | None, verifier: str) -> str | None:
    """The answer a completion votes for in maj@k: numbers compare as numbers for gsm8k ("27.0" = "27",
    "1,080" = "1080"); other answers by their stripped text (equivalent forms of a math answer vote apart)."""
    if extracted is None or not extracted.strip():
        return None
    text = extracted.strip()
    if verifier == "gsm8k":
        try:
            value = Decimal(text.replace(",", "").replace("$", "").replace("\u2212", "-")).normalize()
            return format(value, "f")  # "1080", not "1.08E+3"
        except InvalidOperation:
            return text
    return text


# --------------------------------------------------------------------------------------------- metrics
def _score(r: dict[str, Any], label: str, headline: str) -> dict[str, Any]:
    """A sample's outcome under one scoring: the row's own columns for the headline, else side_by_side."""
    if label == headline:
        return {"status": r["status"], "extracted": r["extracted"], "reward": r["reward"],
                "instructions_followed": r.get("instructions_followed"),
                "instructions_total": r.get("instructions_total")}
    return r["side_by_side"][label]


def _share_row(name: str, hits: int, total: int) -> dict[str, Any]:
    lo, hi = wilson_interval(hits, total)
    return {"metric": name, "value": hits / total if total else None, "n": total, "ci_low": lo, "ci_high": hi}


def _group_metrics(spec: BenchmarkSpec, pids: list[str], per: dict[str, dict], vote_verifier: str,
                   n_samples: int) -> list[dict[str, Any]]:
    """accuracy / pass@K / maj@K over the problems `pids` (metric names without scoring or breakdown)."""
    rows: list[dict[str, Any]] = []
    P = len(pids)
    for metric in spec.metrics:
        kind, k = parse_metric(metric)
        if kind == "accuracy":
            row = _share_row("accuracy_greedy", sum(per[p]["greedy"] for p in pids), P)
            rows.append(row)
        elif kind == "pass":
            value = (sum(float(pass_at_k(n_samples, per[p]["c"], k)) for p in pids) / P) if P else None
            rows.append({"metric": metric, "value": value, "n": P, "ci_low": None, "ci_high": None})
        elif kind == "maj":
            hits = 0
            for p in pids:
                votes = [(key, ok) for key, ok in per[p]["answers"][:k] if key is not None]
                if votes:
                    counts = Counter(key for key, _ in votes)
                    top = max(counts.values())
                    # Ties go to the answer seen first among the tied ones (deterministic, order of samples).
                    winner = next(key for key, _ in votes if counts[key] == top)
                    hits += any(ok for key, ok in votes if key == winner)
            rows.append({**_share_row(metric, hits, P)})
    return rows


def compute_metrics(spec: BenchmarkSpec, problems: Sequence[dict[str, Any]], records: list[dict[str, Any]],
                    settings: dict[str, Any], *, eval_id: str, checkpoint: str
                    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """Metric rows, pass@k curve rows (k = 1..n) and a summary from per-sample records alone.

    records: rows as in samples.parquet (`greedy` marks the greedy completion; at temperature 0 the single
    greedy completion is also the one sample of pass@1). Problems are scored in the order given.
    """
    g = spec.generation
    headline = scoring_label(spec.verifier)
    labels = [scoring_label(v) for v in scorings(spec)]
    greedy_only = g.temperature == 0
    n = g.n
    pids = [p["id"] for p in problems]
    meta = {p["id"]: p.get("meta") or {} for p in problems}
    by_pid: dict[str, list[dict]] = {pid: [] for pid in pids}
    for r in records:
        by_pid[r["problem_id"]].append(r)
    settings_json = json.dumps(settings, sort_keys=True, default=str)
    base = {"eval_id": eval_id, "benchmark": spec.name, "benchmark_version": spec.version,
            "checkpoint": checkpoint, "settings": settings_json}

    metric_rows: list[dict[str, Any]] = []
    curve_rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {"benchmark": spec.name, "version": spec.version, "n": len(pids),
                               "scoring": headline, "side_by_side": {}}
    for label, v in zip(labels, scorings(spec)):
        per: dict[str, dict] = {}
        for pid in pids:
            rs = by_pid[pid]
            greedy = [r for r in rs if r["greedy"]]
            sampled = sorted((r for r in rs if greedy_only or not r["greedy"]), key=lambda r: r["sample_index"])
            if len(sampled) != n:
                raise ValueError(f"{spec.name}: problem {pid!r} has {len(sampled)} sampled completions, expected {n}")
            outs = [_score(r, label, headline) for r in sampled]
            per[pid] = {
                "greedy": bool(greedy) and _score(greedy[0], label, headline)["status"] == "correct",
                "c": sum(o["status"] == "correct" for o in outs),
                "answers": [(vote_key(o["extracted"], v.name), o["status"] == "correct") for o in outs],
            }
        suffix = "" if label == headline else f"/{label}"
        rows = [{**r, "scoring": label} for r in _group_metrics(spec, pids, per, v.name, n)]
        for f in spec.breakdown:
            values = sorted({str(meta[p].get(f)) for p in pids}, key=_natural)
            for value in values:
                group = [p for p in pids if str(meta[p].get(f)) == value]
                rows += [{**r, "scoring": label, "breakdown_field": f, "breakdown_value": value,
                          "metric": f"{r['metric']}{suffix}/{f}={value}"}
                         for r in _group_metrics(spec, group, per, v.name, n)]
        # Whole-set rows get the scoring suffix here (breakdown rows got it above).
        rows = [r if r.get("breakdown_field") else {**r, "metric": r["metric"] + suffix} for r in rows]
        outs_all = [_score(r, label, headline) for r in records]
        sampled_outs = [_score(r, label, headline) for r in records if greedy_only or not r["greedy"]]
        if "mean_reward" in spec.metrics:
            rewards = [o["reward"] for o in sampled_outs]
            rows.append({"metric": "mean_reward" + suffix, "value": sum(rewards) / len(rewards) if rewards else None,
                         "n": len(rewards), "ci_low": None, "ci_high": None, "scoring": label})
        if "instruction_accuracy" in spec.metrics:
            src = [_score(r, label, headline) for r in records if r["greedy"]]
            followed = sum(o["instructions_followed"] or 0 for o in src)
            total = sum(o["instructions_total"] or 0 for o in src)
            rows.append({**_share_row("instruction_accuracy" + suffix, followed, total), "scoring": label})
        statuses = Counter(o["status"] for o in outs_all)
        for name, status in (("no_answer_share", "no_answer"), ("verifier_error_share", "error"),
                             ("verifier_timeout_share", "timeout")):
            rows.append({**_share_row(name + suffix, statuses[status], len(outs_all)), "scoring": label})
        if label == headline:
            # Properties of the completions, not of a scoring: reported once.
            rows.append({**_share_row("truncation_share", sum(r["finish_reason"] == "length" for r in records),
                                      len(records)), "scoring": None})
            rows.append({**_share_row("continuation_after_answer_share",
                                      sum(bool(r["continued_after_answer"]) for r in records), len(records)),
                         "scoring": None})
        metric_rows += [{**base, "breakdown_field": None, "breakdown_value": None, **r} for r in rows]

        curve = passk_curve([n] * len(pids), [per[p]["c"] for p in pids], ks=range(1, n + 1)) if pids else {}
        source = f"{eval_id}/{spec.name}" + suffix
        curve_rows += [{"source": source, "eval_id": eval_id, "benchmark": spec.name, "checkpoint": checkpoint,
                        "scoring": label, "k": k, "value": val, "n_problems": len(pids)} for k, val in curve.items()]
        plain = {r["metric"].removesuffix(suffix): r for r in rows if not r.get("breakdown_field")}
        block = {
            "passk": {str(k): plain[f"pass@{k}"]["value"] for k in _ks(spec, "pass")},
            "majk": {str(k): plain[f"maj@{k}"]["value"] for k in _ks(spec, "maj")},
            "passk_curve": {str(k): val for k, val in curve.items()},
            **({"accuracy_greedy": plain["accuracy_greedy"]["value"],
                "accuracy_greedy_ci": [plain["accuracy_greedy"]["ci_low"], plain["accuracy_greedy"]["ci_high"]]}
               if "accuracy_greedy" in plain else {}),
            **{name: plain[name]["value"] for name in ("mean_reward", "instruction_accuracy", "no_answer_share",
                                                       "verifier_error_share", "verifier_timeout_share",
                                                       "truncation_share", "continuation_after_answer_share")
               if name in plain},
        }
        if label == headline:
            summary.update(block)
        else:
            summary["side_by_side"][label] = block
    return metric_rows, curve_rows, summary


def _ks(spec: BenchmarkSpec, kind: str) -> list[int]:
    return [k for m in spec.metrics for kd, k in [parse_metric(m)] if kd == kind]


def _natural(s: str) -> tuple:
    """'Level 10' after 'Level 9'."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s))


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
    g = spec.generation
    stage = f"eval/{eval_id}/{spec.name}"
    prompts = [template.render(p["question"], tokenizer=tokenizer) for p in problems]

    passes: list[tuple[bool, SamplingParams]] = []
    if g.temperature == 0 or g.greedy:
        passes.append((True, SamplingParams(n=1, temperature=0.0, top_p=g.top_p, max_new_tokens=g.max_new_tokens,
                                            stop=stop, seed=g.seed)))
    if g.temperature > 0:
        passes.append((False, SamplingParams(n=g.n, temperature=g.temperature, top_p=g.top_p,
                                             max_new_tokens=g.max_new_tokens, stop=stop, seed=g.seed)))
    generated: list[tuple[bool, dict, Any]] = []  # (greedy, problem, Sample)
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

    t1 = time.monotonic()
    pairs = [(s.text, gold_for(spec, p)) for _, p, s in generated]
    outcomes: dict[str, tuple[list, str]] = {}
    for v in scorings(spec):
        outcomes[scoring_label(v)] = _verify(v, pairs, run)
    t_ver = time.monotonic() - t1
    if timings is not None:
        timings["generate_s"] = timings.get("generate_s", 0.0) + t_gen
        timings["verify_s"] = timings.get("verify_s", 0.0) + t_ver
        timings["generated_tokens"] = timings.get("generated_tokens", 0) + sum(len(s.token_ids) for _, _, s in generated)
        timings["samples"] = timings.get("samples", 0) + len(generated)

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
            "benchmark_hash": spec_hash, "checkpoint": checkpoint, "problem_id": p["id"], "sample_index": s.sample_index, "greedy": is_greedy, "response": s.text,
            "extracted": o.extracted, "status": o.status.value, "reward": float(o.reward),
            "finish_reason": s.finish_reason, "length": len(s.token_ids), "prompt_template": template.key,
            "temperature": 0.0 if is_greedy else g.temperature, "top_p": g.top_p, "max_new_tokens": g.max_new_tokens,
            "dtype": run.dtype, "engine": run.engine, "seed": s.seed, "verifier": spec.verifier.name,
            "verifier_mode": spec.verifier.mode, "verifier_version": h_version, "scoring": headline,
            "continued_after_answer": continued_after_answer(s.text), "instructions_followed": followed,
            "instructions_total": total, "side_by_side": side, "meta": p.get("meta") or {},
        })

    resolved = resolved_benchmark(spec)
    settings = {
        "benchmark": spec.name, "benchmark_version": spec.version, "benchmark_hash": benchmark_hash(spec),
        "data_hash": benchmark_data_hash(spec, problems=problems), "n_problems": len(problems),
        "template": template.key, "temperature": g.temperature, "top_p": g.top_p, "n": g.n,
        "greedy": g.temperature == 0 or g.greedy, "seed": g.seed, "stop": list(stop),
        "max_new_tokens": g.max_new_tokens, "verifier": spec.verifier.name, "verifier_mode": spec.verifier.mode,
        "verifier_versions": {lab: outcomes[lab][1] for lab in outcomes},
        "side_by_side": [scoring_label(v) for v in spec.side_by_side],
        "resolved": resolved["resolved"], **run.numbers_settings(), **template_check(spec, train_template),
    }
    if settings["template_mismatch"]:
        progress(stage, f"warning: {template_mismatch_line(spec, train_template)}")
    metrics, curves, summary = compute_metrics(spec, problems, records, settings, eval_id=eval_id, checkpoint=checkpoint)
    summary.update({"benchmark_hash": settings["benchmark_hash"], "identity": identity or {}, "data_source": source,
                    "train_template": train_template, "template_mismatch": settings["template_mismatch"],
                    "duration_s": round(time.monotonic() - t0, 3), "generate_s": round(t_gen, 3),
                    "verify_s": round(t_ver, 3)})
    summary["flags"] = eval_flags(metrics, limits)
    for f in summary["flags"]:
        progress(stage, "flag " + f["reason"])
    acc = summary.get("accuracy_greedy")
    progress(stage, (f"accuracy {acc:.3f} [{summary['accuracy_greedy_ci'][0]:.3f}, "
                     f"{summary['accuracy_greedy_ci'][1]:.3f}] n={len(problems)}" if acc is not None else
                     f"n={len(problems)}") + "".join(f"; pass@{k} {v:.3f}" for k, v in summary["passk"].items()))
    return BenchmarkResult(spec, settings, records, metrics, curves, summary)


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
