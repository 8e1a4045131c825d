"""The demo pipeline as a Prefect flow: data → base model → pass@k table → curriculum → held-out eval
(→ GRPO → export → eval of the exported checkpoint) → record.

`rlvr demo` runs it in ephemeral Prefect with MLflow on sqlite, a DuckDB file and a local artifact
folder; pointing the environment at real services runs the same flow against them.

Tracking follows docs/tracking.md: the demo is one parent MLflow run (the resolved config as params,
the headline numbers, the run folder as artifacts, system metrics) with one child run per stage
(its config section, its own metrics and tags); every run carries the standard tags. Nothing recorded
holds a secret: the config is redacted before it becomes params, config.yaml or the manifest.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from prefect import flow
from prefect.runtime import flow_run

from rlvr_core.artifacts import layout
from rlvr_core.artifacts.artifacts_index import write_run_index
from rlvr_core.artifacts.storage import join, open_store
from rlvr_core.core import manifest as manifest_mod
from rlvr_core.core import settings
from rlvr_core.core.progress import Progress
from rlvr_core.data.templates import get_template
from rlvr_core.eval.compare import compare, from_result, write_report
from rlvr_core.experiment.config import parse_config
from rlvr_core.grpo.trainer import ROLLOUTS_FILE
from rlvr_core.pipeline import stages
from rlvr_core.pipeline.stages import experiment_manifest, steps_long
from rlvr_core.probe.report import ProbeSettings, run_rl_probe
from rlvr_core.probe.tables import Checkpoint
from rlvr_core.probe.task import TaskSettings
from rlvr_core.records import warehouse
from rlvr_core.records.runrecord import upload_run_folder, write_run_folder
from rlvr_core.records.tracking import Tracker, common_tags, config_params, redact
from tasks import stages as t


@flow(name="demo", log_prints=False, validate_parameters=False)
def demo_flow(config: dict[str, Any], source: str = "<demo>", show_progress: bool = True) -> dict[str, Any]:
    t0 = time.monotonic()
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    cfg = parse_config(config, source)  # already validated by the CLI; cheap, and flows can be called directly
    progress = Progress(show_progress)
    resolved = cfg.resolved()
    public = redact(resolved)  # the config as recorded anywhere (params, config.yaml, manifest): no secrets
    chash = cfg.config_hash()
    template = get_template(cfg.prompt.template)
    store = open_store(cfg.storage.artifact_uri, cfg.storage.s3_endpoint_url)
    git = manifest_mod.git_state()
    prefect_id = str(flow_run.id) if flow_run.id else None
    tracker = Tracker(cfg.tracking.experiment, cfg.tracking.tracking_uri,
                      common=common_tags(config_hash=chash, git_sha=git["sha"], prefect_flow_run_id=prefect_id))
    run_id = tracker.start_run(layout.mlflow_run_name("demo", name=cfg.name),
                               {"kind": "demo", "git_dirty": git["dirty"], "prompt_template": template.key})
    progress("tracking", f"MLflow run {run_id} in experiment {cfg.tracking.experiment!r} ({tracker.display_uri})")
    try:
        with tracker.system_metrics(run_id):
            summary = _run_stages(cfg, public, chash, template, store, git, prefect_id, tracker, run_id,
                                  progress, t0, started)
        summary["duration_s"] = round(time.monotonic() - t0, 2)
        tracker.end_run(run_id, "FINISHED")
        return summary
    except BaseException:
        tracker.end_run(run_id, "FAILED")
        raise


def _run_stages(cfg, public, chash, template, store, git, prefect_id, tracker: Tracker, run_id: str,
                progress: Progress, t0: float, started: str) -> dict[str, Any]:
    params = config_params(public)
    tracker.log_params(run_id, params)  # first: a run that fails later still shows what it was
    children: dict[str, str] = {}

    def stage(name: str, *sections: str, **tags: Any):
        """A child run for one stage, with its config sections as params."""
        return tracker.child_run(run_id, tags.pop("stage", name), name=name, tags=tags,
                                 params=config_params(public, *sections))

    with stage("data", "data") as child:
        children["data"] = child
        data = t.make_data(cfg, progress)
        tracker.add_common_tags(dataset_hash=data.dataset_hash)  # now known: stamp it on every run
        tracker.log_metrics(child, {"data/n_train": data.n_train, "data/n_test": data.n_test})
        tracker.set_tags(child, {"cached": data.cached})
    with stage("base-model", "model") as child:
        children["base-model"] = child
        model = t.warm_start_base(cfg, data, progress)
        tracker.set_tags(child, {"model_id": model.model_id, "model_hash": model.model_hash,
                                 "tokenizer_hash": model.tokenizer_hash, "cached": model.cached})
    with stage("passk", "passk", "sampling", "prompt") as child:
        children["passk"] = child
        passrates = t.pass_rate_table(cfg, data, model, progress)
        tracker.log_metrics(child, _passk_metrics(passrates))
        tracker.set_tags(child, {"pass_rate_table_id": passrates.table_id, "cached": passrates.cached})
    with stage("curriculum", "curriculum") as child:
        children["curriculum"] = child
        curriculum = t.build_curriculum(cfg, data, passrates, progress)
        tracker.log_metrics(child, {"curriculum/n_prompts": curriculum.n_prompts})
        tracker.set_tags(child, {"curriculum_id": curriculum.curriculum_id, "cached": curriculum.cached})
    with stage("evaluate-base", "eval", stage="evaluate", eval_id="base") as child:
        children["evaluate-base"] = child
        base_eval = t.evaluate(cfg, data, model, "base", "base", progress)
        tracker.log_metrics(child, _eval_metrics(base_eval))
    prefix = layout.run_prefix(cfg.tracking.experiment, cfg.name, run_id)  # <experiment>/<name>-<id[:8]>
    trained = trained_eval = exported = None
    if cfg.grpo.enabled:
        with stage("train", "grpo") as child:
            children["train"] = child
            trained = t.train(cfg, data, model, curriculum, progress, mlflow_run_id=child)  # steps live
            tracker.log_step_rows(child, pq.read_table(trained.steps_path).to_pylist())  # only what is missing
        # The trained model is scored from its exported, uploaded and checksum-verified copy
        # (G-lost-ckpt): the numbers belong to the checkpoint users will download.
        with stage("export") as child:
            children["export"] = child
            exported = t.export(trained, model, store, join(prefix, "checkpoints", "final"),
                                {"config_hash": chash, "mlflow_run_id": run_id, "git_sha": git["sha"]}, progress)
            tracker.log_metrics(child, {"export/step": exported.step})
            tracker.set_tags(child, {"export_uri": exported.uri, "export_dtype": exported.dtype,
                                     "export_manifest_sha256": exported.manifest_sha256})
        with stage("evaluate-trained", "eval", stage="evaluate", eval_id="trained") as child:
            children["evaluate-trained"] = child
            trained_eval = t.evaluate(cfg, data, exported.model, "trained", "trained", progress)
            tracker.log_metrics(child, _eval_metrics(trained_eval))
    # Base vs trained on the same problems, paired (rlvr_core.eval.compare): the delta's interval is much tighter
    # than two independent accuracies' would be, and the solvable sets show whether RL widened or sharpened.
    comparison = (compare(from_result(base_eval.result, "base"), from_result(trained_eval.result, "trained"))
                  if trained_eval else None)
    collapsed = bool(trained) and _collapsed(trained.summary)
    duration = time.monotonic() - t0
    man = experiment_manifest(
        cfg, data, model, config_hash=chash, resolved_config=public, template_key=template.key,
        extra={"mlflow_run_id": run_id, "mlflow_child_run_ids": children, "prefect_flow_run_id": prefect_id,
               "pass_rate_table_id": passrates.table_id, "curriculum_id": curriculum.curriculum_id,
               "trained_model": ({"id": trained.model.model_id, "hash": trained.model.model_hash,
                                  "path": trained.model.path} if trained else None),
               "export": ({"uri": exported.uri, "step": exported.step, "dtype": exported.dtype,
                           "manifest_sha256": exported.manifest_sha256,
                           "model_hash": exported.model.model_hash} if exported else None)},
    )
    summary = {
        "base_pass_at_1": base_eval.summary["accuracy_greedy"],
        "base_pass_at_1_ci95": base_eval.summary["accuracy_greedy_ci"],
        "base_pass_at_k": base_eval.summary["passk"],
        "n_eval": base_eval.summary["n"],
        **(_trained_summary(base_eval, trained_eval, trained) if trained else {}),
        **({"export": {"uri": exported.uri, "step": exported.step, "dtype": exported.dtype,
                       "manifest_sha256": exported.manifest_sha256}} if exported else {}),
        **({"comparison": _comparison_summary(comparison, base_eval.summary["benchmark"])} if comparison else {}),
        "eval": {k: v for k, v in base_eval.summary.items() if k not in ("passk",)},
        "pass_rates": passrates.summary,
        "curriculum": {"id": curriculum.curriculum_id, "strategy": cfg.curriculum.strategy,
                       "n_prompts": curriculum.n_prompts},
        "cached": {"data": data.cached, "base_model": model.cached, "pass_rate_table": passrates.cached,
                   "curriculum": curriculum.cached},
        "config_hash": chash,
        "mlflow_run_id": run_id,
        "mlflow_child_run_ids": children,
        "mlflow_experiment_id": tracker.experiment_id,
        "mlflow_tracking_uri": tracker.display_uri,
        "prefect_flow_run_id": prefect_id,
        "warehouse_path": str(settings.warehouse_path()),
        "artifact_uri": store.url(prefix),
        "duration_s": round(duration, 2),
    }
    run_row = {"run_id": run_id, "experiment": cfg.tracking.experiment, "name": cfg.name, "kind": "demo",
               "status": "FINISHED", "started_at": started,
               "finished_at": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "duration_s": duration,
               "config_hash": chash, "git_sha": git["sha"], "git_dirty": git["dirty"], "model_id": model.model_id,
               "model_hash": model.model_hash, "tokenizer_hash": model.tokenizer_hash,
               "dataset_hash": data.dataset_hash, "prompt_template": template.key,
               "artifact_uri": store.url(prefix), "mlflow_run_id": run_id, "prefect_flow_run_id": prefect_id,
               # run.json tags become warehouse run_tags; `collapsed` is what the collapsed_runs query looks for.
               **({"tags": {"collapsed": "true"}} if collapsed else {})}
    run_tables = stages.record_tables(cfg, model, passrates, curriculum)
    with tempfile.TemporaryDirectory(prefix="rlvr-run-") as tmp:
        if trained_eval:
            summary["probe"] = _probe_report(cfg, data, model, exported, base_eval, trained_eval,
                                             Path(tmp) / "probe", run_id)
        local = write_run_folder(
            Path(tmp), run=run_row, params=params, manifest=man,
            config_yaml=yaml.safe_dump(public, sort_keys=False), summary=summary,
            tables={**run_tables,
                    **_eval_tables(base_eval, trained_eval), **(_train_tables(trained) if trained else {})})
        if comparison:
            write_report(comparison, local)  # comparison.md / .json beside the evaluations they compare
        upload_run_folder(store, prefix, local)
        # The parent holds the headline numbers (runs compare at the top level of the MLflow UI); each
        # child holds its stage's detail.
        metrics = {**_eval_metrics(base_eval), **_passk_metrics(passrates), "curriculum/n_prompts": curriculum.n_prompts}
        if trained_eval:
            metrics.update(_eval_metrics(trained_eval, "eval/synthetic/trained"))
        tracker.log_metrics(run_id, metrics)
        tracker.set_tags(run_id, {"model_hash": model.model_hash, "artifact_uri": store.url(prefix),
                                  **({"export_uri": exported.uri, "export_step": str(exported.step),
                                      "export_manifest_sha256": exported.manifest_sha256} if exported else {})})
        tracker.log_artifact(run_id, local)  # through the server's artifact proxy when there is one
    links = {"MLflow run": tracker.run_url(run_id)} if tracker.tracking_uri.startswith("http") else None
    write_run_index(store, prefix, links)
    progress("record", f"artifacts at {store.url(prefix)} (index: {store.url(join(prefix, 'index.html'))})")
    counts = t.ingest(store, prefix)
    progress("warehouse", f"ingested {sum(counts.values())} rows into {settings.warehouse_path()}")
    return summary


def _eval_metrics(ev, ns: str = "eval/synthetic") -> dict[str, float]:
    """An evaluation's numbers under `eval/<benchmark>/…` (pass@k stored as pass_at_k)."""
    return {f"{ns}/accuracy_greedy": ev.summary["accuracy_greedy"], f"{ns}/n": ev.summary["n"],
            **{f"{ns}/pass@{k}": v for k, v in ev.curve.items()},
            **{f"{ns}/{k}": v for k, v in ev.summary.items() if k.endswith("_share")}}


