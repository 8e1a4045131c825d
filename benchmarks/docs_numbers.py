"""Re-measure every number the README and docs quote for the demo and the sweeps, and write it where they quote it.

    python benchmarks/docs_numbers.py                            # every measurement (~1 h on 2 idle cores)
    python benchmarks/docs_numbers.py --only tool-demo,demo-lr   # some of them
    python benchmarks/docs_numbers.py --render-only              # no measuring (below)
    make docs-numbers                                            # the first, in the repo's .venv

Measurements (each runs the real command in a fresh RLVR_HOME, as a new user would, and parses what it prints;
times on 2 idle cores, docs/testing.md):
  demo          `rlvr demo --json`                                                     (~4 min)
  demo-native   the same with RLVR_CPU_CAPABILITY=native (the machine's own kernels)  (~4 min)
  tool-demo     `rlvr demo -c configs/examples/tool-demo.yaml --json`                  (~2.5 min)
  demo-lr       the ablation-sweep flow inline on configs/sweeps/demo_lr.yaml (the trials `rlvr sweep run demo-lr`
                runs), its pivot read back with `rlvr sweep show <id> --json`, then the base model's greedy
                accuracy with `rlvr demo --json --set grpo.enabled=false` and the sweep's pass-rate settings
                (data, base model and pass rates come from the sweep's stage cache)        (~4.5 min)
  demo-losses   the same on configs/sweeps/demo_losses.yaml                            (~15 min)
  tools-on-off  the same on configs/sweeps/tools_on_off.yaml (base: the tool demo's config)   (~6 min)
  demo-distill  the same on configs/sweeps/demo_distill.yaml with `--set grpo.distill_teacher=run:<id>`: the
                teacher is the `demo` measurement's run, in its home, when `demo` is measured in the same call;
                otherwise a `rlvr demo` is run first in the sweep's own home              (~6 min, +4)
  demo-distill-sampled  the same with `--set grpo.distill_estimator=sampled` (TRL's server-distillation KL)
                                                                                   (~6 min, +4)
  demo-distill-score    the same with `--set grpo.distill_estimator=score` (the score-function estimator)
                                                                                   (~6 min, +4)
The thread count and kernels are the caller's (set RLVR_CPU_CAPABILITY or OMP_NUM_THREADS to change them); they go
into the record with each measurement.

Where the numbers go: `docs/benchmarks/docs_numbers.json` holds, per measurement, its values (a flat dict), the
command, the commit, the date, `numerics` and RLVR_CPU_CAPABILITY. `QUOTES` below says where each doc quotes
them: a format string rendered from one measurement's values. After measuring, each quoted place is rewritten:
the quote rendered from the recorded values must occur exactly once in its file (else an error names the file and
the quote, and nothing is written) and is replaced by the quote rendered from the new values; then the record is
saved. The new values are kept in `docs_numbers.pending.json` until then, so a doc that no longer quotes what the
record says loses no measurement: restore the quoted text and run `--render-only`, which applies the pending
values (without a pending file it only checks that every doc quotes the record; tests/test_docs_numbers.py does
the same in the suite).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
RECORD = Path("docs/benchmarks/docs_numbers.json")
PENDING = Path("docs/benchmarks/docs_numbers.pending.json")


@dataclass(frozen=True)
class Quote:
    """`template` rendered from `measurement`'s values occurs exactly once in `file` (relative to the repo)."""
    file: str
    measurement: str
    template: str


# Cell keys of a sweep's values: `<short swept name>=<value as the pivot prints it>`, dots as `_` (a format field
# cannot hold a dot): `lr=0_0003/mean`, `policy_loss=cispo/per_seed`. In the templates below `{H/` and `{L/` stand
# for demo-lr's two cells, lr 3e-4 and 3e-5.
def _lr(template: str) -> str:
    return template.replace("{H/", "{lr=0_0003/").replace("{L/", "{lr=3e-05/")


