"""The `nightly-eval` flow: evaluate every exported checkpoint that has no evaluation for the current
benchmark suite version, ingest the results, publish a report. Deployed with a cron schedule
(`0 3 * * *`, infra/prefect/prefect.yaml); running it twice is a no-op the second time.

    prefect deployment run 'nightly-eval/nightly'
    prefect deployment run 'nightly-eval/nightly' --param overrides='{"eval.max_problems": 100}'

Checkpoints: every `<experiment>/<run_id>/checkpoints/final/` export in the artifact store (the
pipeline uploads and verifies them; `export_manifest.json` marks a complete one).
Suite version: the benchmark's version and a hash of everything that decides the numbers (held-out data,
prompt template, decoding, verifier), so changing any of them makes every checkpoint "new" again.
Done marker: `nightly-eval/index/<suite>/<checkpoint hash>.json` in the artifact store, written after
the evaluation is recorded and ingested, so a crash in between re-evaluates (idempotently: the eval run
id is derived from checkpoint + suite, and ingest is delete-then-insert).
Claim: before evaluating a checkpoint a run claims it (`nightly-eval/claims/<suite>/<checkpoint hash>/`,
rlvr_core.artifacts.claims: create-if-absent, one winner), so a concurrent run skips what this one is doing.
A claim whose flow run is over (crashed, cancelled, failed, or completed without the marker) or gone from
the server is taken over by the next run. One run at a time per deployment: prefect.yaml's concurrency limit.
"""

from __future__ import annotations

import hashlib
import io
import json
import posixpath
import time
import uuid
from pathlib import Path
from typing import Any

from prefect import get_client, get_run_logger, task
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact
import pyarrow.parquet as pq
from prefect.runtime import flow_run

from flows.pipeline import resolve_config
from flows.sealed import sealed_flow
from rlvr_core.artifacts import claims, layout
from rlvr_core.artifacts.export import MANIFEST_FILE, verify_local_export
from rlvr_core.artifacts.storage import ArtifactStore, join, open_store
from rlvr_core.core import manifest as manifest_mod
from rlvr_core.core import settings
from rlvr_core.core.progress import SILENT
from rlvr_core.data.templates import get_template
from rlvr_core.eval.compare import from_tables
from rlvr_core.eval.nightly_report import Evaluated, build_report, to_html, to_markdown
from rlvr_core.experiment.config import ExperimentConfig, config_hash
from rlvr_core.pipeline import stages
from rlvr_core.records import warehouse
from rlvr_core.records.runrecord import record_run
from rlvr_core.records.tracking import Tracker, flatten
from rlvr_core.sampling.models import model_hashes
from tasks import stages as t

EXPERIMENT = "nightly-eval"
INDEX = "nightly-eval/index"
CLAIMS = "nightly-eval/claims"


def suite_version(cfg: ExperimentConfig) -> str:
    """`synthetic@<benchmark version>-<hash of the settings that decide the numbers>`."""
    decides = {"data": cfg.data.model_dump(mode="json"), "prompt": cfg.prompt.model_dump(mode="json"),
               "eval": cfg.eval.model_dump(mode="json", exclude={"verifier_workers"}),
               "sampling": {"top_p": cfg.sampling.top_p, "seed": cfg.sampling.seed}, "dtype": cfg.model.dtype,
               # a multi-turn suite is another suite (single_turn: absent, so earlier suites keep their versions)
               **({"environment": cfg.environment.key_dump()} if cfg.environment.multi_turn else {})}
    return f"synthetic@{stages.SYNTHETIC_BENCHMARK_VERSION}-{config_hash(decides)[:10]}"


def find_checkpoints(store: ArtifactStore) -> list[str]:
    """Prefixes of complete exported checkpoints (`…/checkpoints/final`), sorted."""
    suffix = f"/checkpoints/final/{MANIFEST_FILE}"
    return sorted(k[: -len(MANIFEST_FILE) - 1] for k in store.list() if k.endswith(suffix)
                  and not k.startswith(EXPERIMENT + "/"))


def _ckpt_hash(prefix: str) -> str:
    return hashlib.sha256(prefix.encode()).hexdigest()[:20]


