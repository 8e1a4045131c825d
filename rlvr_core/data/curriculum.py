"""Pass-rate tables, pass-rate filtering and curriculum orderings: pure functions over pyarrow tables.

Why: which prompts a run trains on, and in what order, is data that must be reproducible and inspectable,
so it is computed by pure functions from per-sample verification records and kept as a table
(problem_id, n, c, pass_rate, pass@k, mean_length, truncation_share, status counts) that the pipeline
stores as a versioned artifact. The table's ids must be the data set's ids: `reconcile_ids` fails loudly,
with counts and examples, when they are not (BUGZOO G-id-mismatch: 1,960 of 4,691 ids silently skipped).
"""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from typing import Callable, Iterable, Sequence

import numpy as np
import pyarrow as pa

from rlvr_core.core.passk import pass_at_k
from rlvr_core.core.registry import ORDERINGS, register
from rlvr_core.data.loaders import normalize_id

__all__ = ["pass_rate_table", "filter_by_pass_rate", "order_curriculum", "register_ordering", "get_ordering",
           "known_orderings", "reconcile_ids", "IdMismatchError", "DEFAULT_KS"]

DEFAULT_KS = (1, 2, 4, 8)
_REQUIRED = ("problem_id", "correct", "status", "length", "finish_reason")


# ---- pass-rate table ------------------------------------------------------------------------------------

def pass_rate_table(records: Iterable[dict] | pa.Table, ks: Sequence[int] = DEFAULT_KS) -> pa.Table:
    """One row per problem from per-sample records.

    records: dicts (or a table) with problem_id (str), correct (bool), status (str, the verifier status),
        length (int, generated tokens), finish_reason ("stop"/"length"); an optional sample_index is
        used to reject duplicated samples.
    Returns columns, rows sorted by problem_id:
        problem_id, n, c, pass_rate (= c/n), pass@k for each k in ks with k <= max n (null where k > n),
        mean_length, truncation_share (share of finish_reason == "length"),
        status_<s> (count) for every status s seen, in sorted order.
    """
    rows = records.to_pylist() if isinstance(records, pa.Table) else list(records)
    if not rows:
        raise ValueError("pass_rate_table needs at least one record")
    groups: dict[str, list[dict]] = defaultdict(list)
    seen: set[tuple[str, int]] = set()
    for i, r in enumerate(rows):
        missing = [f for f in _REQUIRED if f not in r]
        if missing:
            raise KeyError(f"record {i} lacks {missing} (has {sorted(r)})")
        if not isinstance(r["correct"], (bool, np.bool_)):
            raise TypeError(f"record {i}: correct must be bool, got {type(r['correct']).__name__}")
        if "sample_index" in r:
            key = (r["problem_id"], int(r["sample_index"]))
            if key in seen:
                raise ValueError(f"record {i}: sample {key[1]} of problem {key[0]!r} appears twice")
            seen.add(key)
        groups[str(r["problem_id"])].append(r)

    ids = sorted(groups)
    n = np.array([len(groups[p]) for p in ids], dtype=np.int64)
    c = np.array([sum(bool(r["correct"]) for r in groups[p]) for p in ids], dtype=np.int64)
    statuses = sorted({str(r["status"]) for r in rows})
    cols: dict[str, pa.Array | list] = {
        "problem_id": pa.array(ids, pa.string()),
        "n": pa.array(n),
        "c": pa.array(c),
        "pass_rate": pa.array(c / n, pa.float64()),
    }
    for k in sorted(set(int(k) for k in ks)):
        if k < 1 or k > n.max():
            continue
        ok = n >= k
        values = np.full(len(ids), np.nan)
        values[ok] = pass_at_k(n[ok], c[ok], k)
        cols[f"pass@{k}"] = pa.array(values, pa.float64(), mask=~ok)
    cols["mean_length"] = pa.array([float(np.mean([r["length"] for r in groups[p]])) for p in ids], pa.float64())
    cols["truncation_share"] = pa.array(
        [sum(r["finish_reason"] == "length" for r in groups[p]) / len(groups[p]) for p in ids], pa.float64())
    for s in statuses:
        cols[f"status_{s}"] = pa.array([sum(str(r["status"]) == s for r in groups[p]) for p in ids], pa.int64())
    return pa.table(cols)


# ---- filtering --------------------------------------------------------------------------------------------

def filter_by_pass_rate(table: pa.Table, low: float = 0.0, high: float = 1.0, drop_never: bool = True,
                        drop_always: bool = True) -> pa.Table:
    """Rows with low <= pass_rate <= high; by default also without never-solved (c == 0) and
    always-solved (c == n) problems, which give GRPO no learning signal. Needs columns n, c, pass_rate."""
    if not 0.0 <= low <= high <= 1.0:
        raise ValueError(f"need 0 <= low <= high <= 1, got low={low}, high={high}")
    rate = table.column("pass_rate").to_numpy(zero_copy_only=False)
    n = table.column("n").to_numpy(zero_copy_only=False)
    c = table.column("c").to_numpy(zero_copy_only=False)
    keep = (rate >= low) & (rate <= high)
    if drop_never:
        keep &= c > 0
    if drop_always:
        keep &= c < n
    return table.filter(pa.array(keep))


# ---- orderings --------------------------------------------------------------------------------------------

# An ordering maps (table, seed, options) to a permutation of the table's row indices.
# Each ordering below registers itself (`@register("ordering", name)`); rlvr_core/core/registry.py lists the names.
Ordering = Callable[..., list[int]]
register_ordering = ORDERINGS.add  # register_ordering(name, fn)
get_ordering = ORDERINGS.get
known_orderings = ORDERINGS.names