def _passk_metrics(passrates) -> dict[str, float]:
    return {f"passk/{k}": float(v) for k, v in passrates.summary.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _probe_report(cfg, data, model, exported, base_eval, trained_eval, out: Path, run_id: str) -> dict[str, Any]:
    """A short RL-Probe report (docs/probes.md) of the trained checkpoint against the base on the held-out
    problems the base failed and the trained model solved: token KL, spikes and their categories. It reuses
    the two evaluations' greedy completions (nothing is sampled again); its tables go to the warehouse with
    the run (`probe/`)."""
    settings = ProbeSettings(max_problems=50, sample_figures=2, task=TaskSettings(
        template_id=cfg.prompt.template, verifier=cfg.eval.verifier, verifier_mode=cfg.eval.verifier_mode,
        max_new_tokens=cfg.eval.max_new_tokens, seed=cfg.sampling.seed))
    _, meta = run_rl_probe(Checkpoint("base", 0, model.path), [Checkpoint("trained", exported.step, exported.model.path)],
                           data.test_rows(), out, settings, probe_id=f"demo-{run_id}",
                           greedy_a=base_eval.samples.to_pylist(), greedy_b=trained_eval.samples.to_pylist())
    tokens = pq.read_table(out / "probe_tokens.parquet", columns=["checkpoint_b", "is_spike", "category"]).to_pylist()
    spikes = [t["category"] for t in tokens if t["checkpoint_b"] == "trained" and t["is_spike"]]
    by_cat = {c: spikes.count(c) for c in sorted(set(spikes))}
    keep = ("probe_id", "n_selected", "n_sequences", "n_tokens_per_checkpoint", "duration_s")
    return {"folder": "probe/", **{k: meta[k] for k in keep}, "spikes": len(spikes), "spikes_by_category": by_cat}


def _trained_summary(base_eval, trained_eval, trained) -> dict[str, Any]:
    """Same held-out problems, decoding and verifier as the base numbers: the delta is RL's effect."""
    return {
        "trained_pass_at_1": trained_eval.summary["accuracy_greedy"],
        "trained_pass_at_1_ci95": trained_eval.summary["accuracy_greedy_ci"],
        "trained_pass_at_k": trained_eval.summary["passk"],
        "delta_pass_at_1": trained_eval.summary["accuracy_greedy"] - base_eval.summary["accuracy_greedy"],
        "train": {k: v for k, v in trained.summary.items() if not isinstance(v, (list, dict))},
    }


def _eval_tables(base_eval, trained_eval) -> dict[str, pa.Table]:
    evals = [e for e in (base_eval, trained_eval) if e is not None]
    # "default" promotion: a column that is all-null in one eval (e.g. no extracted answers) still concatenates.
    # The curves are the evaluator's own: pass@k for every k = 1..n, per scoring, with eval_id, benchmark,
    # checkpoint and scoring as columns (warehouse `passk_curves`), so they match `rlvr eval`'s file.
    return {"evals/samples.parquet": pa.concat_tables([e.samples for e in evals], promote_options="default"),
            "evals/metrics.parquet": pa.concat_tables([e.metrics for e in evals], promote_options="default"),
            "passk_curves.parquet": pa.concat_tables([e.curves for e in evals])}


def _train_tables(trained) -> dict[str, pa.Table]:
    """The training stage's files in the run folder (docs/warehouse.md says which table each fills)."""
    tables = {"train/steps.parquet": pq.read_table(trained.steps_path),
              "train/steps_long.parquet": steps_long(trained.steps_path),
              # Written even when nothing fired: an empty file says "no firings", whereas a missing one makes
              # the warehouse fall back to the per-step health/* flags.
              "train/health_events.parquet": warehouse.health_events_table(trained.summary.get("health_firings") or [])}
    rollouts = Path(trained.folder) / ROLLOUTS_FILE  # absent with grpo.rollout_samples_per_step = 0
    if rollouts.is_file():
        tables["train/rollouts.parquet"] = pq.read_table(rollouts)
    return tables


def _collapsed(train_summary: dict[str, Any]) -> bool:
    """Did a serious guard stop training? The trainer tags its summary `collapsed` then; a serious firing
    in the summary's health_firings says the same for summaries written without tags."""
    return ("collapsed" in (train_summary.get("tags") or [])
            or any(f.get("serious") for f in train_summary.get("health_firings") or []))


def _comparison_summary(cmp: dict[str, Any], benchmark: str) -> dict[str, Any]:
    """The headline part of `compare`'s result for the JSON summary (the whole of it is comparison.json)."""
    r = cmp["benchmarks"][benchmark]
    d = r["deltas"]
    a, b = cmp["a"]["label"], cmp["b"]["label"]
    return {
        "a": a, "b": b, "benchmark": benchmark, "scoring": r["scoring"],
        "n_problems": r["n_problems"],
        # B − A, paired over the same problems, with the 95% paired t interval (McNemar p for greedy).
        "accuracy_greedy": {k: d["accuracy_greedy"][k] for k in ("delta", "ci_low", "ci_high", "n", "mcnemar_p")}
        if "accuracy_greedy" in d else None,
        "pass_at_k": {m.removeprefix("pass@"): {k: v[k] for k in ("delta", "ci_low", "ci_high")}
                      for m, v in d.items() if m.startswith("pass@")},
        "solvable_overlap": r["solvable_overlap"],  # at least one of n samples correct: both / a_only / b_only / neither
        # Problems solved by one side only: greedily, and by at least one of the n samples ("ever").
        "solved_greedy_only": {a: len(r["solved_greedy"]["a_only"]), b: len(r["solved_greedy"]["b_only"])},
        "solved_ever_only": {a: len(r["solved_ever"]["a_only"]), b: len(r["solved_ever"]["b_only"])},
        "report": "comparison.md",
    }
