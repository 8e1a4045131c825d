"""Benchmark the `math` verifier against a plain math-verify loop, measured in the same run.

Inputs: the MATH-500 gold solutions (each verified against its own answer) plus one perturbed
answer per problem (the boxed answer replaced by a different one, which must be rejected). Runs:

- `plain math-verify`: `verify(parse(gold), parse(response))` in a loop, one process, math-verify's
  own signal timeouts — the baseline a user would write;
- `our verifier in-process`: `get_verifier("math").verify` in a loop (what `VerifierPool(workers=0)` did
  before verifiers that can hang were refused in-process); `pool w=1`, `pool w=2`: our `VerifierPool("math")`;
- the same with a few planted pathological inputs (sympy hangs) mixed in.

Prints throughput (verifications/s), ratio to the plain loop, latency percentiles, agreement with the
plain loop (correct vs not), the disagreements, and whether the two bars of the issue are met
(workers=2 >= 2x the plain loop; hangs -> timeout within timeout + 1 s, rest slowed <= 10%). Usage:

    python benchmarks/bench_verifiers.py [--limit N] [--timeout-s 2] [--hangs 5]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlvr_core.verifiers import Status  # noqa: E402
from rlvr_core.verifiers.final_answer import last_boxed  # noqa: E402
from rlvr_core.verifiers.pool import VerifierPool  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "math500" / "test.jsonl"
# Expressions whose comparison makes sympy build astronomically large integers.
HANGS = ["10^{10^{10}}", "9^{9^{9}}", "(10^{8})!", "10^{10^{10}}+1", "7^{7^{7^{7}}}"]


def perturb(answer: str, i: int) -> str:
    """A different answer: shift the first digit, or append "+1" when there is none."""
    for j, ch in enumerate(answer):
        if ch.isdigit():
            return answer[:j] + str((int(ch) + 1 + i % 3) % 10) + answer[j + 1:]
    return answer + "+1"


def build_inputs(limit: int) -> list[tuple[str, str]]:
    rows = [json.loads(line) for line in DATA.open()][:limit]
    pairs = [(r["solution"], r["answer"]) for r in rows]
    for i, r in enumerate(rows):
        wrong = perturb(r["answer"], i)
        body = r["solution"]
        box = last_boxed(body)
        pairs.append((body.replace("\\boxed{" + box + "}", "\\boxed{" + wrong + "}") if box else f"$\\boxed{{{wrong}}}$",
                      r["answer"]))
    return pairs


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else float("nan")


def plain_loop(pairs):
    from math_verify import parse, verify

    lat, verdicts = [], []
    t0 = time.perf_counter()
    for response, gold in pairs:
        t = time.perf_counter()
        verdicts.append(bool(verify(parse("\\boxed{" + gold + "}"), parse(response))))
        lat.append(time.perf_counter() - t)
    return time.perf_counter() - t0, lat, verdicts


def in_process_loop(pairs, timeout_s):
    from rlvr_core.verifiers import get_verifier

    verifier, lat = get_verifier("math", time_limit_s=timeout_s), []
    t0 = time.perf_counter()
    for response, gold in pairs:
        t = time.perf_counter()
        verifier.verify(response, gold)
        lat.append(time.perf_counter() - t)
    return time.perf_counter() - t0, lat


def pool_run(pairs, workers, timeout_s, **pool_options):
    with VerifierPool("math", workers=workers, timeout_s=timeout_s, **pool_options) as pool:
        pool.verify_many(pairs[:4])  # warm-up: workers import sympy before the clock starts
        pool.latencies.clear()
        t0 = time.perf_counter()
        outs = pool.verify_many(pairs)
        wall = time.perf_counter() - t0
        return wall, list(pool.latencies), outs, dict(pool.stats), list(pool.last_done_s)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=500, help="MATH-500 problems (x2 inputs: gold + perturbed)")
    ap.add_argument("--timeout-s", type=float, default=2.0)
    ap.add_argument("--hangs", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3, help="clean/planted run pairs per pool size")
    ap.add_argument("--sideline-after-s", type=float, default=None, help="VerifierPool sideline_after_s")
    ap.add_argument("--hangs-only", action="store_true", help="skip the throughput table (bar 1)")
    args = ap.parse_args()
    opts = {}
    if args.sideline_after_s is not None:
        opts["sideline_after_s"] = args.sideline_after_s
    logging.disable(logging.WARNING)  # math-verify logs every timeout

    pairs = build_inputs(args.limit)
    print(f"inputs: {len(pairs)} (MATH-500 gold solutions + perturbed answers), timeout {args.timeout_s:g} s\n")
    print(f"pool options: {opts}\n")
    base_wall, base_lat, base_verdicts = plain_loop(pairs)
    rows = [("plain math-verify loop", base_wall, base_lat, None)]
    if not args.hangs_only:
        rows.append(("our verifier in-process", *in_process_loop(pairs, args.timeout_s), None))
    runs, clean_wall = {}, {}
    for w in ((2,) if args.hangs_only else (1, 2)):
        wall, lat, outs, stats, _ = pool_run(pairs, w, args.timeout_s, **opts)
        runs[w], clean_wall[w] = outs, wall
        rows.append((f"pool workers={w}", wall, lat, stats))

    print(f"{'run':<28}{'verif/s':>9}{'x plain':>9}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'max ms':>9}")
    for name, wall, lat, _ in rows:
        print(f"{name:<28}{len(pairs) / wall:>9.1f}{base_wall / wall:>9.2f}{pct(lat, .5):>9.2f}"
              f"{pct(lat, .95):>9.2f}{pct(lat, .99):>9.2f}{max(lat) * 1000:>9.1f}")

    speedup = base_wall / clean_wall[2]
    print(f"\nbar 1 (workers=2 >= 2x the plain loop): {speedup:.2f}x -> {'met' if speedup >= 2 else 'NOT met'}")
    outs = runs[2]
    disagree = [(i, pairs[i], o) for i, o in enumerate(outs) if (o.status is Status.CORRECT) != base_verdicts[i]]
    agree = 1 - len(disagree) / len(pairs)
    print(f"\nagreement with plain math-verify (correct vs not), workers=2: {agree:.2%} ({len(disagree)} disagreements)")
    for i, (resp, gold), o in disagree:
        print(f"  #{i} gold={gold!r} ours={o.status.value} extracted={o.extracted!r} plain={base_verdicts[i]} {o.detail[:80]}")
    print("statuses (workers=2):", {s.value: sum(o.status is s for o in outs) for s in Status})

    # Planted hangs, spread through the batch.
    if args.hangs:
        hang_pairs = list(pairs)
        step = max(1, len(pairs) // (args.hangs + 1))
        hang_idx = []
        for k in range(args.hangs):
            idx = (k + 1) * step + k
            hang_pairs.insert(idx, (f"The answer is $\\boxed{{{HANGS[k % len(HANGS)]}}}$.", "1"))
            hang_idx.append(idx)
        hset = set(hang_idx)
        print(f"\nwith {args.hangs} planted sympy hangs (timeout {args.timeout_s:g} s); 'rest done' = seconds until "
              f"the last non-hang verdict; clean and planted runs alternate, {args.repeats} of each, medians:")
        print(f"{'run':<16}{'clean s':>9}{'rest done s':>12}{'vs clean':>10}{'wall s':>8}{'normal p50':>11}"
              f"{'normal p95':>11}{'hang max s':>11}  statuses")
        for w in (1, 2):
            cleans, rests, walls, p50s, p95s, hang_max, statuses, same = [], [], [], [], [], [], set(), True
            for _ in range(args.repeats):
                cleans.append(pool_run(pairs, w, args.timeout_s, **opts)[0])
                wall, lat, outs, stats, done = pool_run(hang_pairs, w, args.timeout_s, **opts)
                walls.append(wall)
                rests.append(max(d for i, d in enumerate(done) if i not in hset))
                hang_lat = sorted(lat)[-args.hangs:]  # latencies are in completion order; hangs are the largest
                normal = sorted(lat)[:-args.hangs]
                p50s.append(pct(normal, .5))
                p95s.append(pct(normal, .95))
                hang_max.append(max(hang_lat))
                statuses |= {outs[i].status.value for i in hset}
                clean = [outs[i] for i in range(len(outs)) if i not in hset]
                same &= all((a.status is Status.CORRECT) == (b.status is Status.CORRECT) for a, b in zip(clean, runs[2]))
            med = statistics.median
            slowdown = med(rests) / med(cleans) - 1
            print(f"{'pool workers=' + str(w):<16}{med(cleans):>9.2f}{med(rests):>12.2f}{slowdown:>+10.0%}{med(walls):>8.2f}"
                  f"{med(p50s):>11.2f}{med(p95s):>11.2f}{max(hang_max):>11.2f}  hangs->{sorted(statuses)}")
            in_time = statuses == {"timeout"} and max(hang_max) <= args.timeout_s + 1
            print(f"{'':<16}non-hang verdicts identical to the clean run: {same}; all rest-done: "
                  f"{', '.join(f'{r:.2f}' for r in rests)} vs clean {', '.join(f'{c:.2f}' for c in cleans)}")
            print(f"{'':<16}bar 2: hangs -> timeout within {args.timeout_s + 1:g} s: {'met' if in_time else 'NOT met'}; "
                  f"rest slowed <= 10%: {'met' if slowdown <= 0.10 else 'NOT met'}")


if __name__ == "__main__":
    main()
