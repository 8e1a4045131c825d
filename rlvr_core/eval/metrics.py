"""The evaluator's pure half: per-sample records in, metric rows, pass@k curves, flags and tables out.

Nothing here samples or loads a model: `compute_metrics` is a function of the records alone (the tests
check it against hand-computed values), so anyone can recompute an evaluation's numbers from
`samples.parquet`. The metrics, their names and the flags are described in `rlvr_core.eval.evaluate`,
which runs the engine and the verifiers and calls this module.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

import pyarrow as pa

from rlvr_core.core.passk import pass_at_k, passk_curve
from rlvr_core.core.stats import wilson_interval
from rlvr_core.experiment.benchmarks import BenchmarkSpec, parse_metric, scoring_label, scorings

__all__ = ["SAMPLES_FILE", "METRICS_FILE", "CURVES_FILE", "EVAL_FILE", "COMPARE_EXEMPT", "EvalLimits", "eval_flags",
           "regression_flag", "samples_table", "metrics_table", "curves_table", "read_samples",
           "continued_after_answer", "vote_key", "compute_metrics"]

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


def share_row(name: str, hits: int, total: int) -> dict[str, Any]:
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
            row = share_row("accuracy_greedy", sum(per[p]["greedy"] for p in pids), P)
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
            rows.append({**share_row(metric, hits, P)})
    return rows


def compute_metrics(spec: BenchmarkSpec, problems: Sequence[dict[str, Any]], records: list[dict[str, Any]],
                    settings: dict[str, Any], *, eval_id: str, checkpoint: str
                    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """Metric rows, pass@k curve rows (k = 1..n) and a summary from per-sample records alone.

    records: rows as in samples.parquet (`greedy` marks the greedy completion; at temperature 0 the single
    greedy completion is also the one sample of pass@1). Problems are scored in the order given.
    """
    n = spec.generation.n
    headline = scoring_label(spec.verifier)
    pids = [p["id"] for p in problems]
    meta = {p["id"]: p.get("meta") or {} for p in problems}
    by_pid: dict[str, list[dict]] = {pid: [] for pid in pids}
    for r in records:
        by_pid[r["problem_id"]].append(r)
    base = {"eval_id": eval_id, "benchmark": spec.name, "benchmark_version": spec.version,
            "checkpoint": checkpoint, "settings": json.dumps(settings, sort_keys=True, default=str)}

    metric_rows: list[dict[str, Any]] = []
    curve_rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {"benchmark": spec.name, "version": spec.version, "n": len(pids),
                               "scoring": headline, "side_by_side": {}}
    for v in scorings(spec):
        label = scoring_label(v)
        suffix = "" if label == headline else f"/{label}"
        per = _per_problem(spec, by_pid, label, headline, v.name)
        rows = _scoring_rows(spec, records, pids, meta, per, label, headline, v.name)
        metric_rows += [{**base, "breakdown_field": None, "breakdown_value": None, **r} for r in rows]

        curve = passk_curve([n] * len(pids), [per[p]["c"] for p in pids], ks=range(1, n + 1)) if pids else {}
        source = f"{eval_id}/{spec.name}" + suffix
        curve_rows += [{"source": source, "eval_id": eval_id, "benchmark": spec.name, "checkpoint": checkpoint,
                        "scoring": label, "k": k, "value": val, "n_problems": len(pids)} for k, val in curve.items()]
        block = _summary_block(spec, rows, suffix, curve)
        if label == headline:
            summary.update(block)
        else:
            summary["side_by_side"][label] = block
    return metric_rows, curve_rows, summary


def _per_problem(spec: BenchmarkSpec, by_pid: dict[str, list[dict]], label: str, headline: str,
                 verifier: str) -> dict[str, dict]:
    """Per problem under one scoring: greedy correct, number of correct samples `c`, and the (vote key,
    correct) pairs of its samples in sample order."""
    greedy_only, n = spec.generation.temperature == 0, spec.generation.n
    per: dict[str, dict] = {}
    for pid, rs in by_pid.items():
        greedy = [r for r in rs if r["greedy"]]
        sampled = sorted((r for r in rs if greedy_only or not r["greedy"]), key=lambda r: r["sample_index"])
        if len(sampled) != n:
            raise ValueError(f"{spec.name}: problem {pid!r} has {len(sampled)} sampled completions, expected {n}")
        outs = [_score(r, label, headline) for r in sampled]
        per[pid] = {
            "greedy": bool(greedy) and _score(greedy[0], label, headline)["status"] == "correct",
            "c": sum(o["status"] == "correct" for o in outs),
            "answers": [(vote_key(o["extracted"], verifier), o["status"] == "correct") for o in outs],
        }
    return per


def _scoring_rows(spec: BenchmarkSpec, records: list[dict[str, Any]], pids: list[str], meta: dict[str, dict],
                  per: dict[str, dict], label: str, headline: str, verifier: str) -> list[dict[str, Any]]:
    """One scoring's metric rows (without the run's columns): whole set, breakdowns, rewards, shares."""
    n, greedy_only = spec.generation.n, spec.generation.temperature == 0
    suffix = "" if label == headline else f"/{label}"
    rows = [{**r, "scoring": label} for r in _group_metrics(spec, pids, per, verifier, n)]
    for f in spec.breakdown:
        values = sorted({str(meta[p].get(f)) for p in pids}, key=_natural)
        for value in values:
            group = [p for p in pids if str(meta[p].get(f)) == value]
            rows += [{**r, "scoring": label, "breakdown_field": f, "breakdown_value": value,
                      "metric": f"{r['metric']}{suffix}/{f}={value}"}
                     for r in _group_metrics(spec, group, per, verifier, n)]
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
        rows.append({**share_row("instruction_accuracy" + suffix, followed, total), "scoring": label})
    statuses = Counter(o["status"] for o in outs_all)
    for name, status in (("no_answer_share", "no_answer"), ("verifier_error_share", "error"),
                         ("verifier_timeout_share", "timeout")):
        rows.append({**share_row(name + suffix, statuses[status], len(outs_all)), "scoring": label})
    if label == headline:
        # Properties of the completions, not of a scoring: reported once.
        rows.append({**share_row("truncation_share", sum(r["finish_reason"] == "length" for r in records),
                                  len(records)), "scoring": None})
        rows.append({**share_row("continuation_after_answer_share",
                                  sum(bool(r["continued_after_answer"]) for r in records), len(records)),
                     "scoring": None})
    return rows


def _summary_block(spec: BenchmarkSpec, rows: list[dict[str, Any]], suffix: str,
                   curve: dict[int, float]) -> dict[str, Any]:
    """One scoring's part of the summary: headline pass@K / maj@K, the curve, accuracy and the shares."""
    plain = {r["metric"].removesuffix(suffix): r for r in rows if not r.get("breakdown_field")}
    return {
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


def _ks(spec: BenchmarkSpec, kind: str) -> list[int]:
    return [k for m in spec.metrics for kd, k in [parse_metric(m)] if kd == kind]


def _natural(s: str) -> tuple:
    """'Level 10' after 'Level 9'."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s))