QUOTES: tuple[Quote, ...] = (
    Quote("README.md", "tool-demo", "greedy {base_greedy:.3f} -> {trained_greedy:.3f},"),
    Quote("README.md", "tool-demo", "tool-call rate {base_tool_call_rate:.3g} -> {trained_tool_call_rate:.3g}"),
    Quote("README.md", "demo-lr", _lr("reach greedy {H/mean:.3f}")),
    Quote("README.md", "demo-lr", _lr("# [{H/ci_low:.3f}, {H/ci_high:.3f}], at 3e-5 {L/mean:.3f} [{L/ci_low:.3f}, "
                                      "{L/ci_high:.3f}] (base {base_greedy:.3f});")),
    Quote("docs/demo.md", "demo-native",
          "With `RLVR_CPU_CAPABILITY=native` ({date}, commit {commit}, {cpu_capability} kernels, {torch_threads} threads):\n"
          "**{base_greedy:.3f} → {trained_greedy:.3f}, {delta_points:+.1f} [{delta_ci_low_points:+.1f}, "
          "{delta_ci_high_points:+.1f}]** (paired, n = {n}; McNemar p {mcnemar_p:.0e})"),
    Quote("docs/demo.md", "demo",
          "`rlvr demo` ({date}, commit {commit}, {cpu_capability} kernels, {torch_threads} threads): base greedy **{base_greedy:.3f}** [{base_ci_low:.3f}, {base_ci_high:.3f}] → "
          "**{trained_greedy:.3f}** [{trained_ci_low:.3f}, {trained_ci_high:.3f}],\n  paired **{delta_points:+.1f} "
          "[{delta_ci_low_points:+.1f}, {delta_ci_high_points:+.1f}]** (n = {n}), base pass@32 {base_pass_at_32:.3f}, "
          "{wall_s:.0f} s"),
    Quote("docs/environments.md", "tool-demo",
          "Measured {date} on this 2-core machine in a fresh home (`RLVR_HOME=<new folder>`, commit {commit}, "
          "{torch_threads} threads,\n{cpu_capability} kernels;"),
    Quote("docs/environments.md", "tool-demo",
          "| held-out greedy accuracy (n = {n}, 95% Wilson) | {base_greedy:.3f} [{base_ci_low:.3f}, {base_ci_high:.3f}] "
          "| **{trained_greedy:.3f} [{trained_ci_low:.3f}, {trained_ci_high:.3f}]** |"),
    Quote("docs/environments.md", "tool-demo",
          "| trained - base on the same problems (paired 95% CI) | | **{delta_points:+.1f} points "
          "[{delta_ci_low_points:+.1f}, {delta_ci_high_points:+.1f}]** |"),
    Quote("docs/environments.md", "tool-demo",
          "| greedy tool-call rate (n = {n}, 95% Wilson) | {base_tool_call_rate:.3f} [{base_tool_call_ci_low:.3f}, "
          "{base_tool_call_ci_high:.3f}] | **{trained_tool_call_rate:.3f} [{trained_tool_call_ci_low:.3f}, "
          "{trained_tool_call_ci_high:.3f}]** |"),
    Quote("docs/environments.md", "tool-demo",
          "| pass@8 of 8 samples at temperature 1 | {base_pass_at_8:.3f} | {trained_pass_at_8:.3f} |"),
    Quote("docs/environments.md", "tool-demo",
          "| rollout tool-call rate (step 1 -> step {train_steps}) | {rollout_tool_call_rate_first:.2f} | "
          "{rollout_tool_call_rate_last:.2f} |"),
    Quote("docs/environments.md", "tools-on-off", "{pivot_table_in_list}"),
    Quote("docs/environments.md", "tools-on-off",
          "With the calculator, 20 steps reach {name=tools/mean:.3f} [{name=tools/ci_low:.3f}, {name=tools/ci_high:.3f}] "
          "from the base's {base_greedy:.3f};"),
    Quote("docs/orchestration.md", "demo-lr", "{pivot_table}"),
    Quote("docs/orchestration.md", "demo-lr", "answers {base_greedy:.3f} of them greedily"),
    Quote("docs/orchestration.md", "demo-lr", _lr("reach {H/mean:.3f}; at 3e-5 they reach {L/mean:.3f}")),
    Quote("docs/orchestration.md", "demo-lr",
          _lr("trials score {H/seed_min:.3f}–{H/seed_max:.3f}, Wilson intervals from {H/wilson_low_min:.3f} up;")),
    Quote("docs/orchestration.md", "demo-lr",
          _lr("the small lr's {L/seed_min:.3f}–{L/seed_max:.3f}, Wilson intervals up to {L/wilson_high_max:.3f})")),
    Quote("docs/grpo_training.md", "demo-distill", "{pivot_table}"),
    Quote("docs/grpo_training.md", "demo-distill",
          "the demo's trained model: held-out greedy {teacher_greedy:.3f} (its base {base_greedy:.3f}). The pivot:"),
    Quote("docs/grpo_training.md", "demo-distill",
          "Distillation alone reaches {distill_weight=1_0/mean:.3f} [{distill_weight=1_0/ci_low:.3f}, "
          "{distill_weight=1_0/ci_high:.3f}] in 10 steps (seeds {distill_weight=1_0/per_seed}), a twelfth of the\n"
          "demo's 120-step budget, against the teacher's {teacher_greedy:.3f}:"),
    Quote("docs/grpo_training.md", "demo-distill",
          "GRPO alone, on the same 10 steps, reaches {distill_weight=0_0/mean:.3f} [{distill_weight=0_0/ci_low:.3f}, "
          "{distill_weight=0_0/ci_high:.3f}],"),
    Quote("docs/grpo_training.md", "demo-distill",
          "mixing the two (0.5) gives no more than distillation alone ({distill_weight=0_5/mean:.3f})."),
    Quote("docs/grpo_training.md", "demo-distill-sampled", "{pivot_table}"),
    Quote("docs/grpo_training.md", "demo-distill-sampled",
          "a teacher of its own, a fresh `rlvr demo`: held-out greedy {teacher_greedy:.3f}, the same as above;"),
    Quote("docs/grpo_training.md", "demo-distill-sampled",
          "With the two-outcome KL, distillation alone reaches {distill_weight=1_0/mean:.3f} "
          "[{distill_weight=1_0/ci_low:.3f}, {distill_weight=1_0/ci_high:.3f}] in 10 steps"),
    Quote("docs/grpo_training.md", "demo-distill-score", "{pivot_table}"),
    Quote("docs/grpo_training.md", "demo-distill-score",
          "threads; its own teacher again, held-out greedy {teacher_greedy:.3f};"),
    Quote("docs/grpo_training.md", "demo-distill-score",
          "distillation alone reaches {distill_weight=1_0/mean:.3f} [{distill_weight=1_0/ci_low:.3f}, "
          "{distill_weight=1_0/ci_high:.3f}] and the\nequal mix {distill_weight=0_5/mean:.3f} in 10 steps"),
    Quote("docs/grpo_training.md", "demo-losses", "{pivot_table}"),
    Quote("docs/grpo_training.md", "demo-losses",
          "From the base model's {base_greedy:.3f} every loss reaches {min_mean:.2f}–{max_mean:.2f} in 10 steps"),
)