def marker_key(suite: str, prefix: str) -> str:
    return join(INDEX, suite, _ckpt_hash(prefix) + ".json")


def claim_folder(suite: str, prefix: str) -> str:
    return join(CLAIMS, suite, _ckpt_hash(prefix))


def flow_run_over(claim: dict[str, Any]) -> bool:
    """True when the claim's flow run has ended (any final state) or the server does not know it."""
    from prefect.exceptions import ObjectNotFound

    try:
        with get_client(sync_client=True) as client:
            run = client.read_flow_run(uuid.UUID(claim["owner"]))
    except (ObjectNotFound, ValueError):  # ValueError: not a flow run id (a claim made outside Prefect)
        return True
    return run.state is None or run.state.is_final()


def claim_checkpoint(store: ArtifactStore, suite: str, prefix: str) -> bool:
    """Claim (checkpoint, suite) for this flow run; False when another live run holds it or it is done."""
    owner = str(flow_run.id) if flow_run.id else f"local-{uuid.uuid4()}"
    held = claims.claim(store, claim_folder(suite, prefix), owner, flow_run_over, checkpoint=prefix, suite=suite)
    # A run that finished it between our listing and our claim left its marker: nothing to do.
    return held is not None and not store.exists(marker_key(suite, prefix))


@task(name="fetch-checkpoint", **t.RETRY)
def fetch_checkpoint(store: ArtifactStore, prefix: str) -> stages.ModelArtifact:
    """Download (or reuse) the checkpoint into the cache and verify every checksum against its manifest."""
    manifest = json.loads(store.get_text(join(prefix, MANIFEST_FILE)))
    msha = hashlib.sha256(store.get_bytes(join(prefix, MANIFEST_FILE))).hexdigest()
    local = settings.paths().cache / "nightly_checkpoints" / msha[:20]
    try:
        verify_local_export(local)
    except Exception:  # noqa: BLE001 - absent or damaged: download again
        for f in manifest["files"]:
            store.get_file(join(prefix, f["path"]), local / f["path"])
        store.get_file(join(prefix, MANIFEST_FILE), local / MANIFEST_FILE)
        verify_local_export(local)
    mh, th = model_hashes(local)
    return stages.ModelArtifact(str(local), f"ckpt-{_ckpt_hash(prefix)}", mh, th, True)


