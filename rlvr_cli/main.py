"""`rlvr`: the one command-line entry point, for users and for the tasks' subprocesses alike.

torch, Prefect and MLflow load inside the commands that need them (tests/core/test_import_contract.py allows
exactly those lazy imports), so `rlvr --help` and `rlvr config validate` load none of them, and a bad config
fails before any of them load.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Optional

import typer

from rlvr_cli import stops
from rlvr_cli.artifacts import artifacts_app
from rlvr_cli.common import fail as _fail
from rlvr_cli.common import parse_sets as _parse_sets
from rlvr_cli.common import print_table as _print_table
from rlvr_cli.eval import compare_command, eval_command
from rlvr_cli.probe import probe_app
from rlvr_cli.pull import pull_app
from rlvr_cli.records import dashboard_command, ingest_command, query_command, report_command, ui_command
from rlvr_cli.stack import stack_app
from rlvr_cli.sweep import sweep_app
from rlvr_cli.verify import verify_command
from rlvr_core.artifacts.storage import open_store
from rlvr_core.core import settings
from rlvr_core.core.progress import Progress
from rlvr_core.experiment.benchmarks import check_experiment_data
from rlvr_core.experiment.config import (ConfigError, apply_overrides, check_files, demo_config, dump_yaml, load_config,
                                         parse_config, read_yaml_file)
from rlvr_core.pipeline import stages
from rlvr_core.pipeline.sweeps import check_sweep_files, is_sweep_file, load_sweep
from rlvr_core.records import warehouse

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.split("\n")[0])
config_app = typer.Typer(no_args_is_help=True, help="Validate and show experiment configs.")
warehouse_app = typer.Typer(no_args_is_help=True, help="The DuckDB results warehouse.")
app.add_typer(config_app, name="config")
app.add_typer(warehouse_app, name="warehouse")
app.add_typer(artifacts_app, name="artifacts")
app.add_typer(sweep_app, name="sweep")
app.add_typer(pull_app, name="pull")


def _load(config: Optional[Path], sets: list[str]):
    """Validate the config and the files it names; raises ConfigError before any expensive work."""
    overrides = _parse_sets(sets)
    if config is None:
        source = "<demo defaults>" + (" + --set" if overrides else "")
        cfg = parse_config(apply_overrides(demo_config().resolved(), overrides), source)
    else:
        source = str(config)
        cfg = load_config(config, overrides)
    check_files(cfg, source)
    if cfg.data.benchmark is not None:
        check_experiment_data(cfg.data.benchmark, cfg.data.source, source)
    return cfg


@app.command()
def demo(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="experiment YAML (default: the built-in demo)"),
    set_: list[str] = typer.Option([], "--set", help="override a field, e.g. --set eval.max_problems=50"),
    json_out: bool = typer.Option(False, "--json", help="end with one line holding a JSON summary"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress lines"),
    verbose: bool = typer.Option(False, "--verbose", "-v",
                                 help="full tracebacks on the terminal (they are always in $RLVR_HOME/logs/)"),
) -> None:
    """Run the whole pipeline for real on a tiny model it builds itself (CPU, embedded stack).

    Exit codes: 0 done, 2 a bad config or command line (nothing ran), 3 a guard stopped the run (one line says
    which, at what step and what to change), 1 anything else."""
    try:
        cfg = _load(config, set_)  # before any expensive import or any run is created
    except ConfigError as e:
        _fail(str(e))
    paths = settings.configure_environment()
    from flows.pipeline import pipeline_flow

    log = stops.route_logs(paths.home, "demo", verbose)
    # The pipeline flow of `prefect deployment run`, with the base model evaluated for the paired comparison,
    # and training and evaluation in this process (a child process per stage would only add start-up time).
    # Progress lines go to this terminal, not through Prefect's run logger (which `log_prints` would use).
    try:
        summary = pipeline_flow.with_options(log_prints=False)(
            cfg.resolved(), kind="demo", eval_base=True, in_process=True, show_progress=not quiet,
            source=str(config or "<demo defaults>"))
    except Exception as err:
        stops.log_exception(log, err)
        lines = stops.stop_lines(err, cfg, "demo", log)
        if lines is None:
            raise
        stops.fail_stopped(lines, err if verbose else None)
    _print_summary(summary)
    if json_out:
        print(json.dumps(summary, default=str), flush=True)


@app.command()
def passk(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="experiment YAML (default: the demo's)"),
    set_: list[str] = typer.Option([], "--set", help="override a field, e.g. --set passk.n_samples=16"),
    out: Optional[Path] = typer.Option(None, "--out", help="also copy the pass-rate table (Parquet) here"),
    json_out: bool = typer.Option(False, "--json", help="end with one line holding a JSON summary"),
) -> None:
    """Measure per-prompt pass rates of the config's model on its training prompts, then order a curriculum.

    Samples passk.n_samples completions per prompt, verifies them and writes a versioned Parquet table
    with its manifest into the stage cache; identical inputs are served from the cache, not re-run.
    """
    try:
        cfg = _load(config, set_)
    except ConfigError as e:
        _fail(str(e))
    settings.configure_environment()

    progress = Progress()
    data = stages.prepare_data(cfg, progress)
    model = stages.prepare_base_model(cfg, data, progress)
    table = stages.pass_rate_stage(cfg, data, model, progress)
    cur = stages.curriculum_stage(cfg, data, table, progress)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(table.table_path, out)
    summary = {"table_id": table.table_id, "table_path": table.table_path, "cached": table.cached,
               **table.summary, "curriculum_id": cur.curriculum_id, "curriculum_path": cur.path,
               "curriculum_prompts": cur.n_prompts}
    typer.echo("\n".join(f"  {k}: {v}" for k, v in summary.items()), err=True)
    if json_out:
        print(json.dumps(summary, default=str), flush=True)


def _evaluations(s: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(label, evaluation summary) of each evaluation the run made: the base model's, the trained one's."""
    if "trained_eval" not in s:
        return [("base model" if "base_pass_at_1" in s else "evaluation", s["eval"])]
    return ([("base model", s["eval"])] if "base_pass_at_1" in s else []) + [("after GRPO", s["trained_eval"])]