class QuoteError(RuntimeError):
    """A quoted place that is not where the record says: one line per file and quote."""


# ------------------------------------------------------------------------------------------ rendering
def render(quote: Quote, record: dict[str, Any]) -> str:
    m = record["measurements"].get(quote.measurement)
    if m is None:
        raise QuoteError(f"{quote.file}: quote {quote.template!r}: no recorded measurement {quote.measurement!r}")
    try:
        return quote.template.format(**m["values"])
    except (KeyError, ValueError, TypeError) as e:
        raise QuoteError(f"{quote.file}: quote {quote.template!r}: measurement {quote.measurement!r} cannot render "
                         f"it ({type(e).__name__}: {e})") from e


def check(record: dict[str, Any], root: Path = ROOT, quotes: tuple[Quote, ...] = QUOTES) -> list[str]:
    """Problems, one line each: a quote rendered from `record` that its file does not hold exactly once."""
    problems = []
    for q in quotes:
        try:
            text = render(q, record)
            n = (root / q.file).read_text().count(text)
        except (QuoteError, OSError) as e:
            problems.append(str(e))
            continue
        if n != 1:
            problems.append(f"{q.file}: quote {q.template!r} of measurement {q.measurement!r} (recorded: {text!r}) "
                            f"occurs {n} times, expected once: the doc and docs/benchmarks/docs_numbers.json disagree")
    return problems