@task(name="record-nightly-eval", **t.RETRY)
def record_eval(store: ArtifactStore, cfg: ExperimentConfig, suite: str, prefix: str, model: stages.ModelArtifact,
                data: stages.DataArtifact, ev: stages.EvalArtifact, started_at: float | None = None) -> dict[str, Any]:
    """`started_at`: when this checkpoint's fetch and evaluation began (epoch seconds), so the run's start and
    finish show how long it took (the MLflow run and the run record; default: now)."""
    started_at = time.time() if started_at is None else started_at
    tracker = Tracker(EXPERIMENT, cfg.tracking.tracking_uri)
    tags = {"kind": "eval", "suite_version": suite, "checkpoint": store.url(prefix), "checkpoint_key": prefix,
            "prefect_flow_run_id": str(flow_run.id) if flow_run.id else None,
            "template_mismatch": str(bool(ev.summary.get("template_mismatch"))).lower()}
    # One MLflow run per (checkpoint, suite): a re-run after a crash reuses it.
    found = tracker.client.search_runs([tracker.experiment_id],
                                       f"tags.suite_version = '{suite}' and tags.checkpoint_key = '{prefix}'",
                                       max_results=1)
    run_id = (found[0].info.run_id if found
              else tracker.start_run(layout.mlflow_run_name("eval", checkpoint=prefix), tags,
                                     start_time_ms=int(started_at * 1000)))
    # nightly-eval/eval_<checkpoint's run folder>-<run id[:8]>/ (rlvr_core.artifacts.layout)
    run_prefix = layout.run_prefix(EXPERIMENT, "eval " + prefix.removesuffix("/checkpoints/final"), run_id)
    row = {"run_id": run_id, "experiment": EXPERIMENT, "name": f"eval {prefix}", "kind": "eval",
           "status": "FINISHED", "started_at": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started_at)),
           "finished_at": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "duration_s": ev.summary["duration_s"],
           "config_hash": cfg.config_hash(), "model_id": model.model_id, "model_hash": model.model_hash,
           "tokenizer_hash": model.tokenizer_hash, "dataset_hash": data.dataset_hash,
           "prompt_template": cfg.prompt.template, "artifact_uri": store.url(run_prefix), "mlflow_run_id": run_id,
           "prefect_flow_run_id": tags["prefect_flow_run_id"]}
    summary = {"checkpoint": store.url(prefix), "suite_version": suite, **{k: v for k, v in ev.summary.items()}}
    man = manifest_mod.build_manifest(config_hash=cfg.config_hash(), resolved_config=cfg.resolved(),
                                      datasets={"train": data.train_hash, "test": data.test_hash},
                                      seeds={"sampling": cfg.sampling.seed},
                                      model={"id": model.model_id, "hash": model.model_hash, "path": model.path},
                                      template=cfg.prompt.template, extra={"suite_version": suite,
                                                                           "checkpoint": store.url(prefix)})
    report = (f"# Nightly evaluation of `{prefix}`\n\nSuite `{suite}`: greedy accuracy "
              f"{ev.summary['accuracy_greedy']:.3f} (n = {ev.summary['n']})\n" + _mismatch_note(cfg, ev.summary)
              + "".join(f"\n- **flag** {f['reason']}" for f in ev.summary.get("flags") or []))
    # G-verifier-error / G-truncation flags become the run's health events, at the checkpoint's training step.
    events = warehouse.eval_flag_events(ev.summary.get("flags") or [], _export_step(model.path), "nightly")
    record_run(store, run_prefix, tracker, run_id, run=row,
               params={**flatten(cfg.resolved()), "suite_version": suite, "checkpoint": prefix},
               manifest=man, config=cfg.resolved(), summary=summary,
               tables={"evals/samples.parquet": ev.samples, "evals/metrics.parquet": ev.metrics,
                       "passk_curves.parquet": ev.curves,
                       **({"train/health_events.parquet": warehouse.health_events_table(events)} if events else {})},
               metrics={f"eval/{ev.summary['benchmark']}/accuracy_greedy": ev.summary["accuracy_greedy"],
                        **{f"eval/{ev.summary['benchmark']}/pass@{k}": v for k, v in ev.curve.items()}},
               tags=tags, texts={"report.md": report})
    tracker.end_run(run_id, "FINISHED")
    # Last: the marker says "done" only once everything above is stored.
    store.put_text(marker_key(suite, prefix), json.dumps({"checkpoint": prefix, "suite_version": suite,
                                                          "mlflow_run_id": run_id, "run_prefix": run_prefix,
                                                          "accuracy_greedy": ev.summary["accuracy_greedy"],
                                                          "train_template": ev.summary.get("train_template"),
                                                          "template_mismatch": bool(ev.summary.get("template_mismatch")),
                                                          "evaluated_at": row["finished_at"]}))
    return {"checkpoint": prefix, "mlflow_run_id": run_id, "accuracy_greedy": ev.summary["accuracy_greedy"],
            "n": ev.summary["n"], "flags": len(events), "train_template": ev.summary.get("train_template"),
            "template_mismatch": bool(ev.summary.get("template_mismatch"))}


def _export_step(model_dir: str) -> int:
    """The training step an exported checkpoint holds (its export_manifest.json), 0 when it has none."""
    path = Path(model_dir) / MANIFEST_FILE
    return int(json.loads(path.read_text()).get("step") or 0) if path.is_file() else 0


def _mismatch_note(cfg: ExperimentConfig, summary: dict[str, Any]) -> str:
    """G-prompt-mismatch: the checkpoint was trained on another prompt format than the suite's."""
    if not summary.get("template_mismatch"):
        return ""
    return (f"\n**G-prompt-mismatch**: trained with `{summary['train_template']}`, evaluated with "
            f"`{get_template(cfg.prompt.template).key}`; the score may understate what the model learned.\n")


