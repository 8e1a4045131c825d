"""Cost per item of the `code` verifier, against the plain harness it replaces, measured in the same run.

One correct MBPP-style item (a function and three asserts) verified `--n` times per round, the arms interleaved
round by round (`--rounds`), on whatever else the machine is doing:

- `ours, OS sandbox (default)`: `get_verifier("code").verify`, the solution serving a trusted tests' process, each
  in a bubblewrap sandbox of its own (two sandboxed Python processes per item);
- `ours, hook only (before the OS sandbox)`: the same with `isolation="hook-only"`, which is how every item ran
  before the OS sandbox: the audit hook alone, the solution in a network namespace, the tests' process unfenced;
- `ours, whole program in the OS sandbox`: `CodeVerifier.run` on solution + asserts, one sandboxed process with
  the pass signal and the tests inside it;
- `plain python -c`: solution + asserts run by `python -I -S -c`, exit status 0 = pass (no sandbox): the floor.

Prints the median milliseconds per item of each arm and their ratios to the hook-only arm (the per-item cost of
the OS sandbox, before and after, in one run); `--json` adds a last line with them. Usage:

    python benchmarks/bench_code_verifier.py [--n 30] [--rounds 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlvr_core.verifiers import Status, get_verifier  # noqa: E402

SOLUTION = "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a\n"
TESTS = ["assert gcd(12, 18) == 6", "assert gcd(7, 5) == 1", "assert gcd(81, 27) == 27"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=30, help="items per arm per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    verifier = get_verifier("code", time_limit_s=5.0)
    verifier.warm_up()
    hook_only = get_verifier("code", time_limit_s=5.0, isolation="hook-only")
    program = SOLUTION + "\n" + "\n".join(TESTS)

    def ours() -> bool:
        return verifier.verify(f"```python\n{SOLUTION}```", TESTS).status is Status.CORRECT

    def before() -> bool:
        return hook_only.verify(f"```python\n{SOLUTION}```", TESTS).status is Status.CORRECT

    def whole() -> bool:
        return verifier.run(program).passed

    def plain() -> bool:
        return subprocess.run([sys.executable, "-I", "-S", "-c", program], capture_output=True).returncode == 0

    arms = {"ours, OS sandbox (default)": ours, "ours, hook only (before the OS sandbox)": before,
            "ours, whole program in the OS sandbox": whole, "plain python -c": plain}
    per_round: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(args.rounds):
        for name, arm in arms.items():
            t0 = time.perf_counter()
            assert all(arm() for _ in range(args.n)), f"{name}: a correct item did not pass"
            per_round[name].append((time.perf_counter() - t0) / args.n * 1000)
    med = {name: statistics.median(v) for name, v in per_round.items()}
    base = med["ours, hook only (before the OS sandbox)"]
    for name, ms in med.items():
        print(f"{name:42s} {ms:7.1f} ms/item  (x{ms / base:.2f} of hook only, "
              f"rounds {min(per_round[name]):.1f}-{max(per_round[name]):.1f})")
    if args.json:
        print(json.dumps({"ours_ms": med["ours, OS sandbox (default)"], "hook_only_ms": base,
                          "ratio_os_to_hook_only": med["ours, OS sandbox (default)"] / base,
                          "whole_program_ms": med["ours, whole program in the OS sandbox"],
                          "plain_ms": med["plain python -c"], "n": args.n, "rounds": args.rounds}))


if __name__ == "__main__":
    main()
