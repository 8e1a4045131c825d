"""The probe's Parquet tables: one schema each, documented in docs/probes.md (the warehouse ingests them).

`token_table` turns `teacher_forced_stats` output into `probe_tokens` rows (one per checkpoint x scored
token, with token text, category and the spike mark); `summarise` derives `probe_problems`,
`probe_checkpoints`, `probe_categories` and `probe_turning_points` from it. Everything downstream (the
markdown report, figures, warehouse queries) reads these tables, so a number in the report can always
be recomputed with SQL over them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from rlvr_core.probe.categories import CATEGORIES, token_categories
from rlvr_core.probe.spikes import SpikeRule, detect_spikes, pooled_moments, turning_points
from rlvr_core.probe.token_stats import STAT_FIELDS, ProbeSequence, TokenStats

__all__ = ["TOKENS_SCHEMA", "PROBLEMS_SCHEMA", "CHECKPOINTS_SCHEMA", "CATEGORIES_SCHEMA", "TURNING_POINTS_SCHEMA",
           "Checkpoint", "token_table", "summarise", "ProbeTables", "SPIKE_METRICS"]

SPIKE_METRICS = ("kl_ba", "kl_ab", "kl_sym", "dlogp_abs")

_F = pa.float64()
TOKENS_SCHEMA = pa.schema([
    ("probe_id", pa.string()), ("checkpoint_a", pa.string()), ("checkpoint_b", pa.string()), ("step_b", pa.int64()),
    ("sequence_id", pa.string()), ("problem_id", pa.string()), ("sample_index", pa.int32()), ("source", pa.string()),
    ("position", pa.int32()), ("token_id", pa.int32()), ("token_text", pa.string()), ("category", pa.string()),
    *[(f, _F) for f in STAT_FIELDS], ("is_spike", pa.bool_()),
])
PROBLEMS_SCHEMA = pa.schema([
    ("probe_id", pa.string()), ("checkpoint", pa.string()), ("step", pa.int64()), ("sequence_id", pa.string()),
    ("problem_id", pa.string()), ("source", pa.string()), ("n_tokens", pa.int32()), ("mean_kl", _F), ("max_kl", _F),
    ("n_spikes", pa.int32()), ("mean_spike_value", _F), ("mean_entropy_a", _F), ("mean_entropy_b", _F),
    ("mean_dlogp", _F), ("sum_logp_a", _F), ("sum_logp_b", _F),
])
CHECKPOINTS_SCHEMA = pa.schema([
    ("probe_id", pa.string()), ("checkpoint", pa.string()), ("step", pa.int64()), ("metric", pa.string()),
    ("n_sequences", pa.int32()), ("n_tokens", pa.int64()), ("mean_kl", _F), ("std_kl", _F), ("median_kl", _F),
    ("min_kl", _F), ("max_kl", _F), ("token_mean_kl", _F), ("mean_spikes", _F), ("total_spikes", pa.int64()),
    ("mean_spike_value", _F), ("mean_entropy_a", _F), ("mean_entropy_b", _F), ("mean_dlogp", _F),
])
CATEGORIES_SCHEMA = pa.schema([
    ("probe_id", pa.string()), ("checkpoint", pa.string()), ("step", pa.int64()), ("category", pa.string()),
    ("n_tokens", pa.int64()), ("mean_kl", _F), ("n_spikes", pa.int64()), ("spike_rate", _F), ("spike_share", _F),
    ("mean_dlogp", _F),
])
TURNING_POINTS_SCHEMA = pa.schema([
    ("probe_id", pa.string()), ("series", pa.string()), ("step", pa.int64()), ("value", _F), ("kind", pa.string()),
])


@dataclass(frozen=True)
class Checkpoint:
    """A model compared against the reference: its name in tables, training step (None if unknown)."""

    name: str
    step: int | None = None
    path: str | None = None


def metric_values(stats: Mapping[str, np.ndarray], metric: str) -> np.ndarray:
    """The per-token value spikes are detected on: a KL column, or |Δlog p| for "dlogp_abs"."""
    if metric == "dlogp_abs":
        return np.abs(stats["dlogp"])
    if metric not in ("kl_ab", "kl_ba", "kl_sym"):
        raise ValueError(f"spike metric must be one of {SPIKE_METRICS}, got {metric!r}")
    return stats[metric]


def token_table(results: Mapping[str, Sequence[TokenStats]], sequences: Sequence[ProbeSequence], tokenizer, *,
                probe_id: str, reference: str, checkpoints: Sequence[Checkpoint], rule: SpikeRule = SpikeRule(),
                metric: str = "kl_ba") -> pa.Table:
    """`probe_tokens` rows for every checkpoint (in the given order) and every response token."""
    cats = token_categories(tokenizer, (t for s in sequences for t in s.response_ids))
    cols: dict[str, list] = defaultdict(list)
    for ck in checkpoints:
        per_seq = [{f: getattr(st, f).numpy() for f in STAT_FIELDS} for st in results[ck.name]]
        vals = [metric_values(st, metric) for st in per_seq]
        pooled = pooled_moments(vals, rule.kind) if rule.scope == "checkpoint" else None
        for s, st, v in zip(sequences, per_seq, vals):
            r = len(s.response_ids)
            spikes = detect_spikes(v, rule, pooled=pooled)
            cols["checkpoint_b"] += [ck.name] * r
            cols["step_b"] += [ck.step] * r
            cols["sequence_id"] += [s.sequence_id] * r
            cols["problem_id"] += [s.problem_id] * r
            cols["sample_index"] += [s.sample_index] * r
            cols["source"] += [s.source] * r
            cols["position"] += range(r)
            cols["token_id"] += s.response_ids
            cols["token_text"] += [cats[t][0] for t in s.response_ids]
            cols["category"] += [cats[t][1] for t in s.response_ids]
            for f in STAT_FIELDS:
                cols[f].append(st[f])
            cols["is_spike"].append(spikes)
    n = len(cols["position"])
    data = {"probe_id": [probe_id] * n, "checkpoint_a": [reference] * n}
    for name in TOKENS_SCHEMA.names[2:]:
        v = cols[name]
        if name in STAT_FIELDS or name == "is_spike":
            data[name] = np.concatenate(v) if v else np.zeros(0, dtype=bool if name == "is_spike" else np.float64)
        else:
            data[name] = v
    return pa.table(data, schema=TOKENS_SCHEMA)


@dataclass
class ProbeTables:
    tokens: pa.Table
    problems: pa.Table
    checkpoints: pa.Table
    categories: pa.Table
    turning_points: pa.Table

    def as_dict(self) -> dict[str, pa.Table]:
        return {"probe_tokens": self.tokens, "probe_problems": self.problems, "probe_checkpoints": self.checkpoints,
                "probe_categories": self.categories, "probe_turning_points": self.turning_points}


def _mean(x) -> float | None:
    x = np.asarray(x, dtype=np.float64)
    return float(x.mean()) if x.size else None


def summarise(tokens: pa.Table, *, metric: str = "kl_ba", turning_rel_tol: float = 0.05) -> ProbeTables:
    """Per problem, per checkpoint, per category tables and turning points from a `probe_tokens` table."""
    t = tokens.to_pydict()
    probe_id = t["probe_id"][0] if t["probe_id"] else ""
    arr = {f: np.asarray(t[f], dtype=np.float64) for f in STAT_FIELDS}
    kl = metric_values(arr, metric)
    spike = np.asarray(t["is_spike"], dtype=bool)
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    ck_order: list[str] = []
    steps: dict[str, int | None] = {}
    for i, (ck, sid) in enumerate(zip(t["checkpoint_b"], t["sequence_id"])):
        if ck not in steps:
            ck_order.append(ck)
            steps[ck] = t["step_b"][i]
        groups[(ck, sid)].append(i)

    prob: dict[str, list] = defaultdict(list)
    for (ck, sid), idx in groups.items():
        ix = np.asarray(idx)
        sp = spike[ix]
        prob["checkpoint"].append(ck)
        prob["step"].append(steps[ck])
        prob["sequence_id"].append(sid)
        prob["problem_id"].append(t["problem_id"][idx[0]])
        prob["source"].append(t["source"][idx[0]])
        prob["n_tokens"].append(len(idx))
        prob["mean_kl"].append(float(kl[ix].mean()))
        prob["max_kl"].append(float(kl[ix].max()))
        prob["n_spikes"].append(int(sp.sum()))
        prob["mean_spike_value"].append(_mean(kl[ix][sp]))
        prob["mean_entropy_a"].append(float(arr["entropy_a"][ix].mean()))
        prob["mean_entropy_b"].append(float(arr["entropy_b"][ix].mean()))
        prob["mean_dlogp"].append(float(arr["dlogp"][ix].mean()))
        prob["sum_logp_a"].append(float(arr["logp_a"][ix].sum()))
        prob["sum_logp_b"].append(float(arr["logp_b"][ix].sum()))
    n_prob = len(prob["checkpoint"])
    problems = pa.table({"probe_id": [probe_id] * n_prob, **prob} if n_prob else
                        {name: [] for name in PROBLEMS_SCHEMA.names}, schema=PROBLEMS_SCHEMA)

    ck_rows: dict[str, list] = defaultdict(list)
    cat_rows: dict[str, list] = defaultdict(list)
    ck_col = np.asarray(t["checkpoint_b"], dtype=object)
    cat_col = np.asarray(t["category"], dtype=object)
    pck = np.asarray(prob["checkpoint"], dtype=object)
    for ck in ck_order:
        m = pck == ck
        means = np.asarray(prob["mean_kl"], dtype=np.float64)[m]
        nsp = np.asarray(prob["n_spikes"], dtype=np.float64)[m]
        tm = ck_col == ck
        ck_rows["checkpoint"].append(ck)
        ck_rows["step"].append(steps[ck])
        ck_rows["n_sequences"].append(int(m.sum()))
        ck_rows["n_tokens"].append(int(tm.sum()))
        ck_rows["mean_kl"].append(float(means.mean()))
        ck_rows["std_kl"].append(float(means.std()))
        ck_rows["median_kl"].append(float(np.median(means)))
        ck_rows["min_kl"].append(float(means.min()))
        ck_rows["max_kl"].append(float(means.max()))
        ck_rows["token_mean_kl"].append(float(kl[tm].mean()))
        ck_rows["mean_spikes"].append(float(nsp.mean()))
        ck_rows["total_spikes"].append(int(spike[tm].sum()))
        ck_rows["mean_spike_value"].append(_mean(kl[tm & spike]))
        ck_rows["mean_entropy_a"].append(float(arr["entropy_a"][tm].mean()))
        ck_rows["mean_entropy_b"].append(float(arr["entropy_b"][tm].mean()))
        ck_rows["mean_dlogp"].append(float(arr["dlogp"][tm].mean()))
        _add_category_rows(cat_rows, ck, steps[ck], tm, cat_col, spike, kl, arr["dlogp"])
    n_ck, n_cat = len(ck_rows["checkpoint"]), len(cat_rows["checkpoint"])
    checkpoints = pa.table({"probe_id": [probe_id] * n_ck, "metric": [metric] * n_ck, **ck_rows} if n_ck else
                           {name: [] for name in CHECKPOINTS_SCHEMA.names}, schema=CHECKPOINTS_SCHEMA)
    categories = pa.table({"probe_id": [probe_id] * n_cat, **cat_rows} if n_cat else
                          {name: [] for name in CATEGORIES_SCHEMA.names}, schema=CATEGORIES_SCHEMA)

    tp_rows = _turning_rows(ck_rows, turning_rel_tol)
    n_tp = len(tp_rows["series"])
    turning = pa.table({"probe_id": [probe_id] * n_tp, **tp_rows} if n_tp else
                       {name: [] for name in TURNING_POINTS_SCHEMA.names}, schema=TURNING_POINTS_SCHEMA)
    return ProbeTables(tokens, problems, checkpoints, categories, turning)


def _add_category_rows(cat_rows: dict[str, list], ck: str, step: int | None, tm: np.ndarray, cat_col: np.ndarray,
                       spike: np.ndarray, kl: np.ndarray, dlogp: np.ndarray) -> None:
    """One checkpoint's rows of the categories table (the tokens `tm`), one per category it has tokens of."""
    total_spikes = int(spike[tm].sum())
    for cat in CATEGORIES:
        cm = tm & (cat_col == cat)
        if not cm.any():
            continue
        ns = int(spike[cm].sum())
        cat_rows["checkpoint"].append(ck)
        cat_rows["step"].append(step)
        cat_rows["category"].append(cat)
        cat_rows["n_tokens"].append(int(cm.sum()))
        cat_rows["mean_kl"].append(float(kl[cm].mean()))
        cat_rows["n_spikes"].append(ns)
        cat_rows["spike_rate"].append(ns / int(cm.sum()))
        cat_rows["spike_share"].append(ns / total_spikes if total_spikes else 0.0)
        cat_rows["mean_dlogp"].append(float(dlogp[cm].mean()))


def _turning_rows(ck_rows: dict[str, list], turning_rel_tol: float) -> dict[str, list]:
    """Turning points of the checkpoints' series over their steps (three stepped checkpoints at least)."""
    tp_rows: dict[str, list] = defaultdict(list)
    stepped = [(s, i) for i, s in enumerate(ck_rows["step"]) if s is not None]
    if len(stepped) >= 3:
        for series in ("mean_kl", "mean_spikes", "mean_spike_value"):
            pts = [(s, ck_rows[series][i]) for s, i in stepped if ck_rows[series][i] is not None]
            for p in turning_points([s for s, _ in pts], [v for _, v in pts], rel_tol=turning_rel_tol):
                tp_rows["series"].append(series)
                tp_rows["step"].append(int(p["step"]))
                tp_rows["value"].append(p["value"])
                tp_rows["kind"].append(p["kind"])
    return tp_rows