@sealed_flow(name="nightly-eval", log_prints=True, validate_parameters=False)
def nightly_eval_flow(config: dict[str, Any] | str = "configs/demo.yaml", overrides: dict[str, Any] | None = None,
                      max_checkpoints: int | None = None, compare_base: bool = True) -> dict[str, Any]:
    """`compare_base`: evaluate the config's base model once per suite, so the report gives each checkpoint's
    difference to it (paired)."""
    settings.configure_environment()
    log = get_run_logger()
    cfg = resolve_config(config, overrides)
    suite = suite_version(cfg)
    store = open_store(cfg.storage.artifact_uri, cfg.storage.s3_endpoint_url)
    all_ckpts = find_checkpoints(store)
    done = set(store.list(join(INDEX, suite)))
    new = [p for p in all_ckpts if marker_key(suite, p) not in done]
    results, elsewhere, base = [], [], None
    if new:
        log.info(f"suite {suite}: {len(all_ckpts)} checkpoints, {len(new)} without an evaluation")
        # The base first: a run evaluating checkpoints beside this one finds it done when it writes its report.
        base = _evaluate_base(store, cfg, suite) if compare_base else None
        results, elsewhere = _evaluate_unclaimed(store, cfg, suite, new, max_checkpoints)
    out = {"suite_version": suite, "n_checkpoints": len(all_ckpts), "evaluated": results,
           "claimed_elsewhere": elsewhere}
    if not results:
        busy = f", {len(elsewhere)} being evaluated by another run" if elsewhere else ""
        done_n = len(all_ckpts) - len(elsewhere)
        log.info(f"nothing new: {done_n} checkpoints already evaluated for suite {suite}{busy}")
        return out
    base = base if base and store.exists(join(base, "evals", "metrics.parquet")) else None
    key = join(EXPERIMENT, "reports", f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{suite}")
    md, page = _report(store, cfg, suite, all_ckpts, results, elsewhere, base, key + ".html")
    store.put_text(key + ".md", md)
    store.put_text(key + ".html", page)
    create_markdown_artifact(md, key="nightly-eval-report", description=f"nightly evaluation, suite {suite}")
    create_link_artifact(store.url(key + ".html"), link_text="the report as HTML", key="nightly-eval-report-html",
                         description=f"nightly evaluation, suite {suite}: intervals, pass@k, deltas, links")
    create_table_artifact(results, key="nightly-eval-results", description=f"checkpoints evaluated ({suite})")
    out["report"] = {"markdown": store.url(key + ".md"), "html": store.url(key + ".html")}
    return out


def _evaluate_unclaimed(store: ArtifactStore, cfg: ExperimentConfig, suite: str, new: list[str],
                        max_checkpoints: int | None) -> tuple[list[dict[str, Any]], list[str]]:
    """Evaluate each checkpoint of `new` this run can claim; (results, checkpoints another run holds)."""
    results: list[dict[str, Any]] = []
    elsewhere: list[str] = []
    data = None
    for prefix in new:
        if max_checkpoints and len(results) >= max_checkpoints:
            break
        if not claim_checkpoint(store, suite, prefix):
            elsewhere.append(prefix)
            continue
        data = data if data is not None else t.make_data(cfg, SILENT)
        started_at = time.time()
        model = fetch_checkpoint(store, prefix)
        ev = t.evaluate(cfg, data, model, f"nightly-{suite}", store.url(prefix))
        if ev.summary.get("template_mismatch"):
            get_run_logger().warning(f"G-prompt-mismatch: {prefix} was trained with {ev.summary['train_template']}, "
                                     f"evaluated with {get_template(cfg.prompt.template).key}")
        results.append(record_eval(store, cfg, suite, prefix, model, data, ev, started_at))
    return results, elsewhere


BASE_EVALS = "nightly-eval/base"  # the suite's base-model evaluation: <suite>/<model hash[:20]>/evals/*.parquet


def _evaluate_base(store: ArtifactStore, cfg: ExperimentConfig, suite: str) -> str | None:
    """The folder of the config's base model's evaluation for this suite, evaluated here unless it is done or
    another run holds its claim (once per suite, claimed like a checkpoint; the metrics table is written last and
    marks it done)."""
    data = t.make_data(cfg, SILENT)
    model = t.warm_start_base(cfg, data)
    folder = join(BASE_EVALS, suite, model.model_hash[:20])
    if store.exists(join(folder, "evals", "metrics.parquet")):
        return folder
    if not claim_checkpoint(store, suite, f"base:{model.model_hash}"):
        return folder
    ev = t.evaluate(cfg, data, model, f"nightly-{suite}", "base")
    for name, table in (("samples", ev.samples), ("metrics", ev.metrics)):
        buf = io.BytesIO()
        pq.write_table(table, buf)
        store.put_bytes(join(folder, "evals", f"{name}.parquet"), buf.getvalue())
    return folder


def _source(store: ArtifactStore, folder: str, suite: str, label: str):
    """One evaluation's samples and settings from its folder in the store (`compare.from_tables`)."""
    samples, metrics = (pq.read_table(io.BytesIO(store.get_bytes(join(folder, "evals", f"{n}.parquet"))))
                        for n in ("samples", "metrics"))
    return from_tables(samples, metrics, f"nightly-{suite}", label, store.url(folder))


def _rel(report_key: str, key: str) -> str:
    """A link from the report to another key of the store, relative, so it works wherever the store is browsed."""
    return posixpath.relpath(key, posixpath.dirname(report_key))


def _checkpoint_links(store: ArtifactStore, cfg: ExperimentConfig, prefix: str, marker: dict[str, Any],
                      report_key: str, trackers: dict[str, Tracker]) -> dict[str, str]:
    """The training run (its index page and MLflow run), the evaluation's MLflow run and folder, the checkpoint."""
    run_folder = prefix.removesuffix("/checkpoints/final")
    links = {}
    if store.exists(join(run_folder, "index.html")):
        links["training run"] = _rel(report_key, join(run_folder, "index.html"))
    uri = settings.mlflow_tracking_uri(cfg.tracking.tracking_uri)
    if uri.startswith(("http://", "https://")):
        run = json.loads(store.get_text(join(run_folder, layout.RUN_FILE))) if store.exists(
            join(run_folder, layout.RUN_FILE)) else {}
        for label, exp, run_id in (("training MLflow run", run.get("experiment"), run.get("mlflow_run_id")),
                                   ("evaluation MLflow run", EXPERIMENT, marker["mlflow_run_id"])):
            if exp and run_id:
                tracker = trackers.setdefault(exp, Tracker(exp, cfg.tracking.tracking_uri))
                links[label] = tracker.run_url(run_id)
    links["evaluation folder"] = _rel(report_key, join(marker["run_prefix"], "index.html"))
    links["checkpoint"] = _rel(report_key, join(prefix, MANIFEST_FILE))
    return links


def _report(store: ArtifactStore, cfg: ExperimentConfig, suite: str, all_ckpts: list[str],
            results: list[dict[str, Any]], elsewhere: list[str], base: str | None, report_key: str) -> tuple[str, str]:
    """(Markdown, HTML) of every checkpoint evaluated for the suite so far, in export order
    (rlvr_core.eval.nightly_report)."""
    new = {r["checkpoint"] for r in results}
    done = [p for p in all_ckpts if store.exists(marker_key(suite, p))]
    exported = {p: json.loads(store.get_text(join(p, MANIFEST_FILE))).get("created_at") or "" for p in done}
    trackers: dict[str, Tracker] = {}
    entries = []
    for p in sorted(done, key=lambda p: (exported[p], p)):
        marker = json.loads(store.get_text(marker_key(suite, p)))
        entries.append(Evaluated(p, _source(store, marker["run_prefix"], suite, p),
                                 _checkpoint_links(store, cfg, p, marker, report_key, trackers), p in new,
                                 marker.get("train_template"), bool(marker.get("template_mismatch"))))
    base_eval = (Evaluated("base", _source(store, base, suite, "base"),
                           {"evaluation folder": _rel(report_key, join(base, "evals"))}) if base else None)
    ui = flow_run.ui_url if flow_run.id else None  # None outside Prefect; "None/…" without a server address
    header = {"Prefect flow run": ui} if ui and ui.startswith(("http://", "https://")) else {}
    pending = [p for p in elsewhere if p not in done]  # claimed elsewhere and still without its marker
    rep = build_report(suite, entries, base_eval, n_in_store=len(all_ckpts), header_links=header, pending=pending)
    return to_markdown(rep), to_html(rep)
