"""RL-Probe (seed 000): where, token by token, does an RL checkpoint disagree with its reference?

`run_rl_probe` does the whole analysis:

  1. greedy, verified completions of the reference A and the final checkpoint B on the problems
     (`TaskSettings.sample`, the evaluator's own sampling and verifier);
  2. a slice of problems (`select_problems`; default: A fails and B succeeds, the seed's selection);
  3. the responses to score (default A's, the seed's "feed the DPO response to both models");
  4. teacher-forced token statistics of every checkpoint against A on those responses
     (`teacher_forced_stats`: exact full-vocabulary KL both ways, entropies, Δlog p);
  5. the tables (`probe_tokens`, `probe_problems`, `probe_checkpoints`, `probe_categories`,
     `probe_turning_points`: schemas in docs/probes.md), spike marks by a `SpikeRule`, token categories;
  6. `write_report`: report.md, four figures and the Parquet tables in one folder, which
     `publish` copies into the artifact store.

Checkpoints other than the final one (earlier training steps) are scored on the same responses, so the
checkpoint table is a trajectory over training, and `turning_points` marks where it turns.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq

from rlvr_core.probe import figures as fig
from rlvr_core.probe.categories import CATEGORIES
from rlvr_core.probe.checkpoints import load_checkpoint_model
from rlvr_core.probe.inputs import sequences_from_records
from rlvr_core.probe.spikes import SpikeRule
from rlvr_core.probe.tables import SPIKE_METRICS, Checkpoint, ProbeTables, summarise, token_table
from rlvr_core.probe.task import TaskSettings
from rlvr_core.probe.token_stats import teacher_forced_stats

__all__ = ["SELECTIONS", "ProbeSettings", "select_problems", "run_rl_probe", "write_report", "publish",
           "write_tables"]

SELECTIONS = ("a_fail_b_success", "a_success_b_fail", "both_fail", "both_success", "all")


@dataclass(frozen=True)
class ProbeSettings:
    """What the RL-Probe report selects, scores and marks."""

    selection: Literal["a_fail_b_success", "a_success_b_fail", "both_fail", "both_success", "all"] = "a_fail_b_success"
    responses_from: Literal["a", "b"] = "a"  # whose greedy response is teacher-forced through every checkpoint
    metric: str = "kl_ba"  # spike/summary metric: kl_ba = KL(B || A), kl_ab, kl_sym or dlogp_abs
    rule: SpikeRule = field(default_factory=SpikeRule)
    max_problems: int | None = None  # cap on the selected problems (first in data order)
    top_n: int = 10
    sample_figures: int = 4
    turning_rel_tol: float = 0.05
    vocab_chunk: int = 8192
    max_batch_tokens: int = 8192
    task: TaskSettings = field(default_factory=TaskSettings)

    def __post_init__(self) -> None:
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {SELECTIONS}, got {self.selection!r}")
        if self.responses_from not in ("a", "b"):
            raise ValueError(f"responses_from must be 'a' or 'b', got {self.responses_from!r}")
        if self.metric not in SPIKE_METRICS:
            raise ValueError(f"metric must be one of {SPIKE_METRICS}, got {self.metric!r}")


def select_problems(correct_a: dict[str, bool], correct_b: dict[str, bool], selection: str) -> list[str]:
    """Problem ids (in correct_a's order) in the requested slice of (A correct, B correct)."""
    if selection not in SELECTIONS:
        raise ValueError(f"selection must be one of {SELECTIONS}, got {selection!r}")
    want = {"a_fail_b_success": (False, True), "a_success_b_fail": (True, False), "both_fail": (False, False),
            "both_success": (True, True)}.get(selection)
    return [p for p, a in correct_a.items() if p in correct_b and (want is None or (a, correct_b[p]) == want)]


def run_rl_probe(reference: Checkpoint, checkpoints: Sequence[Checkpoint], rows: list[dict], out_dir: str | Path,
                 settings: ProbeSettings = ProbeSettings(), *, probe_id: str | None = None, models: dict | None = None,
                 greedy_a: list[dict] | None = None, greedy_b: list[dict] | None = None,
                 progress=None) -> tuple[ProbeTables, dict[str, Any]]:
    """The RL-Probe analysis of `checkpoints` (last = B) against `reference` (A) on `rows`; writes the report.

    models: optional {checkpoint name: (model, tokenizer)} already in memory (else loaded from paths).
    greedy_a, greedy_b: the greedy, verified completions of A and B when already at hand (an evaluation's
        greedy `eval_samples` rows or `sample_and_verify` records: problem_id, response, status or correct),
        so they are not sampled again; they must have been made with the same template.
    Returns the tables and a summary dict (also written as summary.json).
    """
    import torch

    t0 = time.monotonic()
    if not checkpoints:
        raise ValueError("run_rl_probe needs at least one checkpoint to compare with the reference")
    names = [reference.name] + [c.name for c in checkpoints]
    if len(set(names)) != len(names):
        raise ValueError(f"reference and checkpoint names must be distinct (they key the tables), got {names}")
    models = dict(models or {})
    say = progress or (lambda stage, msg: None)

    def get(ck: Checkpoint):
        if ck.name not in models:
            models[ck.name] = load_checkpoint_model(ck)
        return models[ck.name]

    given_models = set(models)
    model_a, tok = get(reference)
    final = checkpoints[-1]
    model_b, _ = get(final)
    task = settings.task
    wanted = {r["id"] for r in rows}

    def given(recs: list[dict]) -> list[dict]:  # greedy rows only (eval_samples hold sampled ones too)
        return [{k: v for k, v in r.items() if k != "greedy"} for r in recs
                if r["problem_id"] in wanted and r.get("greedy", True)]

    rec_a = given(greedy_a) if greedy_a is not None else task.sample(model_a, tok, rows, n=1, temperature=0.0,
                                                                     stage="probe/a")
    rec_b = given(greedy_b) if greedy_b is not None else task.sample(model_b, tok, rows, n=1, temperature=0.0,
                                                                     stage="probe/b")
    ok_a = {r["problem_id"]: bool(r.get("correct", r.get("status") == "correct")) for r in rec_a}
    ok_b = {r["problem_id"]: bool(r.get("correct", r.get("status") == "correct")) for r in rec_b}
    chosen = select_problems(ok_a, ok_b, settings.selection)[: settings.max_problems or None]
    say("probe", f"{len(chosen)} problems in slice {settings.selection} (A correct {sum(ok_a.values())}, "
                 f"B correct {sum(ok_b.values())} of {len(rows)})")
    src = rec_a if settings.responses_from == "a" else rec_b
    keep = set(chosen)
    by_id = {r["id"]: r for r in rows}
    seqs = sequences_from_records([r for r in src if r["problem_id"] in keep], by_id, tok, task.template_id,
                                  source=f"{settings.responses_from}_greedy")
    probe_id = probe_id or f"probe-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"
    # One checkpoint at a time (besides A and B): a long training run's checkpoints need not fit in memory
    # together; the price is one more forward of A per checkpoint.
    stats = {}
    for ck in checkpoints:
        stats.update(teacher_forced_stats(model_a, {ck.name: get(ck)[0]}, seqs,
                                          pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else 0,
                                          vocab_chunk=settings.vocab_chunk, max_batch_tokens=settings.max_batch_tokens,
                                          dtype=torch.float32))
        if ck is not final and ck.name not in given_models:
            models.pop(ck.name)
        say("probe", f"scored {ck.name}")
    tokens = token_table(stats, seqs, tok, probe_id=probe_id, reference=reference.name, checkpoints=checkpoints,
                         rule=settings.rule, metric=settings.metric)
    tables = summarise(tokens, metric=settings.metric, turning_rel_tol=settings.turning_rel_tol)
    meta = {
        "probe_id": probe_id, "reference": asdict(reference), "checkpoints": [asdict(c) for c in checkpoints],
        "settings": _jsonable(asdict(settings)), "spike_rule": settings.rule.describe(),
        "n_rows": len(rows), "accuracy_a": sum(ok_a.values()) / max(len(rows), 1),
        "accuracy_b": sum(ok_b.values()) / max(len(rows), 1), "n_selected": len(chosen),
        "n_sequences": len(seqs), "n_tokens_per_checkpoint": sum(len(s.response_ids) for s in seqs),
        "duration_s": round(time.monotonic() - t0, 3),
    }
    write_report(tables, out_dir, meta, settings)
    return tables, meta


def _jsonable(x: Any) -> Any:
    return json.loads(json.dumps(x, default=str))


def write_tables(tables: dict[str, pa.Table], out_dir: str | Path) -> list[Path]:
    """One Parquet file per table (`<name>.parquet`)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, t in tables.items():
        pq.write_table(t, out / f"{name}.parquet")
        paths.append(out / f"{name}.parquet")
    return paths


def _fmt(v: Any, nd: int = 4) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def md_table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_fmt(v) for v in r) + " |" for r in rows]
    return out


def write_report(tables: ProbeTables, out_dir: str | Path, meta: dict[str, Any],
                 settings: ProbeSettings = ProbeSettings()) -> Path:
    """report.md + figures/*.png + <table>.parquet + summary.json in out_dir; returns the report path."""
    out = Path(out_dir)
    write_tables(tables.as_dict(), out)
    ck = tables.checkpoints.to_pydict()
    pr = tables.problems.to_pydict()
    cat = tables.categories.to_pydict()
    tp = tables.turning_points.to_pydict()
    metric = settings.metric
    last = ck["checkpoint"][-1] if ck["checkpoint"] else None
    figs = out / "figures"
    made = []
    if last is not None:
        made.append(fig.kl_distribution(tables.checkpoints, tables.tokens, metric, figs / "kl_distribution.png"))
        made.append(fig.spike_analysis(tables.checkpoints, tables.problems, figs / "spike_analysis.png"))
        made.append(fig.category_breakdown(tables.categories, last, figs / "category_breakdown.png"))
    final_rows = [i for i, c in enumerate(pr["checkpoint"]) if c == last]
    by_spikes = sorted(final_rows, key=lambda i: (-pr["n_spikes"][i], -pr["mean_kl"][i]))
    by_kl = sorted(final_rows, key=lambda i: -pr["mean_kl"][i])
    sample_ids = [pr["sequence_id"][i] for i in by_spikes[: settings.sample_figures]]
    if sample_ids:
        made.append(fig.sample_sequences(tables.tokens, last, sample_ids, metric, figs / "sample_kl_sequences.png"))

    lines = [f"# RL-Probe: token-level KL between checkpoints ({meta.get('probe_id', '')})", ""]
    lines += [f"Reference (A): `{meta['reference']['name']}`; final checkpoint (B): `{last}`. Slice "
              f"`{settings.selection}`: {meta.get('n_selected', '?')} of {meta.get('n_rows', '?')} problems "
              f"(greedy accuracy A {_fmt(meta.get('accuracy_a'), 3)}, B {_fmt(meta.get('accuracy_b'), 3)}). "
              f"Responses teacher-forced: {settings.responses_from.upper()}'s greedy completions. "
              f"Metric: `{metric}`; spike rule: {settings.rule.describe()}.", ""]
    if last is None:
        lines += ["No problem fell in the selected slice, so there is nothing to analyse.", ""]
    else:
        j = len(ck["checkpoint"]) - 1
        lines += ["## Summary", "",
                  f"- mean {metric} per problem: {ck['mean_kl'][j]:.4g} ± {ck['std_kl'][j]:.4g} (std over problems)",
                  f"- spikes: {ck['total_spikes'][j]} in total, {ck['mean_spikes'][j]:.2f} per problem, "
                  f"mean spike value {_fmt(ck['mean_spike_value'][j])}",
                  f"- mean entropy: A {ck['mean_entropy_a'][j]:.4f}, B {ck['mean_entropy_b'][j]:.4f}; "
                  f"mean Δlog p {ck['mean_dlogp'][j]:+.4f}", ""]
        lines += ["## Checkpoints", ""]
        lines += md_table(["checkpoint", "step", "problems", "tokens", "mean KL", "std KL", "median KL", "min KL",
                            "max KL", "mean spikes", "total spikes", "mean spike value", "entropy B", "mean Δlog p"],
                           [[ck[k][i] for k in ("checkpoint", "step", "n_sequences", "n_tokens", "mean_kl", "std_kl",
                                                 "median_kl", "min_kl", "max_kl", "mean_spikes", "total_spikes",
                                                 "mean_spike_value", "mean_entropy_b", "mean_dlogp")]
                            for i in range(len(ck["checkpoint"]))])
        lines.append("")
        lines += _progression_lines(ck, tp, settings)
        lines += [f"## Token categories ({last})", ""]
        crow = sorted([i for i, c in enumerate(cat["checkpoint"]) if c == last], key=lambda i: -cat["mean_kl"][i])
        lines += md_table(["category", "tokens", "mean KL", "spikes", "spike rate", "share of spikes", "mean Δlog p"],
                           [[cat[k][i] for k in ("category", "n_tokens", "mean_kl", "n_spikes", "spike_rate",
                                                 "spike_share", "mean_dlogp")] for i in crow])
        lines += ["", f"Categories: {', '.join(CATEGORIES)}; rules in docs/probes.md.", ""]
        lines += _spike_lines(pr, final_rows, by_spikes, by_kl, last, settings)
        lines += ["", "## Figures", ""]
        lines += [f"![{p.stem}](figures/{p.name})" for p in made]
        lines.append("")
    lines += ["## Method", "",
              "Each response is fed after its prompt to A and to every checkpoint (teacher forcing). At every response "
              "token, with p_A and p_B the two next-token distributions over the *whole* vocabulary: kl_ab = KL(p_A‖p_B), "
              "kl_ba = KL(p_B‖p_A), kl_sym = their mean, entropies of both, and Δlog p = log p_B(y) − log p_A(y) of the "
              "actual token y. Computed exactly (no top-k truncation), one vocabulary chunk at a time "
              "(`rlvr_core/probe/token_stats.py`). Tables: `probe_*.parquet` in this folder (schemas in docs/probes.md).",
              ""]
    (out / "report.md").write_text("\n".join(lines))
    (out / "summary.json").write_text(json.dumps(_jsonable(meta), indent=2))
    return out / "report.md"


def _progression_lines(ck: dict[str, list], tp: dict[str, list], settings: ProbeSettings) -> list[str]:
    """The report's progression and turning points across the stepped checkpoints (none with fewer than 2)."""
    lines: list[str] = []
    stepped = [i for i, s in enumerate(ck["step"]) if s is not None]
    if len(stepped) >= 2:
        a, b = stepped[0], stepped[-1]
        dkl = ck["mean_kl"][b] - ck["mean_kl"][a]
        rel = f" ({100 * dkl / ck['mean_kl'][a]:+.1f}%)" if ck["mean_kl"][a] else ""
        lines += ["### Progression", "",
                  f"- mean KL: {ck['mean_kl'][a]:.4g} (step {ck['step'][a]}) → {ck['mean_kl'][b]:.4g} "
                  f"(step {ck['step'][b]}){rel}",
                  f"- spikes per problem: {ck['mean_spikes'][a]:.2f} → {ck['mean_spikes'][b]:.2f} "
                  f"({ck['mean_spikes'][b] - ck['mean_spikes'][a]:+.2f})", ""]
        lines += ["### Turning points", "",
                  f"Rule: docs/probes.md (`turning_points`, flat below {settings.turning_rel_tol:g} × range).", ""]
        if tp["series"]:
            lines += md_table(["series", "step", "value", "kind"],
                               [[tp["series"][i], tp["step"][i], tp["value"][i], tp["kind"][i]]
                                for i in range(len(tp["series"]))])
        else:
            lines.append("None (fewer than three steps, or a monotone trajectory).")
        lines.append("")
    return lines


def _spike_lines(pr: dict[str, list], final_rows: list[int], by_spikes: list[int], by_kl: list[int], last: str,
                 settings: ProbeSettings) -> list[str]:
    """The report's spikes-per-problem histogram and its top problems by spikes and by mean KL."""
    lines: list[str] = []
    counts = [pr["n_spikes"][i] for i in final_rows]
    bins = [("0", lambda n: n == 0), ("1–5", lambda n: 1 <= n <= 5), ("6–10", lambda n: 6 <= n <= 10),
            (">10", lambda n: n > 10)]
    lines += ["## Spikes per problem", ""]
    lines += md_table(["spikes", "problems", "share"],
                       [[lab, sum(map(f, counts)), f"{100 * sum(map(f, counts)) / max(len(counts), 1):.1f}%"]
                        for lab, f in bins])
    lines += ["", f"## Top {settings.top_n} problems by spikes ({last})", ""]
    lines += md_table(["rank", "problem", "spikes", "mean KL", "max KL"],
                       [[r + 1, f"`{pr['problem_id'][i]}`", pr["n_spikes"][i], pr["mean_kl"][i], pr["max_kl"][i]]
                        for r, i in enumerate(by_spikes[: settings.top_n])])
    lines += ["", f"## Top {settings.top_n} problems by mean KL ({last})", ""]
    lines += md_table(["rank", "problem", "mean KL", "spikes"],
                       [[r + 1, f"`{pr['problem_id'][i]}`", pr["mean_kl"][i], pr["n_spikes"][i]]
                        for r, i in enumerate(by_kl[: settings.top_n])])
    return lines


def publish(out_dir: str | Path, store, prefix: str) -> list[str]:
    """Copy the report folder into the artifact store under `prefix` (e.g. `<experiment>/<run_id>/probe`)."""
    return store.put_dir(prefix, out_dir)
