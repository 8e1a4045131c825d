"""Verification on an idle and on a loaded machine: our `VerifierPool` against pebble's `ProcessPool`.

What it answers (issue: rewards that never hang the trainer and never lose a verdict under load):
- throughput, idle and with the machine loaded by busy loops (`--load` per core, started and stopped here);
- false timeouts: `timeout` verdicts for items that are not hangs, and verdicts that differ from the same
  verifier run in-process (the reference);
- time to stop a hang: a sympy hang (`\\boxed{10^{10^{10}}}` against gold 1; interruptible Python) and a
  C-level one (a regex backtrack in `planted_verifiers`, where no signal handler runs), idle and loaded.

Inputs: IFEval (`../shared/data/ifeval/input_data.jsonl`, two responses per prompt built from the prompt:
the prompt itself and a lower-cased copy with a postscript, so every instruction gets checked, langdetect
included), and MATH-500 (gold solutions against their own answer, plus one perturbed answer each).

The peer: pebble 5.2.3 `ProcessPool` (a worker killed and replaced when a task passes its timeout), given
the same advantages as ours: the same forkserver (with our warm preload), an initializer that builds the
verifier, sets its CPU-time limit and runs `warm_up()`, and a few warm-up items before the clock starts.
Its timeout is wall-clock from the task's start, as documented.

    python benchmarks/bench_verifier_load.py [--math-limit 150] [--load 2] [--timeout-s 5] [--hang-timeout-s 2]
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import subprocess
import sys
import time
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "verifiers"))  # planted_verifiers: the C-level hang

from rlvr_core.verifiers import Outcome, Status, get_verifier, safe_verify  # noqa: E402
from rlvr_core.verifiers.final_answer import last_boxed  # noqa: E402
from rlvr_core.verifiers.pool import VerifierPool, _context  # noqa: E402

DATA = ROOT.parent / "shared" / "data"
PLANTED = "planted_verifiers:planted_math"
SYMPY_HANG = ("The answer is $\\boxed{10^{10^{10}}}$.", "1")
C_HANG = ("<<C-HANG>>", "1")


# ----------------------------------------------------------------------------------------------- inputs
def ifeval_pairs() -> list[tuple[str, dict]]:
    rows = [json.loads(line) for line in (DATA / "ifeval" / "input_data.jsonl").open()]
    pairs = []
    for r in rows:
        gold = {"instruction_id_list": r["instruction_id_list"], "kwargs": r["kwargs"], "prompt": r["prompt"]}
        pairs.append((r["prompt"], gold))
        pairs.append((r["prompt"].lower() + "\n\nP.S. that is all.", gold))
    return pairs


def math_pairs(limit: int) -> list[tuple[str, str]]:
    rows = [json.loads(line) for line in (DATA / "math500" / "test.jsonl").open()][:limit]
    pairs = [(r["solution"], r["answer"]) for r in rows]
    for i, r in enumerate(rows):
        box = last_boxed(r["solution"])
        wrong = next((r["answer"][:j] + str((int(c) + 1 + i % 3) % 10) + r["answer"][j + 1:]
                      for j, c in enumerate(r["answer"]) if c.isdigit()), r["answer"] + "+1")
        pairs.append((r["solution"].replace("\\boxed{" + box + "}", "\\boxed{" + wrong + "}") if box
                      else f"$\\boxed{{{wrong}}}$", r["answer"]))
    return pairs


# ---------------------------------------------------------------------------------------------- runners
_IN_PROCESS = r"""
import json, sys, time
from rlvr_core.verifiers import get_verifier, safe_verify
name, timeout_s, pairs = sys.argv[1], float(sys.argv[2]), json.load(open(sys.argv[3]))
verifier = get_verifier(name)
if hasattr(verifier, "set_time_limit"):
    verifier.set_time_limit(timeout_s)
