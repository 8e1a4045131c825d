"""Compare two evaluations of the same benchmarks: paired deltas, what each solves, capability boundaries.

Why paired: both evaluations score the same problems, so per-problem differences cancel the problems'
difficulty and the interval is much tighter than one from two independent accuracies (a 3-point gain on
200 problems is usually significant paired and not unpaired). Why refuse: a number only compares with
another when the settings that change numbers agree (G-eval-parallel): template, decoding, max tokens,
dtype, parallelism, data, verifier and its version. `compare` raises `SettingsMismatch` listing every
differing setting unless `allow_different_settings=True`, which warns and stamps the report.

Per benchmark (problems present in both; the headline scoring, plus the accuracy and pass@1 deltas of
every side-by-side scoring both have):

* **deltas with 95% confidence intervals**, B − A, for greedy accuracy and pass@k (k = 1, 2, 4, ... up
  to the smaller n, and that n). Interval: the paired t interval on the per-problem differences d_i
  (greedy: d_i ∈ {−1, 0, 1}; pass@k: the difference of the two unbiased per-problem estimates),
  mean(d) ± t(0.975, P−1) · sd(d) / √P. For greedy accuracy also McNemar's exact test: the two-sided
  binomial p-value of the discordant problems (solved by one only) under p = 1/2.
* **solved by one and not the other**: problem ids, greedy, and "ever" (at least one of the n samples).
* **capability boundary** (the view of Yue et al., "Does RL really incentivize reasoning capacity beyond
  the base model?", seeds/003): both pass@k curves for every k up to the smaller n; the histogram of
  per-problem pass rates c/n (bins: exactly 0, (0, 0.1], ..., (0.9, 1), exactly 1); and the overlap of the
  solvable sets (c > 0): both, A only, B only, neither. RL that sharpens without widening shows B above A
  at small k, the curves crossing at large k, and few "B only" problems.

Inputs: folders written by `rlvr eval --out` or runs in the artifact store (a run folder such as
`EXPERIMENT/NAME-ID8`, `EXPERIMENT/RUN_ID`, or a bare run id; rlvr_core.artifacts.layout), optionally `#EVAL_ID` to
pick one evaluation of a run that holds several (the demo run holds `base` and `trained`).
"""

from __future__ import annotations

import io
import json
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from rlvr_core.artifacts.layout import resolve_run
from rlvr_core.artifacts.storage import open_store
from rlvr_core.core.passk import default_ks, pass_at_k, passk_curve
from rlvr_core.eval.metrics import COMPARE_EXEMPT, METRICS_FILE, SAMPLES_FILE, read_samples

__all__ = ["EvalSource", "SettingsMismatch", "load_eval", "compare", "compare_benchmark",
           "from_tables", "settings_diff", "paired_t_interval", "t_quantile", "mcnemar_exact_p", "pass_rate_histogram",
           "to_markdown", "write_report", "HIST_BINS"]

# Histogram bins of per-problem pass rates: the two ends get their own bins (never / always solved).
HIST_BINS = ["0", "(0,0.1]", "(0.1,0.2]", "(0.2,0.3]", "(0.3,0.4]", "(0.4,0.5]", "(0.5,0.6]", "(0.6,0.7]",
             "(0.7,0.8]", "(0.8,0.9]", "(0.9,1)", "1"]


class SettingsMismatch(ValueError):
    """The two evaluations were produced with different settings; the message lists them."""


# ------------------------------------------------------------------------------------------- statistics
def t_quantile(p: float, df: float) -> float:
    """Quantile of Student's t with df degrees of freedom (scipy); the SQL of the ablation pivot
    (dashboards/queries/ablation_pivot.sql) is tested against it."""
    from scipy import stats

    if not 0 < p < 1 or df <= 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    return float(stats.t.ppf(p, df))


