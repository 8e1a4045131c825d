"""Δlog p analysis (seed 004, Huang et al. 2026, "On the Direction of RLVR Updates"): direction vs magnitude.

`run_dlogp_analysis(A, B, rows, out_dir)` runs four measurements on the task's problems:

  1. **Histograms.** n samples per problem from each model; every sampled token is teacher-forced
     through A and B; histograms (log counts) of Δlog p = log p_B(y) - log p_A(y) and of the magnitude
     metrics (entropy of each model, KL both ways, symmetric KL) for tokens sampled from A and from B.
     The direction shows in Δlog p (under B's samples its mean is KL(B‖A) >= 0, under A's it is
     -KL(A‖B) <= 0), not in the magnitudes. The two-sample Kolmogorov–Smirnov distance between the
     sources measures it per metric; the tail shares (|Δlog p| > 1) show whether the histogram is bimodal.
  2. **Top tokens** by mean Δlog p (both signs), over tokens seen at least `min_token_count` times.
  3. **Selective token replacement.** Sample from A; where a criterion fires, replace the token with
     one drawn from B (`GuidedEngine`). Thresholds are set on A's own sampled tokens so that each
     criterion would replace the same share (`rates`) of them: Δlog p below its `rate` quantile,
     entropy of A or symmetric KL above their `1 - rate` quantiles, random with probability `rate`.
     Realised rates (which differ once trajectories diverge) are reported next to the targets.
  4. **Test-time extrapolation.** Sample from log p_B + γ Δlog p (renormalised) for each γ, at every
     position (`global`), or only at positions gated by Δlog p of A's proposal below the threshold of the
     first rate (`selective`, proposal A, the paper's Selective Extrapolate).

Every decoded sample is scored with the task's verifier; accuracy is the mean over samples
(avg@n), with a Wilson 95% interval over the samples.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from rlvr_core.core.stats import wilson_interval
from rlvr_core.data.templates import get_template
from rlvr_core.probe import figures as fig
from rlvr_core.probe.checkpoints import load_checkpoint_model
from rlvr_core.probe.decoding import Guide, GuidedEngine
from rlvr_core.probe.report import md_table, write_tables
from rlvr_core.probe.tables import Checkpoint, token_table
from rlvr_core.data import gold_of
from rlvr_core.probe.task import TaskSettings
from rlvr_core.probe.token_stats import ProbeSequence, teacher_forced_stats
from rlvr_core.sampling.base import SamplingParams

__all__ = ["DlogpSettings", "sample_guided", "ks_distance", "source_summary", "top_tokens", "calibrate_thresholds",
           "run_dlogp_analysis", "HIST_METRICS"]

HIST_METRICS = ("dlogp", "entropy_a", "entropy_b", "kl_ab", "kl_ba", "kl_sym")


@dataclass(frozen=True)
class DlogpSettings:
    n_samples: int = 4  # samples per problem for each configuration
    temperature: float = 1.0
    rates: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3)
    criteria: tuple[str, ...] = ("dlogp", "kl", "entropy", "random")
    gammas: tuple[float, ...] = (0.0, 0.5, 1.0, 2.0, 4.0)
    top_n: int = 15
    min_token_count: int = 5
    batch_size: int = 128
    task: TaskSettings = field(default_factory=TaskSettings)

    def __post_init__(self) -> None:
        bad = [c for c in self.criteria if c not in CALIBRATED]
        if bad:
            raise ValueError(f"criteria must be among {CALIBRATED}, got {bad}")
        if not self.rates or any(not 0 < r < 1 for r in self.rates):
            raise ValueError(f"rates must be in (0, 1), got {self.rates}")
        if self.n_samples < 1 or self.temperature <= 0:
            raise ValueError("n_samples must be >= 1 and temperature > 0 (guided decoding samples)")


CALIBRATED = ("dlogp", "entropy", "kl", "random")


def sample_guided(model_a, model_b, tokenizer, rows: list[dict], guide: Guide, settings: DlogpSettings) -> list[dict]:
    """n guided samples per row, verified: records with problem_id, sample_index, response, token_ids,
    prompt_ids, correct, n_replaced, n_tokens."""
    task = settings.task
    t = get_template(task.template_id)
    eng = GuidedEngine(model_a, model_b, tokenizer, guide, batch_size=settings.batch_size)
    params = SamplingParams(n=settings.n_samples, temperature=settings.temperature, top_p=task.top_p,
                            max_new_tokens=task.max_new_tokens, stop=t.stop, seed=task.seed)
    prompts = [t.render(r["question"]) for r in rows]
    groups = eng.generate(prompts, [r["id"] for r in rows], params)
    flat = [(r, p, s) for r, p, g in zip(rows, prompts, groups) for s in g]
    ok = task.verify_texts([s.text for _, _, s in flat], [gold_of(r) for r, _, _ in flat])
    out = []
    for (r, p, s), c in zip(flat, ok):
        n_rep, n_tok = eng.replaced[(r["id"], s.sample_index)]
        out.append({"problem_id": r["id"], "sample_index": s.sample_index, "response": s.text,
                    "token_ids": list(s.token_ids), "prompt_ids": tokenizer(p, add_special_tokens=True)["input_ids"],
                    "correct": bool(c), "n_replaced": n_rep, "n_tokens": n_tok})
    return out


def ks_distance(x: np.ndarray, y: np.ndarray) -> float:
    """Two-sample Kolmogorov–Smirnov statistic sup |F_x - F_y| (0 = same distribution, 1 = disjoint)."""
    x, y = np.sort(np.asarray(x, dtype=np.float64)), np.sort(np.asarray(y, dtype=np.float64))
    if not x.size or not y.size:
        return float("nan")
    grid = np.concatenate([x, y])
    fx = np.searchsorted(x, grid, side="right") / x.size
    fy = np.searchsorted(y, grid, side="right") / y.size
    return float(np.max(np.abs(fx - fy)))


def source_summary(values: dict[str, dict[str, np.ndarray]], tail: float = 1.0) -> list[dict]:
    """Rows (metric, source, n, mean, median, p01, p99, share_below_-tail, share_above_tail, ks_between_sources)."""
    rows = []
    for m, by_src in values.items():
        srcs = list(by_src)
        ks = ks_distance(by_src[srcs[0]], by_src[srcs[1]]) if len(srcs) == 2 else float("nan")
        for s, v in by_src.items():
            v = np.asarray(v, dtype=np.float64)
            rows.append({"metric": m, "source": s, "n": int(v.size), "mean": float(v.mean()) if v.size else None,
                         "median": float(np.median(v)) if v.size else None,
                         "p01": float(np.quantile(v, 0.01)) if v.size else None,
                         "p99": float(np.quantile(v, 0.99)) if v.size else None,
                         "share_below": float((v < -tail).mean()) if v.size else None,
                         "share_above": float((v > tail).mean()) if v.size else None, "ks": ks})
    return rows


def top_tokens(tokens: pa.Table, n: int, min_count: int) -> list[dict]:
    """Tokens (by text) with the highest positive and the lowest negative mean Δlog p (at least min_count
    occurrences): rows (direction, token, count, mean_dlogp, category)."""
    t = tokens.to_pydict()
    agg: dict[str, list[float]] = defaultdict(list)
    cat: dict[str, str] = {}
    for text, d, c in zip(t["token_text"], t["dlogp"], t["category"]):
        agg[text].append(d)
        cat[text] = c
    stats = [(k, len(v), float(np.mean(v))) for k, v in agg.items() if len(v) >= min_count]
    up = sorted((r for r in stats if r[2] > 0), key=lambda r: -r[2])[:n]
    down = sorted((r for r in stats if r[2] < 0), key=lambda r: r[2])[:n]
    return ([{"direction": "B favours", "token": k, "count": c, "mean_dlogp": m, "category": cat[k]} for k, c, m in up]
            + [{"direction": "A favours", "token": k, "count": c, "mean_dlogp": m, "category": cat[k]} for k, c, m in down])


def calibrate_thresholds(stats: dict[str, np.ndarray], criterion: str, rate: float) -> float:
    """Threshold at which `criterion` fires on a share `rate` of the given tokens (A's own samples)."""
    if criterion == "dlogp":
        return float(np.quantile(stats["dlogp"], rate))
    if criterion == "entropy":
        return float(np.quantile(stats["entropy_a"], 1 - rate))
    if criterion == "kl":
        return float(np.quantile(stats["kl_sym"], 1 - rate))
    if criterion == "random":
        return float(rate)
    raise ValueError(f"no calibration for criterion {criterion!r}")


def _accuracy(recs: list[dict]) -> dict[str, Any]:
    k, n = sum(r["correct"] for r in recs), len(recs)
    lo, hi = wilson_interval(k, n) if n else (None, None)
    toks = sum(r["n_tokens"] for r in recs)
    return {"accuracy": k / max(n, 1), "ci_low": lo, "ci_high": hi, "n_samples": n,
            "replace_rate": sum(r["n_replaced"] for r in recs) / max(toks, 1), "n_tokens": toks}


def _sequences(recs: list[dict], source: str) -> list[ProbeSequence]:
    return [ProbeSequence(f"{r['problem_id']}/{source}/{r['sample_index']}", r["problem_id"], r["prompt_ids"],
                          r["token_ids"], r["sample_index"], source) for r in recs]


def run_dlogp_analysis(a: Checkpoint, b: Checkpoint, rows: list[dict], out_dir: str | Path,
                       settings: DlogpSettings = DlogpSettings(), *, models: dict | None = None,
                       probe_id: str | None = None, progress=None) -> dict[str, Any]:
    """Histograms, top tokens, selective replacement and extrapolation of B against A on `rows`.

    Writes dlogp_report.md, figures/*.png, dlogp_tokens.parquet (probe_tokens schema),
    dlogp_replacement.parquet, dlogp_extrapolation.parquet and dlogp_summary.json into out_dir.
    """
    import torch

    t0 = time.monotonic()
    say = progress or (lambda stage, msg: None)
    models = dict(models or {})
    ma, tok = models[a.name] if a.name in models else load_checkpoint_model(a)
    mb, _ = models[b.name] if b.name in models else load_checkpoint_model(b)
    probe_id = probe_id or f"dlogp-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"
    out = Path(out_dir)

    # 1. samples of each model, teacher-forced through both
    rec_a = sample_guided(ma, mb, tok, rows, Guide(proposal="a"), settings)
    rec_b = sample_guided(ma, mb, tok, rows, Guide(proposal="b"), settings)
    say("dlogp", f"sampled {len(rec_a)} + {len(rec_b)} completions")
    seqs = _sequences(rec_a, "a_sampled") + _sequences(rec_b, "b_sampled")
    stats = teacher_forced_stats(ma, {b.name: mb}, seqs, pad_token_id=tok.pad_token_id or 0, dtype=torch.float32)
    tokens = token_table(stats, seqs, tok, probe_id=probe_id, reference=a.name, checkpoints=[b])
    tcols = tokens.to_pydict()
    src = np.asarray(tcols["source"], dtype=object)
    values = {m: {f"sampled from A ({a.name})": np.asarray(tcols[m])[src == "a_sampled"],
                  f"sampled from B ({b.name})": np.asarray(tcols[m])[src == "b_sampled"]} for m in HIST_METRICS}
    summary_rows = source_summary(values)
    tops = top_tokens(tokens, settings.top_n, settings.min_token_count)
    fig.histograms_by_source(values, out / "figures" / "dlogp_histograms.png")

    # 2. thresholds on A's own tokens, then selective replacement at matched rates
    a_stats = {m: np.asarray(tcols[m])[src == "a_sampled"] for m in ("dlogp", "entropy_a", "kl_sym")}
    base_acc = {f"A ({a.name})": _accuracy(rec_a)["accuracy"], f"B ({b.name})": _accuracy(rec_b)["accuracy"]}
    repl_rows = []
    for crit in settings.criteria:
        for rate in settings.rates:
            thr = calibrate_thresholds(a_stats, crit, rate)
            recs = sample_guided(ma, mb, tok, rows, Guide("a", crit, thr, "b"), settings)
            repl_rows.append({"criterion": crit, "target_rate": rate, "threshold": thr, **_accuracy(recs)})
            say("dlogp", f"replace by {crit} at {rate:.0%}: accuracy {repl_rows[-1]['accuracy']:.3f}, "
                         f"realised rate {repl_rows[-1]['replace_rate']:.3f}")
    fig.replacement_curves(repl_rows, base_acc, out / "figures" / "replacement.png")

    # 3. extrapolation along Δlog p
    sel_thr = calibrate_thresholds(a_stats, "dlogp", settings.rates[0])
    ext_rows = []
    for gamma in settings.gammas:
        for variant, guide in (("global (proposal B, every token)", Guide("b", "always", 0.0, "extrapolate", gamma)),
                               (f"selective (proposal A, Δlog p < {sel_thr:.3g})",
                                Guide("a", "dlogp", sel_thr, "extrapolate", gamma))):
            recs = sample_guided(ma, mb, tok, rows, guide, settings)
            ext_rows.append({"variant": variant, "gamma": gamma, **_accuracy(recs)})
            say("dlogp", f"extrapolate {variant} γ={gamma}: accuracy {ext_rows[-1]['accuracy']:.3f}")
    fig.extrapolation_curve(ext_rows, out / "figures" / "extrapolation.png")

    write_tables({"dlogp_tokens": tokens, "dlogp_replacement": pa.Table.from_pylist(repl_rows),
                  "dlogp_extrapolation": pa.Table.from_pylist(ext_rows),
                  "dlogp_sources": pa.Table.from_pylist(summary_rows), "dlogp_top_tokens": pa.Table.from_pylist(tops)},
                 out)
    meta = {"probe_id": probe_id, "a": asdict(a), "b": asdict(b), "n_rows": len(rows),
            "settings": json.loads(json.dumps(asdict(settings), default=str)), "accuracy": base_acc,
            "selective_threshold": sel_thr, "duration_s": round(time.monotonic() - t0, 3)}
    _write_markdown(out, meta, summary_rows, tops, repl_rows, ext_rows)
    (out / "dlogp_summary.json").write_text(json.dumps(meta, indent=2))
    return meta


def _write_markdown(out: Path, meta: dict, summary_rows: list[dict], tops: list[dict], repl: list[dict],
                    ext: list[dict]) -> None:
    a, b = meta["a"]["name"], meta["b"]["name"]
    s = meta["settings"]
    lines = [f"# Δlog p: direction of the update from `{a}` (A) to `{b}` (B)", "",
             f"{meta['n_rows']} problems, {s['n_samples']} samples per problem and configuration at temperature "
             f"{s['temperature']}. Accuracy (avg@{s['n_samples']}): "
             + ", ".join(f"{k} {v:.3f}" for k, v in meta["accuracy"].items()) + ".", "",
             "## Direction vs magnitude", "",
             "Per-token metrics of tokens sampled from each model (teacher-forced through both). "
             "`ks`: Kolmogorov–Smirnov distance between the two sources (0 = same histogram). "
             "`< -1` / `> 1`: share of tokens beyond ±1 (nats).", ""]
    lines += md_table(["metric", "source", "tokens", "mean", "median", "p01", "p99", "< -1", "> 1", "ks"],
                       [[r["metric"], r["source"], r["n"], r["mean"], r["median"], r["p01"], r["p99"],
                         r["share_below"], r["share_above"], r["ks"]] for r in summary_rows])
    lines += ["", "![histograms](figures/dlogp_histograms.png)", "", "## Top tokens by mean Δlog p", ""]
    lines += md_table(["direction", "token", "count", "mean Δlog p", "category"],
                       [[r["direction"], f"`{r['token']!r}`"[:30], r["count"], r["mean_dlogp"], r["category"]]
                        for r in tops])
    lines += ["", "## Selective token replacement", "",
              "Sample from A; replace the tokens a criterion selects with B's draw. Thresholds from A's own sampled "
              "tokens so that each criterion targets the same share.", ""]
    lines += md_table(["criterion", "target rate", "threshold", "realised rate", "accuracy", "95% CI", "samples"],
                       [[r["criterion"], r["target_rate"], r["threshold"], r["replace_rate"], r["accuracy"],
                         f"{r['ci_low']:.3f}–{r['ci_high']:.3f}", r["n_samples"]] for r in repl])
    lines += ["", "![replacement](figures/replacement.png)", "", "## Test-time extrapolation", "",
              "Sample from softmax(log p_B + γ·Δlog p). γ = 0 is B itself.", ""]
    lines += md_table(["variant", "γ", "accuracy", "95% CI", "replaced share", "samples"],
                       [[r["variant"], r["gamma"], r["accuracy"], f"{r['ci_low']:.3f}–{r['ci_high']:.3f}",
                         r["replace_rate"], r["n_samples"]] for r in ext])
    lines += ["", "![extrapolation](figures/extrapolation.png)", ""]
    (out / "dlogp_report.md").write_text("\n".join(lines))