def apply(old: dict[str, Any], new: dict[str, Any], root: Path = ROOT,
          quotes: tuple[Quote, ...] = QUOTES) -> list[str]:
    """Rewrite each quote of a measurement in `new` from its `old` rendering to its `new` one; returns the files
    changed. Every old rendering is located before any file is written: one missing (or not unique) raises
    QuoteError naming every such file and quote, and leaves every file as it was."""
    todo = [q for q in quotes if q.measurement in new["measurements"]]
    problems = check(old, root, tuple(todo))
    if problems:
        raise QuoteError("the docs do not quote the recorded numbers, nothing was rewritten:\n  " + "\n  ".join(problems))
    edits: dict[str, list[tuple[int, int, str]]] = {}
    for q in todo:
        text = (root / q.file).read_text()
        before = render(q, old)
        start = text.index(before)
        edits.setdefault(q.file, []).append((start, start + len(before), render(q, new)))
    changed = []
    for file, spans in edits.items():
        spans.sort()
        for (_, end, _), (start, _, _) in zip(spans, spans[1:]):
            if start < end:
                raise QuoteError(f"{file}: two quotes overlap; make them disjoint in QUOTES")
        path = root / file
        text = path.read_text()
        out = text
        for start, end, repl in reversed(spans):
            out = out[:start] + repl + out[end:]
        if out != text:
            path.write_text(out)
            changed.append(file)
    return changed


def merged(record: dict[str, Any], fresh: dict[str, Any]) -> dict[str, Any]:
    return {**record, "measurements": {**record["measurements"], **fresh["measurements"]}}


# ------------------------------------------------------------------------------------------ values from outputs
def _points(x: float) -> float:
    return 100.0 * x


def demo_values(s: dict[str, Any]) -> dict[str, Any]:
    """The flat values of one `rlvr demo --json` summary (a run with base and trained evaluation)."""
    d = s["comparison"]["accuracy_greedy"]
    v: dict[str, Any] = {
        "run_id": s["mlflow_run_id"], "n": s["n_eval"],
        "base_greedy": s["base_pass_at_1"], "base_ci_low": s["base_pass_at_1_ci95"][0],
        "base_ci_high": s["base_pass_at_1_ci95"][1],
        "trained_greedy": s["trained_pass_at_1"], "trained_ci_low": s["trained_pass_at_1_ci95"][0],
        "trained_ci_high": s["trained_pass_at_1_ci95"][1],
        "delta_points": _points(d["delta"]), "delta_ci_low_points": _points(d["ci_low"]),
        "delta_ci_high_points": _points(d["ci_high"]), "mcnemar_p": d.get("mcnemar_p"),
        "flow_s": s["duration_s"], "train_steps": (s.get("train") or {}).get("steps"),
    }
    for side, key in (("base", "base_pass_at_k"), ("trained", "trained_pass_at_k")):
        v.update({f"{side}_pass_at_{k}": x for k, x in (s.get(key) or {}).items()})
    for side, key in (("base", "eval"), ("trained", "trained_eval")):
        env = (s.get(key) or {}).get("environment")
        if env:
            v.update({f"{side}_tool_call_rate": env["tool_call_rate"], f"{side}_tool_call_ci_low": env["tool_call_rate_ci"][0],
                      f"{side}_tool_call_ci_high": env["tool_call_rate_ci"][1]})
    return v


def rollout_values(artifact_uri: str) -> dict[str, Any]:
    """The rollouts' tool-call rate at the first and last GRPO step, from the run folder's train/steps.parquet
    (a local artifact store); {} where the column or the file is not there."""
    import pyarrow.parquet as pq

    path = Path(artifact_uri.removeprefix("file://")) / "train" / "steps.parquet"
    if not path.is_file():
        return {}
    t = pq.read_table(path).to_pydict()
    if "env/tool_call_rate" not in t:
        return {}
    rates = [r for _, r in sorted(zip(t["step"], t["env/tool_call_rate"]))]
    return {"rollout_tool_call_rate_first": rates[0], "rollout_tool_call_rate_last": rates[-1]}


