"""Capability boundary (seed 003, Yue et al. 2025, "Does RL really incentivize reasoning capacity beyond
the base model?"): does RL solve new problems, or the same ones more often?

`run_boundary_analysis(A, B, rows, out_dir)`:

  * samples n completions per problem from each model (`TaskSettings.sample`: the evaluator's
    sampling and verifier; default n = 256 at temperature 1) and computes pass@k for k = 1, 2, 4, … n
    with the unbiased estimator (`rlvr_core.core.passk`). RL typically wins at small k; if the base model
    catches up or overtakes at large k, RL narrowed rather than widened what the model can solve.
  * the accuracy distribution: a histogram of per-problem accuracy c / n for each model (bins 0, (0, 0.1),
    [0.1, 0.2), …, [0.9, 1), 1: the exact 0 and 1 bins separate never- and always-solved problems);
  * solvable-set overlap at n samples: solved by both, only A, only B, neither (solved = c > 0);
  * perplexity of each model's *correct* responses (up to `ppl_per_problem` per problem) and of the
    data set's reference solutions under both models: exp(-mean log p) of the response tokens,
    teacher-forced (`teacher_forced_stats`: logp_a and logp_b of the same tokens in one pass). Low
    perplexity of B's correct responses under A means A already produced those paths.
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

from rlvr_core.core.passk import default_ks, passk_curve
from rlvr_core.probe import figures as fig
from rlvr_core.probe.checkpoints import load_checkpoint_model
from rlvr_core.probe.inputs import sequences_from_records, sequences_from_rows
from rlvr_core.probe.report import md_table, write_tables
from rlvr_core.probe.tables import Checkpoint
from rlvr_core.probe.task import TaskSettings
from rlvr_core.probe.token_stats import teacher_forced_stats

__all__ = ["BoundarySettings", "ACCURACY_EDGES", "accuracy_bins", "solvable_overlap", "response_perplexity",
           "run_boundary_analysis"]

# Bin edges of the accuracy histogram; 0 and 1 get their own bins (see accuracy_bins).
ACCURACY_EDGES = np.array([0.0, 1e-9, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1 - 1e-9, 1.0])


@dataclass(frozen=True)
class BoundarySettings:
    n_samples: int = 256
    temperature: float = 1.0
    ppl_per_problem: int = 4  # correct responses per problem and model scored for perplexity
    task: TaskSettings = field(default_factory=TaskSettings)


def accuracy_bins(rates: np.ndarray) -> list[dict]:
    """Histogram rows (bin label, problems) of per-problem accuracies over ACCURACY_EDGES."""
    counts, _ = np.histogram(np.asarray(rates, dtype=np.float64), bins=ACCURACY_EDGES)
    labels = ["0", "(0, 0.1)"] + [f"[{i / 10:.1f}, {(i + 1) / 10:.1f})" for i in range(1, 9)] + ["[0.9, 1)", "1"]
    return [{"bin": lab, "problems": int(c)} for lab, c in zip(labels, counts)]


def solvable_overlap(c_a: dict[str, int], c_b: dict[str, int]) -> dict[str, int]:
    """Counts of problems solved (c > 0) by both, only A, only B, neither (over the problems of c_a)."""
    out = {"both": 0, "only_a": 0, "only_b": 0, "neither": 0}
    for p, ca in c_a.items():
        sa, sb = ca > 0, c_b.get(p, 0) > 0
        out["both" if sa and sb else "only_a" if sa else "only_b" if sb else "neither"] += 1
    return out


def response_perplexity(model_a, model_b, tokenizer, seqs) -> list[dict]:
    """Per sequence: source, n_tokens, ppl under A and under B (exp of minus the mean token log-prob)."""
    seqs = [s for s in seqs if s.response_ids]
    if not seqs:
        return []
    res = teacher_forced_stats(model_a, {"b": model_b}, seqs, pad_token_id=tokenizer.pad_token_id or 0)
    return [{"sequence_id": s.sequence_id, "problem_id": s.problem_id, "source": s.source, "n_tokens": len(s.response_ids),
             "ppl_a": float(np.exp(-st.logp_a.mean().item())), "ppl_b": float(np.exp(-st.logp_b.mean().item()))}
            for s, st in zip(seqs, res["b"])]


def run_boundary_analysis(a: Checkpoint, b: Checkpoint, rows: list[dict], out_dir: str | Path,
                          settings: BoundarySettings = BoundarySettings(), *, models: dict | None = None,
                          progress=None) -> dict[str, Any]:
    """pass@k curves, accuracy histogram, solvable overlap and perplexities of B against A on `rows`.

    Writes boundary_report.md, figures/*.png and boundary_*.parquet into out_dir; returns the summary.
    """
    t0 = time.monotonic()
    say = progress or (lambda stage, msg: None)
    models = dict(models or {})
    ma, tok = models[a.name] if a.name in models else load_checkpoint_model(a)
    mb, _ = models[b.name] if b.name in models else load_checkpoint_model(b)
    out = Path(out_dir)
    n, task = settings.n_samples, settings.task
    labels = {"a": f"A ({a.name})", "b": f"B ({b.name})"}
    recs = {}
    for key, m in (("a", ma), ("b", mb)):
        recs[key] = task.sample(m, tok, rows, n=n, temperature=settings.temperature, stage=f"boundary/{key}")
        say("boundary", f"{labels[key]}: {len(recs[key])} samples")
    counts = {k: defaultdict(int) for k in recs}
    for k, rs in recs.items():
        for r in rs:
            counts[k][r["problem_id"]] += int(r["correct"])
    ids = [r["id"] for r in rows]
    c = {k: {p: counts[k].get(p, 0) for p in ids} for k in recs}
    ks = default_ks(n)
    curves = {k: passk_curve([n] * len(ids), [c[k][p] for p in ids], ks) for k in recs}
    rates = {k: np.asarray([c[k][p] / n for p in ids]) for k in recs}
    overlap = solvable_overlap(c["a"], c["b"])

    ppl, ppl_rows = _perplexities(ma, mb, tok, rows, recs, settings, labels)

    curve_rows = [{"model": labels[k], "k": kk, "pass_at_k": v} for k in curves for kk, v in curves[k].items()]
    hist_rows = [{"model": labels[k], **row} for k in rates for row in accuracy_bins(rates[k])]
    problem_rows = [{"problem_id": p, "n": n, "c_a": c["a"][p], "c_b": c["b"][p]} for p in ids]
    write_tables({"boundary_passk": pa.Table.from_pylist(curve_rows), "boundary_accuracy_hist": pa.Table.from_pylist(hist_rows),
                  "boundary_problems": pa.Table.from_pylist(problem_rows),
                  "boundary_perplexity": pa.Table.from_pylist(ppl_rows),
                  "boundary_perplexity_responses": pa.Table.from_pylist(ppl) if ppl else pa.table({})}, out)
    fig.passk_curves({labels[k]: curves[k] for k in curves}, out / "figures" / "passk_curves.png")
    fig.accuracy_histogram({labels[k]: rates[k] for k in rates}, ACCURACY_EDGES, out / "figures" / "accuracy_hist.png")

    crossing = next((k for k in ks if curves["a"][k] >= curves["b"][k]), None)
    lines = [f"# Capability boundary: `{a.name}` (A) vs `{b.name}` (B)", "",
             f"{len(ids)} problems, {n} samples per problem and model at temperature {settings.temperature}, "
             f"verifier `{task.verifier}`.", "", "## pass@k", ""]
    lines += md_table(["k", labels["a"], labels["b"], "B − A"],
                       [[k, curves["a"][k], curves["b"][k], curves["b"][k] - curves["a"][k]] for k in ks])
    lines += ["", ("A reaches or passes B from k = " + str(crossing) + " on.") if crossing else
              f"B stays above A up to k = {ks[-1]}.", "", "![pass@k](figures/passk_curves.png)", "",
              "## Accuracy distribution", ""]
    hb = {lab: [r["problems"] for r in hist_rows if r["model"] == lab] for lab in labels.values()}
    bins = [r["bin"] for r in hist_rows if r["model"] == labels["a"]]
    lines += md_table(["per-problem accuracy", *labels.values()], [[bn, *(hb[l][i] for l in labels.values())]
                                                                    for i, bn in enumerate(bins)])
    lines += ["", "![accuracy](figures/accuracy_hist.png)", "", f"## Solvable sets (solved = at least one of {n} correct)", ""]
    lines += md_table(["both", "only A", "only B", "neither"],
                       [[overlap["both"], overlap["only_a"], overlap["only_b"], overlap["neither"]]])
    lines += ["", "## Perplexity", "", "exp(−mean token log-prob) of the responses under each model (teacher forcing). "
              f"`correct_a`/`correct_b`: up to {settings.ppl_per_problem} correct samples per problem of A/B; "
              "`reference`: the data set's worked solutions.", ""]
    lines += md_table(["responses", "scored by", "responses n", "mean ppl", "median ppl"],
                       [[r["responses"], r["scored_by"], r["n_responses"], r["mean_ppl"], r["median_ppl"]]
                        for r in ppl_rows])
    lines.append("")
    (out / "boundary_report.md").write_text("\n".join(lines))
    meta = {"a": asdict(a), "b": asdict(b), "n_problems": len(ids), "n_samples": n,
            "passk": {labels[k]: {str(kk): v for kk, v in curves[k].items()} for k in curves},
            "overlap": overlap, "crossing_k": crossing, "perplexity": ppl_rows,
            "settings": json.loads(json.dumps(asdict(settings), default=str)),
            "duration_s": round(time.monotonic() - t0, 3)}
    (out / "boundary_summary.json").write_text(json.dumps(meta, indent=2))
    return meta


def _perplexities(ma, mb, tok, rows: list[dict], recs: dict[str, list[dict]], settings: BoundarySettings,
                  labels: dict[str, str]) -> tuple[list[dict], list[dict[str, Any]]]:
    """Per-response perplexities under A and B (the reference solutions and up to `ppl_per_problem` correct
    samples per problem of each model), and their summary rows."""
    task = settings.task
    by_id = {r["id"]: r for r in rows}
    seqs = sequences_from_rows(rows, tok, task.template_id, source="reference", append_eos=False)
    for k in recs:
        taken: dict[str, int] = defaultdict(int)
        chosen = []
        for r in recs[k]:
            if r["correct"] and taken[r["problem_id"]] < settings.ppl_per_problem:
                taken[r["problem_id"]] += 1
                chosen.append(r)
        seqs += sequences_from_records(chosen, by_id, tok, task.template_id, source=f"correct_{k}")
    ppl = response_perplexity(ma, mb, tok, seqs)
    ppl_rows = []
    for source in ["correct_a", "correct_b", "reference"]:
        sel = [r for r in ppl if r["source"] == source]
        for scorer in ("a", "b"):
            v = np.asarray([r[f"ppl_{scorer}"] for r in sel])
            ppl_rows.append({"responses": source, "scored_by": labels[scorer], "n_responses": len(sel),
                             "mean_ppl": float(v.mean()) if v.size else None,
                             "median_ppl": float(np.median(v)) if v.size else None})
    return ppl, ppl_rows