verifier.warm_up()
t0 = time.perf_counter()
outs = [safe_verify(verifier, r, g) for r, g in pairs]
wall = time.perf_counter() - t0
print(json.dumps({"wall": wall, "outs": [o.to_dict() for o in outs]}))
"""


def _fresh_process(script: str, pairs, *args: str) -> str:
    """Run `script` in a fresh interpreter (none of this process's caches of these items) on `pairs`."""
    path = Path(f"/tmp/bench-verifier-load-{os.getpid()}.json")
    path.write_text(json.dumps(pairs))
    try:
        return subprocess.run([sys.executable, "-c", script, *args, str(path)], capture_output=True, text=True,
                              check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout.strip().splitlines()[-1]
    finally:
        path.unlink()


def in_process(name: str, pairs, timeout_s: float) -> tuple[float, list[Outcome]]:
    """The verifier in one process, warmed up, as `VerifierPool(workers=0)` would run it (the reference)."""
    got = json.loads(_fresh_process(_IN_PROCESS, pairs, name, str(timeout_s)))
    outs = [Outcome(**{**d, "status": Status(d["status"])}) for d in got["outs"]]
    return got["wall"], outs


_PLAIN = r"""
import json, sys, time
from math_verify import parse, verify
from rlvr_core.verifiers.math_verifier import MATH_EXAMPLES
for g, a in MATH_EXAMPLES:  # warm, but not on the benchmark's own items
    verify(parse("\\boxed{" + g + "}"), parse(f"$\\boxed{{{a}}}$"))
pairs = json.load(open(sys.argv[-1]))
t0 = time.perf_counter()
verdicts = [bool(verify(parse("\\boxed{" + g + "}"), parse(r))) for r, g in pairs]
print(time.perf_counter() - t0)
"""


def plain_math_verify(pairs) -> float:
    """Seconds for the loop a user would write, `verify(parse(gold), parse(response))`, in a fresh process
    warmed on generic answers (so neither cold start-up nor this process's caches of these items count)."""
    return float(_fresh_process(_PLAIN, pairs))


def ours(name: str, pairs, workers: int, timeout_s: float) -> tuple[float, list[Outcome], list[float]]:
    with VerifierPool(name, workers=workers, timeout_s=timeout_s) as pool:
        pool.verify_many(pairs[:4])  # started and warm before the clock
        t0 = time.perf_counter()
        outs = pool.verify_many(pairs)
        return time.perf_counter() - t0, outs, list(pool.last_done_s)


_PEBBLE_VERIFIER = None


def _pebble_init(name: str, timeout_s: float) -> None:
    global _PEBBLE_VERIFIER
    _PEBBLE_VERIFIER = get_verifier(name)
    if hasattr(_PEBBLE_VERIFIER, "set_time_limit"):
        _PEBBLE_VERIFIER.set_time_limit(timeout_s)
    _PEBBLE_VERIFIER.warm_up()


def _pebble_verify(response, gold) -> Outcome:
    return safe_verify(_PEBBLE_VERIFIER, response, gold)


def pebble(name: str, pairs, workers: int, timeout_s: float) -> tuple[float, list[Outcome], list[float]]:
    from pebble import ProcessPool
    from pebble.common import ProcessExpired

    version = get_verifier(name).version
    with ProcessPool(max_workers=workers, initializer=_pebble_init, initargs=(name, timeout_s),
                     context=_context(name)) as pool:
        # Warm-up without a timeout: pebble counts a task's time from its dispatch, and a worker still in its
        # initializer would time the warm-up item out.
        for f in [pool.schedule(_pebble_verify, args=p) for p in pairs[:2 * workers]]:
            f.result()
        t0 = time.perf_counter()
        futures = [pool.schedule(_pebble_verify, args=p, timeout=timeout_s) for p in pairs]
        outs, done = [], [0.0] * len(futures)
        for i, f in enumerate(futures):
            f.add_done_callback(lambda _f, i=i: done.__setitem__(i, time.perf_counter() - t0))
        for f in futures:
            try:
                outs.append(f.result())
            except FutureTimeout:
                outs.append(Outcome(Status.TIMEOUT, 0.0, None, name, version, "pebble: task timeout"))
            except ProcessExpired as exc:
                outs.append(Outcome(Status.ERROR, 0.0, None, name, version, f"pebble: {exc}"))
        return time.perf_counter() - t0, outs, done


def in_process_run(name: str, pairs, workers: int, timeout_s: float) -> tuple[float, list[Outcome], list[float]]:
    wall, outs = in_process(name, pairs, timeout_s)
    return wall, outs, []


RUNNERS = {"in-process": in_process_run, "ours": ours, "pebble": pebble}


# ------------------------------------------------------------------------------------------------ load
class Load:
    """`per_core` busy-loop processes per usable core while the block runs, at niceness `nice` (0: they compete
    with the runners as equals; a smoke run inside a test suite raises it so they take only idle CPU)."""

    def __init__(self, per_core: int, nice: int = 0):
        self.n, self.nice = per_core * len(os.sched_getaffinity(0)), nice
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> "Load":
        hog = f"import os; os.nice({self.nice})\nwhile True: pass"
        self.procs = [subprocess.Popen([sys.executable, "-c", hog]) for _ in range(self.n)]
        time.sleep(0.5 if self.n else 0)
        return self

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


# ------------------------------------------------------------------------------------------------ main
def compare(outs: list[Outcome], ref: list[Outcome]) -> tuple[int, int]:
    """(false timeouts, verdicts that differ from the in-process reference)."""
    false_to = sum(o.status is Status.TIMEOUT and r.status is not Status.TIMEOUT for o, r in zip(outs, ref))
    differ = sum(o.status is not r.status or o.reward != r.reward for o, r in zip(outs, ref))
    return false_to, differ


def throughput(args, sets: dict, refs: dict, loads: list[int]) -> list[dict]:
    """Each set through each runner, idle and loaded; then the math set at `--tight-timeout-s` under
    `--heavy-load`, where a wall-clock timeout meets legitimate items slowed past it."""
    rows = []
    for per_core, heavy in [*((n, False) for n in loads), (args.heavy_load, True)]:
        runs = [("math", args.tight_timeout_s)] if heavy else [(s, args.timeout_s) for s in sets]
        with Load(per_core, args.load_nice) as load:
            if "math" in sets and not heavy:
                rows.append(dict(load=per_core, hogs=load.n, set="math", runner="plain math-verify loop",
                                 timeout_s=None, items=len(sets["math"]), wall=plain_math_verify(sets["math"]),
                                 false_to=None, differ=None))
            for set_name, timeout_s in runs:
                for runner in ("ours", "pebble") if heavy else ("in-process", "ours", "pebble"):
                    wall, outs, _ = RUNNERS[runner](set_name, sets[set_name], args.workers, timeout_s)
                    false_to, differ = compare(outs, refs[set_name])
                    rows.append(dict(load=per_core, hogs=load.n, set=set_name, runner=runner, timeout_s=timeout_s,
                                     items=len(sets[set_name]), wall=wall, false_to=false_to, differ=differ))
            rows[-1]["loadavg_1m"] = os.getloadavg()[0]
            print(f"load {per_core}/core: 1-min load average at the end {os.getloadavg()[0]:.1f}", flush=True)
    return rows


def hangs(args, loads: list[int]) -> list[dict]:
    """Seconds from the batch's start to each hang's verdict, with good items around the hangs."""
    good = [("$\\boxed{\\frac{1}{2}}$", "0.5"), ("$\\boxed{3}$", "4"), ("so $x = 27.0$", "27")] * 4
    batch = good[:3] + [SYMPY_HANG] + good[3:6] + [C_HANG] + good[6:]
    rows = []
    for per_core in loads:
        with Load(per_core, args.load_nice) as load:
            for runner in ("ours", "pebble"):
                wall, outs, done = RUNNERS[runner](PLANTED, batch, args.workers, args.hang_timeout_s)
                rows.append(dict(load=per_core, hogs=load.n, runner=runner, sympy_s=done[3], c_s=done[7],
                                 sympy=outs[3].status.value, c=outs[7].status.value, c_detail=outs[7].detail,
                                 rest_ok=all(o.status is not Status.TIMEOUT for i, o in enumerate(outs) if i not in (3, 7)),
                                 wall=wall))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--math-limit", type=int, default=150, help="MATH-500 problems (x2 items)")
    ap.add_argument("--ifeval-limit", type=int, default=None, help="IFEval items (default: all 2 x 541)")
    ap.add_argument("--load", type=int, default=2, help="busy loops per core for the loaded runs")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout-s", type=float, default=5.0)
    ap.add_argument("--hang-timeout-s", type=float, default=2.0)
    ap.add_argument("--tight-timeout-s", type=float, default=1.0, help="the math set again at this timeout ...")
    ap.add_argument("--heavy-load", type=int, default=6, help="... under this many busy loops per core")
    ap.add_argument("--load-nice", type=int, default=0, help="niceness of the busy loops (19: a smoke run that "
                    "checks the benchmark's mechanics without taking CPU from other work)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = ap.parse_args()
    logging.disable(logging.WARNING)

    sets = {"ifeval": ifeval_pairs()[:args.ifeval_limit], "math": math_pairs(args.math_limit)}
    refs = {name: in_process(name, pairs, args.timeout_s)[1] for name, pairs in sets.items()}
    loads = [0, args.load]
    print(f"machine: {len(os.sched_getaffinity(0))} cores; workers {args.workers}; timeout {args.timeout_s:g} s; "
          f"loaded = {args.load} busy loops per core"
          + (f" at nice {args.load_nice}" if args.load_nice else ""))
    tp = throughput(args, sets, refs, loads)
    print("\n| load (busy loops/core) | set | timeout s | runner | items | wall s | items/s | false timeouts | "
          "verdicts ≠ in-process |")
    print("|---:|---|---:|---|---:|---:|---:|---:|---:|")
    for r in tp:
        print(f"| {r['load']} | {r['set']} | {r['timeout_s'] or ''} | {r['runner']} | {r['items']} | {r['wall']:.2f} | "
              f"{r['items'] / r['wall']:.1f} | {'' if r['false_to'] is None else r['false_to']} | "
              f"{'' if r['differ'] is None else r['differ']} |")
    ratio = {(r["load"], r["set"], r["runner"]): r["items"] / r["wall"] for r in tp if r["timeout_s"] in (None, args.timeout_s)}
    for load in loads:
        for s in sets:
            print(f"load {load}, {s}: ours/pebble = {ratio[(load, s, 'ours')] / ratio[(load, s, 'pebble')]:.2f}x, "
                  f"ours/in-process = {ratio[(load, s, 'ours')] / ratio[(load, s, 'in-process')]:.2f}x"
                  + (f", ours/plain math-verify = {ratio[(load, s, 'ours')] / ratio[(load, s, 'plain math-verify loop')]:.2f}x"
                     if s == "math" else ""))
    hg = hangs(args, loads)
    print(f"\nhangs (timeout {args.hang_timeout_s:g} s): seconds from the batch start to the hang's verdict")
    print("| load | runner | sympy hang | s | C-level hang | s | other items all verified | batch wall s |")
    print("|---:|---|---|---:|---|---:|---|---:|")
    for r in hg:
        print(f"| {r['load']} | {r['runner']} | {r['sympy']} | {r['sympy_s']:.2f} | {r['c']} | {r['c_s']:.2f} | "
              f"{r['rest_ok']} | {r['wall']:.2f} |")
    for r in hg:
        print(f"load {r['load']}, {r['runner']}, C-level hang: {r['c_detail']}")
    if args.json:
        args.json.write_text(json.dumps({"throughput": tp, "hangs": hg}, indent=1))


if __name__ == "__main__":
    mp.set_start_method("forkserver", force=True)
    main()