def sweep_values(pivot: dict[str, Any], n_eval: int) -> dict[str, Any]:
    """The flat values of a sweep's pivot (`rlvr sweep show --json`): per cell its mean, 95% CI, per-seed values,
    lowest and highest trial with their Wilson bounds over the `n_eval` held-out problems; the printed table."""
    from rlvr_core.core.stats import wilson_interval
    from rlvr_core.pipeline.sweeps import format_pivot, short_names

    keys, rows = pivot["swept_keys"], pivot["rows"]
    short = short_names(keys)
    table = format_pivot(rows, keys, pivot["metric"]).splitlines()[:-1]  # the rows; the CI note is prose
    v: dict[str, Any] = {"sweep_id": pivot["sweep_id"], "metric": pivot["metric"],
                         "pivot_table": "\n".join("    " + line for line in table),
                         "pivot_table_in_list": "\n".join("      " + line for line in table),  # in a list item
                         "min_mean": min(r["mean"] for r in rows), "max_mean": max(r["mean"] for r in rows)}
    for r in rows:
        cell = " ".join(f"{short[k]}={r[k] if isinstance(r[k], str) else json.dumps(r[k])}" for k in keys)
        cell = cell.replace(".", "_").replace(" ", ",")
        seeds = [float(x) for x in r["per_seed"].split(", ")]
        v.update({f"{cell}/{k}": r[k] for k in ("mean", "ci_low", "ci_high", "n_seeds", "per_seed", "seeds", "ci")})
        v.update({f"{cell}/{short[k]}": r[k] for k in keys})  # the swept value itself: `lr=0_0003/lr` = 0.0003
        v.update({f"{cell}/seed_min": min(seeds), f"{cell}/seed_max": max(seeds),
                  f"{cell}/wilson_low_min": wilson_interval(round(min(seeds) * n_eval), n_eval)[0],
                  f"{cell}/wilson_high_max": wilson_interval(round(max(seeds) * n_eval), n_eval)[1]})
    return v