def order_curriculum(table: pa.Table, strategy: str, *, seed: int = 0, **options) -> pa.Table:
    """The table's rows in the order of the named strategy, with an `order` column 0..N-1 added.

    The result does not depend on the input row order: every strategy starts from rows sorted by
    problem_id and breaks ties by problem_id.
    """
    perm = get_ordering(strategy)(table, seed=seed, **options)
    if sorted(perm) != list(range(table.num_rows)):
        raise RuntimeError(f"ordering {strategy!r} did not return a permutation")
    out = table.take(pa.array(perm, pa.int64()))
    return out.append_column("order", pa.array(np.arange(table.num_rows), pa.int64()))


def _ids_and_rates(table: pa.Table) -> tuple[list[str], np.ndarray]:
    return table.column("problem_id").to_pylist(), table.column("pass_rate").to_numpy(zero_copy_only=False)


def _by_rate(table: pa.Table, descending: bool) -> list[int]:
    ids, rate = _ids_and_rates(table)
    return sorted(range(len(ids)), key=lambda i: (-rate[i] if descending else rate[i], ids[i]))


@register("ordering", "easy_to_hard")
def _easy_to_hard(table: pa.Table, seed: int = 0) -> list[int]:
    """Highest pass rate first."""
    return _by_rate(table, descending=True)


@register("ordering", "hard_to_easy")
def _hard_to_easy(table: pa.Table, seed: int = 0) -> list[int]:
    """Lowest pass rate first."""
    return _by_rate(table, descending=False)


@register("ordering", "random")
def _random(table: pa.Table, seed: int = 0) -> list[int]:
    """A seeded shuffle (numpy PCG64) of the rows sorted by problem_id."""
    ids, _ = _ids_and_rates(table)
    base = sorted(range(len(ids)), key=lambda i: ids[i])
    return [base[j] for j in np.random.default_rng(seed).permutation(len(base))]


@register("ordering", "bucketed")
def _bucketed(table: pa.Table, seed: int = 0, n_buckets: int = 4, interleave: bool = False,
              easy_first: bool = True) -> list[int]:
    """Rows ranked by pass rate (easy first unless easy_first=False) and cut into n_buckets buckets of
    (nearly) equal size; each bucket shuffled with the seed; buckets concatenated, or with interleave=True
    taken round-robin (one from each bucket in turn) so every stretch of training mixes difficulties."""
    if n_buckets < 1:
        raise ValueError(f"n_buckets must be >= 1, got {n_buckets}")
    ranked = _by_rate(table, descending=easy_first)
    rng = np.random.default_rng(seed)
    buckets = []
    for part in np.array_split(np.array(ranked, dtype=np.int64), min(n_buckets, max(len(ranked), 1))):
        buckets.append([int(part[j]) for j in rng.permutation(len(part))])
    if not interleave:
        return [i for b in buckets for i in b]
    out, depth = [], max((len(b) for b in buckets), default=0)
    for j in range(depth):
        out += [b[j] for b in buckets if j < len(b)]
    return out


@register("ordering", "interleaved")
def _interleaved(table: pa.Table, seed: int = 0, n_buckets: int = 4) -> list[int]:
    return _bucketed(table, seed=seed, n_buckets=n_buckets, interleave=True)




# ---- reconciling ids --------------------------------------------------------------------------------------

class IdMismatchError(ValueError):
    """Curriculum / pass-rate table ids that the data set does not have."""


def reconcile_ids(curriculum_ids: Iterable[str], dataset_ids: Iterable[str], tolerance: int | float = 0,
                  *, examples: int = 10) -> list[str]:
    """The curriculum ids, in order, that the data set has; raise unless the unmatched ones are tolerated.

    tolerance: 0 (default) = every id must match. An int >= 1 tolerates that many unmatched ids; a float
    in (0, 1) tolerates that fraction of the curriculum. Tolerated misses are dropped with a warning.
    The error names how many ids did not match, up to `examples` of them, and how many would match after
    `rlvr_core.data.loaders.normalize_id` (a hint that one side skipped the normalisation).
    Repeated curriculum ids are an error too.
    """
    cur = list(curriculum_ids)
    data = set(dataset_ids)
    counts: dict[str, int] = defaultdict(int)
    for i in cur:
        counts[i] += 1
    dup = sorted(i for i, k in counts.items() if k > 1)
    if dup:
        raise IdMismatchError(f"{len(dup)} ids appear more than once in the curriculum, e.g. {dup[:examples]}")
    unmatched = [i for i in cur if i not in data]
    if isinstance(tolerance, bool) or tolerance < 0:
        raise ValueError(f"tolerance must be a count >= 0 or a fraction in (0, 1), got {tolerance!r}")
    allowed = math.floor(tolerance * len(cur)) if isinstance(tolerance, float) and tolerance < 1 else int(tolerance)
    if unmatched and len(unmatched) > allowed:
        norm_data = {normalize_id(d) for d in data}
        near = sum(normalize_id(u) in norm_data for u in unmatched)
        hint = (f"; {near} of them match after normalize_id (one side is not normalised)" if near else "")
        raise IdMismatchError(
            f"{len(unmatched)} of {len(cur)} curriculum ids are not in the data set ({len(data)} ids; "
            f"tolerance {tolerance!r} allows {allowed}), e.g. {unmatched[:examples]}{hint}")
    if unmatched:
        warnings.warn(f"dropping {len(unmatched)} curriculum ids not in the data set (tolerance {tolerance!r}), "
                      f"e.g. {unmatched[:examples]}", stacklevel=2)
    return [i for i in cur if i in data]
