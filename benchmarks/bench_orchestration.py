"""Orchestration overhead: the demo pipeline through Prefect vs the same stages called directly in one process.

    .venv/bin/python benchmarks/bench_orchestration.py                   # demo config + GRPO on (150 steps)
    .venv/bin/python benchmarks/bench_orchestration.py --set grpo.steps=30 --out result.json

Both arms start from an empty RLVR_HOME (nothing cached: data, base model, pass-rate table and training
are all computed) and share only the compiled DeepSpeed op (TORCH_EXTENSIONS_DIR), so they do the same work:

- direct: one Python process calls rlvr_core.pipeline.stages in order (data → base model → pass-rate table →
  curriculum → GRPO → export → evaluate) and records the run (artifact store folder, MLflow, warehouse
  ingest), no Prefect imported;
- prefect: a real local stack (`flows/local_stack.py`: server + process worker on 127.0.0.1, not timed),
  then `prefect deployment run 'pipeline/pipeline' --watch` is timed from the CLI call to its exit: API
  round trips, worker polling, the flow-run process, task states, and the stage subprocesses included.

Overhead = prefect / direct - 1. Results go to stdout as JSON (and to --out); docs/benchmarks/orchestration.md
records the measured numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _overrides(sets: list[str]) -> dict:
    import yaml

    out = {"grpo.enabled": True}
    out.update({k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in sets)})
    return out


def direct(overrides: dict) -> dict:
    """The stages in this process, timed one by one (run in a child process with its own RLVR_HOME)."""
    from rlvr_core.core import settings

    settings.configure_environment()
    t0 = time.perf_counter()
    import pyarrow.parquet as pq

    from rlvr_core.pipeline import run_record, stages
    from rlvr_core.records import warehouse
    from rlvr_core.experiment.config import dump_yaml, load_config
    from rlvr_core.records.runrecord import upload_run_folder, write_run_folder
    from rlvr_core.artifacts.layout import run_prefix
    from rlvr_core.artifacts.storage import join, open_store
    from rlvr_core.records.tracking import Tracker, flatten

    cfg = load_config(ROOT / "configs" / "demo.yaml", overrides)
    times, t = {}, time.perf_counter()

    def lap(name):
        nonlocal t
        now = time.perf_counter()
        times[name] = round(now - t, 2)
        t = now

    times["imports"] = round(t - t0, 2)
    data = stages.prepare_data(cfg); lap("data")
    base = stages.prepare_base_model(cfg, data); lap("base_model")
    pr = stages.pass_rate_stage(cfg, data, base); lap("pass_rate_table")
    cur = stages.curriculum_stage(cfg, data, pr); lap("curriculum")
    tr = stages.train_stage(cfg, data, base, cur); lap("train")
    store = open_store(None)
    tracker = Tracker(cfg.tracking.experiment)
    run_id = tracker.start_run(cfg.name, {"kind": "pipeline"})
    prefix = run_prefix(cfg.tracking.experiment, cfg.name, run_id)  # the pipeline's folder name (rlvr_core.artifacts.layout)
    ex = stages.export_stage(tr, base, store, join(prefix, "checkpoints", "final")); lap("export")
    ev = stages.evaluate_stage(cfg, data, ex.model, eval_id="trained", checkpoint=ex.uri); lap("evaluate")
    # The same run record as the pipeline flow's `record-run` task: the same tables, every step metric,
    # the run folder as MLflow artifacts (only the Prefect markdown/table artifacts are Prefect's own).
    import pyarrow as pa

    tables = {**run_record.record_tables(cfg, base, pr, cur),
              "passk_curves.parquet": pa.Table.from_pylist([{"source": "eval/trained", "k": k, "value": v,
                                                             "n_problems": ev.summary["n"]} for k, v in ev.curve.items()]),
              "evals/samples.parquet": ev.samples, "evals/metrics.parquet": ev.metrics,
              "train/steps.parquet": pq.read_table(tr.steps_path), "train/steps_long.parquet": run_record.steps_long(tr.steps_path)}
    metrics = {"eval/synthetic/trained/accuracy_greedy": ev.summary["accuracy_greedy"],
               "eval/synthetic/accuracy_greedy": ev.summary["accuracy_greedy"],
               **{f"eval/synthetic/trained/pass_at_{k}": v for k, v in ev.curve.items()}}
    with tempfile.TemporaryDirectory() as tmp:
        local = write_run_folder(Path(tmp), run={"run_id": run_id, "experiment": cfg.tracking.experiment,
                                                 "kind": "pipeline", "status": "FINISHED"},
                                 params=flatten(cfg.resolved()), manifest={}, config_yaml=dump_yaml(cfg),
                                 summary=ev.summary, tables=tables)
        upload_run_folder(store, prefix, local)
        tracker.log_params(run_id, flatten(cfg.resolved()))
        tracker.log_metrics(run_id, metrics)
        tracker.log_step_rows(run_id, pq.read_table(tr.steps_path).to_pylist())
        tracker.log_artifact(run_id, local)
    warehouse.ingest_run(store, prefix)
    tracker.end_run(run_id)
    lap("record_ingest")
    return {"wall_s": round(time.perf_counter() - t0, 2), "stages_s": times,
            "accuracy_greedy": ev.summary["accuracy_greedy"], "train_steps": tr.summary["steps"]}


def through_prefect(overrides: dict, home: Path) -> dict:
    from flows.local_stack import prefect_down, prefect_up, stack_env

    state = prefect_up(home)
    try:
        env = stack_env(home, state["api_url"])
        t0 = time.perf_counter()
        p = subprocess.run([str(Path(sys.executable).parent / "prefect"), "deployment", "run", "pipeline/pipeline",
                            "--param", "config=configs/demo.yaml", "--param", f"overrides={json.dumps(overrides)}",
                            "--watch"], env=env, cwd=str(ROOT), capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if p.returncode != 0 or "Completed" not in p.stdout:
            raise RuntimeError(f"pipeline run failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    finally:
        prefect_down(state)
    from rlvr_core.records import warehouse

    acc = warehouse.query_records("select value from eval_metrics where eval_id = 'trained' and metric = 'accuracy_greedy'",
                                  path=home / "warehouse.duckdb")
    return {"wall_s": round(wall, 2), "accuracy_greedy": acc[0]["value"] if acc else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (dotted)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--arm", choices=["both", "direct", "prefect", "_direct_child"], default="both")
    a = ap.parse_args()
    overrides = _overrides(a.set)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".rlvr" / "torch_extensions"))
    if a.arm == "_direct_child":
        print(json.dumps(direct(overrides)))
        return
    result = {"overrides": overrides, "cpu_count": os.cpu_count(),
              "loadavg_at_start": os.getloadavg()}
    if a.arm in ("both", "direct"):
        with tempfile.TemporaryDirectory(prefix="bench-direct-") as home:
            env = {**os.environ, "RLVR_HOME": home}
            env = {k: v for k, v in env.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, __file__, "--arm", "_direct_child",
                                *[x for s in a.set for x in ("--set", s)]], env=env, capture_output=True, text=True)
            if p.returncode != 0:
                raise RuntimeError(p.stderr[-3000:])
            result["direct"] = {**json.loads(p.stdout.strip().splitlines()[-1]),
                                "process_wall_s": round(time.perf_counter() - t0, 2)}
    if a.arm in ("both", "prefect"):
        with tempfile.TemporaryDirectory(prefix="bench-prefect-") as home:
            result["prefect"] = through_prefect(overrides, Path(home))
    if "direct" in result and "prefect" in result:
        # The direct arm's process wall time (interpreter start and imports included) is the fair comparison:
        # the Prefect arm's flow-run process pays them too.
        result["overhead"] = round(result["prefect"]["wall_s"] / result["direct"]["process_wall_s"] - 1, 4)
    result["loadavg_at_end"] = os.getloadavg()
    text = json.dumps(result, indent=2)
    print(text)
    if a.out:
        a.out.write_text(text)


if __name__ == "__main__":
    main()