def paired_t_interval(diffs: list[float], level: float = 0.95) -> tuple[float, float | None, float | None]:
    """(mean, low, high) of the paired t interval on per-problem differences; no interval below 2 problems."""
    n = len(diffs)
    if n == 0:
        return (math.nan, None, None)
    mean = sum(diffs) / n
    if n < 2:
        return (mean, None, None)
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    half = t_quantile(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    return (mean, mean - half, mean + half)


def mcnemar_exact_p(a_only: int, b_only: int) -> float:
    """Two-sided exact McNemar p-value: P(as extreme a split of the discordant pairs | p = 1/2)."""
    m = a_only + b_only
    if m == 0:
        return 1.0
    k = min(a_only, b_only)
    tail = sum(math.comb(m, i) for i in range(k + 1)) / 2 ** m
    return min(1.0, 2 * tail)


def pass_rate_histogram(rates: list[float]) -> dict[str, int]:
    """Counts of per-problem pass rates c/n in HIST_BINS."""
    counts = dict.fromkeys(HIST_BINS, 0)
    for r in rates:
        if r <= 0:
            counts["0"] += 1
        elif r >= 1:
            counts["1"] += 1
        else:
            # bin i in 1..10 is ((i-1)/10, i/10] (the last one open at 1); rounding first keeps 0.3 in (0.2,0.3].
            i = min(10, max(1, math.ceil(round(r * 10, 9))))
            counts[HIST_BINS[i]] += 1
    return counts


# ------------------------------------------------------------------------------------------- inputs
@dataclass
class EvalSource:
    """One side of a comparison: its per-sample records and per-benchmark settings."""

    label: str
    where: str
    records: list[dict[str, Any]]
    settings: dict[str, dict[str, Any]]  # benchmark -> settings

    @property
    def benchmarks(self) -> list[str]:
        return list(self.settings)


def _split_ref(ref: str) -> tuple[str, str | None]:
    if "#" in ref:
        base, eval_id = ref.rsplit("#", 1)
        return base, eval_id or None
    return ref, None


def _read_tables(ref: str, store) -> tuple[Any, Any, str]:
    """(samples table, metrics table, where) from a local folder or a run in the artifact store."""
    p = Path(ref)
    if p.is_dir():
        for samples, metrics in ((p / SAMPLES_FILE, p / METRICS_FILE), (p / "samples.parquet", p / "metrics.parquet")):
            if samples.is_file() and metrics.is_file():
                return pq.read_table(samples), pq.read_table(metrics), str(p)
        raise FileNotFoundError(f"{p}: no {SAMPLES_FILE} and {METRICS_FILE} (a folder written by `rlvr eval --out`)")
    if store is None:
        store = open_store()

    try:  # a run folder, EXPERIMENT/RUN_ID or a bare run id (rlvr_core.artifacts.layout)
        prefix = resolve_run(store, ref)
    except FileNotFoundError:
        raise FileNotFoundError(f"run {ref!r} not found: it is neither a local folder nor a run in the artifact "
                                f"store {store.uri}") from None
    keys = [f"{prefix}/{SAMPLES_FILE}", f"{prefix}/{METRICS_FILE}"]
    missing = [k[len(prefix) + 1:] for k in keys if not store.exists(k)]
    if missing:
        raise FileNotFoundError(f"run {ref!r} ({store.url(prefix)}) has no {', '.join(missing)}")
    samples, metrics = (pq.read_table(io.BytesIO(store.get_bytes(k))) for k in keys)
    return samples, metrics, store.url(prefix)


def load_eval(ref: str, *, store=None, label: str | None = None) -> EvalSource:
    """`FOLDER`, `EXPERIMENT/RUN_ID` or `RUN_ID`, each optionally `#EVAL_ID`."""
    base, eval_id = _split_ref(ref)
    samples, metrics, where = _read_tables(base, store)
    ids = sorted(set(samples.column("eval_id").to_pylist()))
    if eval_id is None:
        if len(ids) != 1:
            raise ValueError(f"{where} holds evaluations {ids}: pick one with {base}#EVAL_ID")
        eval_id = ids[0]
    elif eval_id not in ids:
        raise ValueError(f"{where} has no evaluation {eval_id!r}; it holds {ids}")
    return from_tables(samples, metrics, eval_id, label or f"{Path(base).name or base}#{eval_id}", where)


def from_tables(samples, metrics, eval_id: str, label: str, where: str = "<in memory>") -> EvalSource:
    """One evaluation (`eval_id`) of the evaluator's samples and metrics tables as a comparison side."""
    if "settings" not in metrics.column_names or "side_by_side" not in samples.column_names:
        raise ValueError(f"{where}: written before the evaluator recorded settings per benchmark; evaluate again")
    records = [r for r in read_samples(samples) if r["eval_id"] == eval_id]
    settings: dict[str, dict[str, Any]] = {}
    for row in metrics.to_pylist():
        if row["eval_id"] == eval_id and row["benchmark"] not in settings and row.get("settings"):
            settings[row["benchmark"]] = json.loads(row["settings"])
    return EvalSource(label, where, records, settings)


# ------------------------------------------------------------------------------------------- comparison
def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def settings_diff(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, A's value, B's value) for every setting that differs (COMPARE_EXEMPT keys aside)."""
    fa, fb = _flat(a), _flat(b)
    return [(k, fa.get(k), fb.get(k)) for k in sorted(set(fa) | set(fb))
            if k.split(".")[0] not in COMPARE_EXEMPT and fa.get(k) != fb.get(k)]


def _per_problem(records: list[dict], bench: str, label: str, headline: str) -> tuple[dict[str, dict], int]:
    """problem -> {greedy: bool | None, c: int}, and n (sampled completions per problem)."""
    rs = [r for r in records if r["benchmark"] == bench]
    greedy_only = not any(not r["greedy"] for r in rs)
    out: dict[str, dict] = {}
    n_per: dict[str, int] = {}
    for r in rs:
        o = r if label == headline else r["side_by_side"].get(label)
        if o is None:
            continue
        p = out.setdefault(r["problem_id"], {"greedy": None, "c": 0})
        ok = o["status"] == "correct"
        if r["greedy"]:
            p["greedy"] = ok
        if greedy_only or not r["greedy"]:
            p["c"] += ok
            n_per[r["problem_id"]] = n_per.get(r["problem_id"], 0) + 1
    ns = set(n_per.values())
    if len(ns) > 1:
        raise ValueError(f"{bench}: problems have different numbers of samples {sorted(ns)}")
    return out, (ns.pop() if ns else 0)


def _delta_block(pa_: dict[str, dict], pb: dict[str, dict], common: list[str], na: int, nb: int,
                 ks: list[int]) -> dict[str, Any]:
    block: dict[str, Any] = {}
    if all(pa_[p]["greedy"] is not None and pb[p]["greedy"] is not None for p in common) and common:
        a = [int(pa_[p]["greedy"]) for p in common]
        b = [int(pb[p]["greedy"]) for p in common]
        mean, lo, hi = paired_t_interval([y - x for x, y in zip(a, b)])
        a_only = sum(x and not y for x, y in zip(a, b))
        b_only = sum(y and not x for x, y in zip(a, b))
        block["accuracy_greedy"] = {"a": sum(a) / len(a), "b": sum(b) / len(b), "delta": mean, "ci_low": lo,
                                    "ci_high": hi, "n": len(common), "a_only": a_only, "b_only": b_only,
                                    "mcnemar_p": mcnemar_exact_p(a_only, b_only)}
    for k in ks:
        a = [float(pass_at_k(na, pa_[p]["c"], k)) for p in common]
        b = [float(pass_at_k(nb, pb[p]["c"], k)) for p in common]
        mean, lo, hi = paired_t_interval([y - x for x, y in zip(a, b)])
        block[f"pass@{k}"] = {"a": sum(a) / len(a), "b": sum(b) / len(b), "delta": mean, "ci_low": lo,
                              "ci_high": hi, "n": len(common)}
    return block


def compare_benchmark(a: EvalSource, b: EvalSource, bench: str) -> dict[str, Any]:
    """Every number of the comparison for one benchmark (see the module docstring)."""
    sa, sb = a.settings[bench], b.settings[bench]
    headline = f"{sa['verifier']}:{sa['verifier_mode']}" if sa.get("verifier_mode") else sa["verifier"]
    pa_, na = _per_problem(a.records, bench, headline, headline)
    pb, nb = _per_problem(b.records, bench, headline, headline)
    common = [p for p in pa_ if p in pb]
    if not common:
        raise ValueError(f"{bench}: the two evaluations share no problem")
    n = min(na, nb)
    ks = sorted(set(default_ks(n)) | {n}) if n else []
    out: dict[str, Any] = {
        "benchmark": bench, "scoring": headline, "n_problems": len(common), "n_samples": {"a": na, "b": nb},
        "only_in_a": sorted(set(pa_) - set(pb)), "only_in_b": sorted(set(pb) - set(pa_)),
        "deltas": _delta_block(pa_, pb, common, na, nb, ks),
    }
    out["side_by_side"] = {}
    for label in sa.get("side_by_side", []):
        if label in sb.get("side_by_side", []):
            qa, _ = _per_problem(a.records, bench, label, headline)
            qb, _ = _per_problem(b.records, bench, label, headline)
            out["side_by_side"][label] = _delta_block(qa, qb, common, na, nb, [1] if n else [])
    ga = {p for p in common if pa_[p]["greedy"]}
    gb = {p for p in common if pb[p]["greedy"]}
    ea = {p for p in common if pa_[p]["c"] > 0}
    eb = {p for p in common if pb[p]["c"] > 0}
    out["solved_greedy"] = {"a_only": sorted(ga - gb), "b_only": sorted(gb - ga)}
    out["solved_ever"] = {"a_only": sorted(ea - eb), "b_only": sorted(eb - ea)}
    out["solvable_overlap"] = {"both": len(ea & eb), "a_only": len(ea - eb), "b_only": len(eb - ea),
                               "neither": len(set(common) - ea - eb)}
    if n:
        out["passk_curves"] = {
            "a": {str(k): v for k, v in passk_curve([na] * len(common), [pa_[p]["c"] for p in common],
                                                    ks=range(1, na + 1)).items()},
            "b": {str(k): v for k, v in passk_curve([nb] * len(common), [pb[p]["c"] for p in common],
                                                    ks=range(1, nb + 1)).items()},
        }
        out["pass_rate_histogram"] = {"bins": HIST_BINS,
                                      "a": pass_rate_histogram([pa_[p]["c"] / na for p in common]),
                                      "b": pass_rate_histogram([pb[p]["c"] / nb for p in common])}
    return out


def compare(a: EvalSource, b: EvalSource, *, benchmarks: list[str] | None = None,
            allow_different_settings: bool = False) -> dict[str, Any]:
    """Compare B against A on every benchmark both have (or the ones named); refuses differing settings."""
    common = [x for x in a.benchmarks if x in b.benchmarks]
    if benchmarks:
        missing = [x for x in benchmarks if x not in common]
        if missing:
            raise ValueError(f"benchmark(s) {missing} not in both evaluations; common: {common}")
        common = list(benchmarks)
    if not common:
        raise ValueError(f"no benchmark in common: A has {a.benchmarks}, B has {b.benchmarks}")
    diffs = {x: settings_diff(a.settings[x], b.settings[x]) for x in common}
    diffs = {x: d for x, d in diffs.items() if d}
    if diffs:
        lines = [f"  {x}: {k}: A={va!r} B={vb!r}" for x, d in diffs.items() for k, va, vb in d]
        message = (f"settings differ between {a.label} and {b.label}; their numbers are not comparable "
                   f"(G-eval-parallel):\n" + "\n".join(lines))
        if not allow_different_settings:
            raise SettingsMismatch(message + "\n(pass --allow-different-settings to compare anyway)")
        warnings.warn("COMPARING ANYWAY: " + message, stacklevel=2)
    # G-prompt-mismatch: a side whose checkpoint was trained on another template than the benchmark's.
    mismatch = {x: {s.label: s.settings[x].get("train_template") for s in (a, b)
                    if s.settings[x].get("template_mismatch")} for x in common}
    return {"a": {"label": a.label, "where": a.where}, "b": {"label": b.label, "where": b.where},
            "settings_differ": {x: [{"setting": k, "a": va, "b": vb} for k, va, vb in d] for x, d in diffs.items()},
            "template_mismatch": {x: m for x, m in mismatch.items() if m},
            "ci_method": "paired t interval on per-problem differences (95%); McNemar exact test for greedy accuracy",
            "benchmarks": {x: compare_benchmark(a, b, x) for x in common}}


# ------------------------------------------------------------------------------------------- report
def _pct(v: float | None) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.1f}"


def _ids(ids: list[str], limit: int = 20) -> str:
    shown = ", ".join(f"`{i}`" for i in ids[:limit])
    return (shown + (f", … ({len(ids) - limit} more)" if len(ids) > limit else "")) or "none"


def to_markdown(result: dict[str, Any]) -> str:
    a, b = result["a"]["label"], result["b"]["label"]
    out = [f"# {b} vs {a}", "", f"A = `{a}` ({result['a']['where']}), B = `{b}` ({result['b']['where']}). "
           f"Deltas are B − A in points; {result['ci_method']}.", ""]
    if result["settings_differ"]:
        out += ["> **WARNING: the settings differ; these numbers are not comparable.**", ">"]
        out += [f"> - {x}: `{d['setting']}`: A={d['a']!r}, B={d['b']!r}"
                for x, ds in result["settings_differ"].items() for d in ds]
        out.append("")
    for x, sides in (result.get("template_mismatch") or {}).items():
        out += [f"> **G-prompt-mismatch** ({x}): " + "; ".join(
            f"{label} was trained with `{t}`" for label, t in sides.items()) + ", not with this benchmark's "
            "template: its numbers may understate what it learned.", ""]
    for name, r in result["benchmarks"].items():
        out += [f"## {name} ({r['n_problems']} problems, scoring {r['scoring']}, n = {r['n_samples']['a']} / "
                f"{r['n_samples']['b']} samples)", "", "| metric | A | B | Δ | 95% CI | note |", "|---|---|---|---|---|---|"]
        for metric, d in r["deltas"].items():
            note = (f"A only {d['a_only']}, B only {d['b_only']}, McNemar p = {d['mcnemar_p']:.3g}"
                    if "mcnemar_p" in d else "")
            out.append(f"| {metric} | {_pct(d['a'])} | {_pct(d['b'])} | {_pct(d['delta'])} | "
                       f"[{_pct(d['ci_low'])}, {_pct(d['ci_high'])}] | {note} |")
        for label, block in r["side_by_side"].items():
            for metric, d in block.items():
                out.append(f"| {metric} ({label}) | {_pct(d['a'])} | {_pct(d['b'])} | {_pct(d['delta'])} | "
                           f"[{_pct(d['ci_low'])}, {_pct(d['ci_high'])}] | |")
        out += ["", f"Solved (greedy) by A only: {_ids(r['solved_greedy']['a_only'])}",
                "", f"Solved (greedy) by B only: {_ids(r['solved_greedy']['b_only'])}", ""]
        if "passk_curves" in r:
            o = r["solvable_overlap"]
            out += ["### Capability boundary", "",
                    f"Solvable sets (at least one correct of n): both {o['both']}, A only {o['a_only']}, "
                    f"B only {o['b_only']}, neither {o['neither']}.", "", "| k | pass@k A | pass@k B |", "|---|---|---|"]
            ca, cb = r["passk_curves"]["a"], r["passk_curves"]["b"]
            ks = sorted({int(k) for k in ca} | {int(k) for k in cb})
            shown = [k for k in ks if k & (k - 1) == 0 or k == ks[-1]]
            out += [f"| {k} | {_pct(ca.get(str(k)))} | {_pct(cb.get(str(k)))} |" for k in shown]
            h = r["pass_rate_histogram"]
            out += ["", "Per-problem pass rate c/n (problems per bin):", "", "| bin | A | B |", "|---|---|---|"]
            out += [f"| {bin_} | {h['a'][bin_]} | {h['b'][bin_]} |" for bin_ in h["bins"]]
            out.append("")
    return "\n".join(out) + "\n"


def write_report(result: dict[str, Any], out: str | Path) -> tuple[Path, Path]:
    """comparison.md and comparison.json in `out`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    md, js = out / "comparison.md", out / "comparison.json"
    md.write_text(to_markdown(result))
    js.write_text(json.dumps(result, indent=2, default=str))
    return md, js