# ------------------------------------------------------------------------------------------ running commands
def child_env(home: Path, **extra: str) -> dict[str, str]:
    """This environment without any rlvr, MLflow or Prefect setting but the kernels' pin, the home, the repo first
    on the path (the checkout this script is in is what is measured)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MLFLOW_", "PREFECT_", "RLVR_")) or k == "RLVR_CPU_CAPABILITY"}
    env.update(RLVR_HOME=str(home), PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    env.update(extra)
    return env


def run_json(cmd: list[str], env: dict[str, str], what: str) -> dict[str, Any]:
    """Run `cmd` (a Python module or code, in this interpreter) in the repo; its last stdout line parsed as JSON."""
    p = subprocess.run([sys.executable, *cmd], cwd=ROOT, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {p.returncode}): {' '.join(cmd)}\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def rlvr(args: list[str], env: dict[str, str], what: str) -> dict[str, Any]:
    return run_json(["-m", "rlvr_cli.main", *args], env, what)


_NUMERICS = "import json, rlvr_core; from rlvr_core.core.numerics import numerics; print(json.dumps(numerics()))"
_SWEEP = ("import json, sys; from flows.ablation_sweep import ablation_sweep_flow; "
          "from rlvr_core.pipeline.sweeps import find_sweep, submitted_mapping; "
          "from rlvr_cli.common import parse_sets; p = find_sweep(sys.argv[1]); "
          "_, m = submitted_mapping(p, parse_sets(sys.argv[2:])); "
          "out = ablation_sweep_flow(m, max_parallel=2, deployment=None, sweep_source=str(p)); "
          "print(json.dumps({'sweep_id': out['sweep_id']}))")


@dataclass
class Ctx:
    homes: Path
    demo_home: Path | None = None  # the `demo` measurement's home and run id, for demo-distill's teacher
    demo_run_id: str | None = None
    demo_greedy: float | None = None  # the teacher's held-out greedy accuracy

    def home(self, name: str) -> Path:
        return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.homes))


def _demo(ctx: Ctx, name: str, args: list[str], **env: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """`rlvr demo --json` in a fresh home: its values (with the rollouts' tool-call rate where it has tools), the
    `numerics` it printed. The `demo` measurement's home and run are kept for demo-distill's teacher."""
    home = ctx.home(name)
    s = rlvr(["demo", "--json", "--quiet", *args], child_env(home, **env), name)
    if name == "demo":
        ctx.demo_home, ctx.demo_run_id, ctx.demo_greedy = home, s["mlflow_run_id"], demo_values(s)["trained_greedy"]
    return {**demo_values(s), **rollout_values(s["artifact_uri"])}, s.get("numerics") or {}


def measure_demo(ctx: Ctx) -> tuple[dict[str, Any], dict[str, Any]]:
    return _demo(ctx, "demo", [])


def measure_demo_native(ctx: Ctx) -> tuple[dict[str, Any], dict[str, Any]]:
    return _demo(ctx, "demo-native", [], RLVR_CPU_CAPABILITY="native")


def measure_tool_demo(ctx: Ctx) -> tuple[dict[str, Any], dict[str, Any]]:
    return _demo(ctx, "tool-demo", ["-c", "configs/examples/tool-demo.yaml"])


def _shared_sets(name: str, sets: list[str]) -> list[str]:
    """Arguments for `rlvr demo` with the sweep's base config (`-c`, its `base:`) and its settings of the stages
    before training (data, base model, pass rates, evaluation): the sweep file's `set` and the extra `sets`,
    without grpo, tracking, environment or sweep fields."""
    import yaml

    from rlvr_core.pipeline.sweeps import find_sweep

    path = find_sweep(name)
    sweep = yaml.safe_load(path.read_text())
    fields = {**(sweep.get("set") or {}), **{k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in sets)}}
    config = ["-c", str((path.parent / sweep["base"]).resolve())] if sweep.get("base") else []
    return config + [a for k, v in fields.items()
                     if "." in k and k.split(".")[0] not in ("grpo", "tracking", "grid", "environment")
                     for a in ("--set", f"{k}={json.dumps(v)}")]


def measure_sweep(name: str, sets: list[str], home: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The sweep's trials through the ablation-sweep flow inline (ephemeral Prefect, the home's MLflow, store and
    warehouse), its pivot as `rlvr sweep show` prints it, and the base model's greedy accuracy on the same
    held-out problems (`rlvr demo` without training, with the sweep's shared settings: its cached stages)."""
    env = child_env(home)
    sweep_id = run_json(["-c", _SWEEP, name, *sets], env, f"sweep {name}")["sweep_id"]
    pivot = rlvr(["sweep", "show", sweep_id, "--json"], env, f"sweep show {sweep_id}")
    base = rlvr(["demo", "--json", "--quiet", "--set", "grpo.enabled=false", *_shared_sets(name, sets)], env,
                f"{name}: base model")
    v = sweep_values(pivot, base["n_eval"])
    v.update(base_greedy=base["base_pass_at_1"], base_ci_low=base["base_pass_at_1_ci95"][0],
             base_ci_high=base["base_pass_at_1_ci95"][1], n=base["n_eval"])
    return v, run_json(["-c", _NUMERICS], env, "numerics")


def measure_demo_distill(ctx: Ctx, sets: tuple[str, ...] = ()) -> tuple[dict[str, Any], dict[str, Any]]:
    if ctx.demo_home is None:  # no `demo` in this call: the teacher is a `demo` run of its own
        _demo(ctx, "demo", [])
    v, num = measure_sweep("demo-distill", [f"grpo.distill_teacher=run:{ctx.demo_run_id}", *sets], ctx.demo_home)
    return {**v, "teacher_run_id": ctx.demo_run_id, "teacher_greedy": ctx.demo_greedy}, num


def _distill(estimator: str | None = None) -> tuple[Callable[[Ctx], tuple[dict[str, Any], dict[str, Any]]], str]:
    """The demo-distill measurement with `grpo.distill_estimator` set (None: the default, full) and its command."""
    sets = (f"grpo.distill_estimator={estimator}",) if estimator else ()
    return ((lambda ctx: measure_demo_distill(ctx, sets)),
            "ablation_sweep_flow(demo-distill --set grpo.distill_teacher=run:<demo's run id>"
            + "".join(f" --set {kv}" for kv in sets)
            + ", deployment=None); rlvr sweep show <id> --json; rlvr demo --json --set grpo.enabled=false")


MEASUREMENTS: dict[str, tuple[Callable[[Ctx], tuple[dict[str, Any], dict[str, Any]]], str]] = {
    "demo": (measure_demo, "rlvr demo --json"),
    "demo-native": (measure_demo_native, "RLVR_CPU_CAPABILITY=native rlvr demo --json"),
    "tool-demo": (measure_tool_demo, "rlvr demo -c configs/examples/tool-demo.yaml --json"),
    "demo-lr": (lambda ctx: measure_sweep("demo-lr", [], ctx.home("demo-lr")),
                "ablation_sweep_flow(demo-lr, deployment=None); rlvr sweep show <id> --json; "
                "rlvr demo --json --set grpo.enabled=false (the sweep's shared settings)"),
    "demo-losses": (lambda ctx: measure_sweep("demo-losses", [], ctx.home("demo-losses")),
                    "ablation_sweep_flow(demo-losses, deployment=None); rlvr sweep show <id> --json; "
                    "rlvr demo --json --set grpo.enabled=false (the sweep's shared settings)"),
    "tools-on-off": (lambda ctx: measure_sweep("tools-on-off", [], ctx.home("tools-on-off")),
                     "ablation_sweep_flow(tools-on-off, deployment=None); rlvr sweep show <id> --json; "
                     "rlvr demo -c configs/examples/tool-demo.yaml --json --set grpo.enabled=false"),
    "demo-distill": _distill(),
    "demo-distill-sampled": _distill("sampled"),
    "demo-distill-score": _distill("score"),
}


def _commit() -> str:
    sha = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    return sha + ("+dirty" if dirty else "")


def measure(name: str, ctx: Ctx) -> dict[str, Any]:
    fn, command = MEASUREMENTS[name]
    t0 = time.monotonic()
    values, num = fn(ctx)
    wall = time.monotonic() - t0
    date, commit = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"), _commit()
    values.update(wall_s=wall, date=date, commit=commit, cpu_capability=num.get("cpu_capability"),
                  torch_threads=num.get("torch_threads"))
    return {"values": values, "command": command, "commit": commit, "date": date, "numerics": num,
            "RLVR_CPU_CAPABILITY": "native" if name == "demo-native" else os.environ.get("RLVR_CPU_CAPABILITY", "avx2")}


# ------------------------------------------------------------------------------------------ the command
def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _save(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def finish(root: Path = ROOT) -> int:
    """Apply the pending measurements to the docs, then make them the record."""
    record, pending = _load(root / RECORD), _load(root / PENDING)
    try:
        changed = apply(record, pending, root)
    except QuoteError as e:
        print(f"{e}\nThe new numbers stay in {PENDING}: make each doc quote the recorded text again (or fix "
              f"QUOTES), then run `python benchmarks/docs_numbers.py --render-only`.", file=sys.stderr)
        return 1
    _save(root / RECORD, merged(record, pending))
    (root / PENDING).unlink()
    print(f"updated {RECORD} ({', '.join(sorted(pending['measurements']))}); rewrote: {', '.join(changed) or 'none'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(MEASUREMENTS), help="comma-separated measurements (default: all)")
    ap.add_argument("--render-only", action="store_true",
                    help="measure nothing: apply the pending measurements, else check the docs against the record")
    ap.add_argument("--homes", type=Path, default=None, help="folder for the fresh RLVR_HOMEs (default: a temp folder)")
    a = ap.parse_args(argv)
    if a.render_only:
        if (ROOT / PENDING).exists():
            return finish()
        problems = check(_load(ROOT / RECORD))
        print("\n".join(problems) or f"every quote ({len(QUOTES)}) matches {RECORD}")
        return 1 if problems else 0
    names = [n.strip() for n in a.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in MEASUREMENTS]
    if unknown:
        ap.error(f"--only: unknown {unknown}; known: {', '.join(MEASUREMENTS)}")
    names.sort(key=list(MEASUREMENTS).index)  # `demo` before `demo-distill`, which takes its teacher
    ctx = Ctx(Path(a.homes or tempfile.mkdtemp(prefix="rlvr-docs-numbers-")))
    ctx.homes.mkdir(parents=True, exist_ok=True)
    pending = _load(ROOT / PENDING) if (ROOT / PENDING).exists() else {"measurements": {}}
    for name in names:
        print(f"measuring {name} ({MEASUREMENTS[name][1]}) in {ctx.homes} ...", flush=True)
        pending["measurements"][name] = m = measure(name, ctx)
        _save(ROOT / PENDING, pending)  # kept, whatever happens to the next measurement or the rewrite
        print(f"  {name}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) and math.isfinite(v) else f"{k}={v}"
                                        for k, v in m["values"].items() if k != "pivot_table"), flush=True)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