def _print_summary(s: dict[str, Any]) -> None:
    lo, hi = s["base_pass_at_1_ci95"]
    pk = s["base_pass_at_k"]
    kmax = max(pk, key=int) if pk else None
    pr = s["pass_rates"]
    lines = [
        "",
        "rlvr demo: summary",
        f"  base model, held-out greedy accuracy: {s['base_pass_at_1']:.3f}  (95% CI {lo:.3f}–{hi:.3f}, n={s['n_eval']})",
    ]
    if kmax:
        lines.append(f"  base model, held-out pass@{kmax}: {pk[kmax]:.3f}")
    if "trained_pass_at_1" in s:
        tlo, thi = s["trained_pass_at_1_ci95"]
        lines.append(f"  after GRPO, held-out greedy accuracy: {s['trained_pass_at_1']:.3f}  (95% CI {tlo:.3f}–{thi:.3f}, "
                     f"n={s['n_eval']})  Δ {100 * s['delta_pass_at_1']:+.1f} points")
        d = (s.get("comparison") or {}).get("accuracy_greedy")
        if d:
            lines.append(f"  trained − base on the same problems: {100 * d['delta']:+.1f} points "
                         f"(paired 95% CI {100 * d['ci_low']:+.1f} to {100 * d['ci_high']:+.1f}, n={d['n']})")
    lines += [
        f"  training prompts measured: {pr['n_problems']} × {pr['n_samples']} samples; mean pass rate {pr['mean_pass_rate']:.3f}; "
        f"kept for training {pr['n_kept']} (never solved {pr['never_solved']}, always solved {pr['always_solved']})",
        *[f"  {who}: truncated completions {e['truncation_share']:.1%}; verifier errors/timeouts "
          f"{e['verifier_error_share']:.1%}/{e['verifier_timeout_share']:.1%}"
          for who, e in _evaluations(s)],
        *[f"  WARNING {f['eval_id']} evaluation: {f['reason']}" for f in s.get("eval_flags") or []],
        *([f"  numerics: {s['numerics']['torch_threads']} torch thread(s), CPU {s['numerics']['cpu_capability']} "
           "(with the seed, these fix the numbers: compare runs on equal settings)"] if s.get("numerics") else []),
        f"  stages reused from cache: {', '.join(k for k, v in s['cached'].items() if v) or 'none'}",
        f"  MLflow run: {s['mlflow_run_id']}  ({s['mlflow_tracking_uri']})",
        f"  artifacts:  {s['artifact_uri']}",
        f"  warehouse:  {s['warehouse_path']}   (try: rlvr warehouse query \"select * from runs\")",
        f"  took {s['duration_s']:.1f} s",
    ]
    typer.echo("\n".join(lines), err=True)


@config_app.command("validate")
def config_validate(file: Path = typer.Argument(..., help="experiment YAML, or a sweep file (configs/sweeps/)")) -> None:
    """Exit 0 and print the config hash if FILE is valid; otherwise name the file, field and why.

    A sweep file (it has a `base`) is expanded and every trial's config validated, with the files it names."""
    try:
        if is_sweep_file(read_yaml_file(file)):
            sw = load_sweep(file)
            check_sweep_files(sw)
            cells = len(sw.trials) // len(sw.spec.seeds)
            typer.echo(f"{file}: valid sweep {sw.spec.name!r}: {len(sw.trials)} trials ({cells} cells × "
                       f"{len(sw.spec.seeds)} seeds), sweep hash {sw.sweep_hash}")
            return
        cfg = _load(file, [])
    except ConfigError as e:
        _fail(str(e))
    typer.echo(f"{file}: valid (config hash {cfg.config_hash()[:16]})")


@config_app.command("show")
def config_show(file: Optional[Path] = typer.Argument(None, help="experiment YAML (default: the demo)"),
                set_: list[str] = typer.Option([], "--set", help="override a field")) -> None:
    """Print the resolved config (all defaults filled in) and its hash."""
    try:
        cfg = _load(file, set_)
    except ConfigError as e:
        _fail(str(e))
    typer.echo(dump_yaml(cfg) + f"# config hash: {cfg.config_hash()}")


@warehouse_app.command("rebuild")
def warehouse_rebuild(artifact_uri: Optional[str] = typer.Option(None, help="artifact store root")) -> None:
    """Recreate the warehouse file from every run in the artifact store."""
    counts = warehouse.rebuild(open_store(artifact_uri))
    typer.echo(json.dumps(counts))


app.command("verify", help="Verify a jsonl file of responses with a named verifier.")(verify_command)
app.command("eval", help="Evaluate a checkpoint on benchmarks (docs/evaluation.md).")(eval_command)
app.command("compare", help="Compare two evaluations: paired deltas, capability boundary.")(compare_command)
warehouse_app.command("query")(query_command)    # SQL, or --canned NAME --param k=v, --list, --json
warehouse_app.command("ingest")(ingest_command)  # EXPERIMENT/RUN_ID or --all, --force
app.command("report")(report_command)
app.command("ui")(ui_command)  # MLflow's UI for this project's runs, in the model-training view
app.command("dashboard")(dashboard_command)
app.add_typer(probe_app, name="probe")  # tokens | report | dlogp | boundary (docs/probes.md)
app.add_typer(stack_app, name="stack")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
