"""A pipeline run's record, composed from its stage outputs: the warehouse `runs` row, the params, the
manifest, the tables of the run folder, the parent run's headline metrics and tags, summary.json and
report.md (`finished_record`), or the smaller record of a run a serious guard stopped (`stopped_record`).

The `pipeline` flow (flows/pipeline.py) runs the stages and hands the composed record to its recorder task
(`rlvr_core.records.runrecord.record_run`, which redacts); nothing here records, starts a stage or imports
Prefect. It lives with the pipeline, not in `rlvr_core/records/`, because it reads the stages' artifacts,
the comparison and the probe, all layers above the recorder (tests/core/test_import_contract.py).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from rlvr_core.artifacts.layout import ROLLOUTS_FILE, SEGMENTS_FILE, STEPS_FILE, SUMMARY_FILE
from rlvr_core.artifacts.storage import ArtifactStore
from rlvr_core.core import settings
from rlvr_core.core.numerics import numerics
from rlvr_core.core.progress import Progress
from rlvr_core.data.templates import get_template
from rlvr_core.eval.compare import compare, from_tables, write_report
from rlvr_core.eval.metrics import regression_flag
from rlvr_core.experiment.config import ExperimentConfig
from rlvr_core.experiment.guard_coverage import guard_coverage
from rlvr_core.pipeline import stages
from rlvr_core.probe.task import TaskSettings
from rlvr_core.records import warehouse
from rlvr_core.records.tracking import Tracker, config_params

__all__ = ["PipelineRun", "StageOutputs", "Record", "finished_record", "stopped_record", "run_params", "eval_metrics",
           "passk_metrics", "eval_events", "collapsed", "report_markdown", "coverage_lines", "mlflow_link"]


@dataclass
class PipelineRun:
    """What every stage of one pipeline run shares: its identity, where it records, its MLflow runs."""

    cfg: ExperimentConfig
    kind: str
    run_id: str
    name: str
    tracker: Tracker
    store: ArtifactStore
    prefix: str
    public: dict[str, Any]  # the resolved config as recorded anywhere: redacted
    config_hash: str
    template_key: str
    git: dict[str, Any]
    prefect_id: str | None
    sweep: dict[str, str | None]  # sweep_id, trial_id, trial_label
    started: str = field(default_factory=lambda: time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()))
    children: dict[str, str] = field(default_factory=dict)

    @contextlib.contextmanager
    def stage(self, name: str, *sections: str, **tags: Any) -> Iterator[str]:
        """A child run for one stage, with its config sections as params."""
        with self.tracker.child_run(self.run_id, tags.pop("stage", name), name=name, tags=tags,
                                    params=config_params(self.public, *sections)) as child:
            self.children[name] = child
            yield child



@dataclass
class StageOutputs:
    """Every stage output a run records."""

    data: stages.DataArtifact
    model: stages.ModelArtifact
    passrates: stages.PassRateArtifact
    curriculum: stages.CurriculumArtifact
    base_eval: stages.EvalArtifact | None
    trained: stages.TrainArtifact | None
    exported: stages.ExportArtifact | None
    trained_eval: stages.EvalArtifact | None

    @property
    def headline(self) -> stages.EvalArtifact:
        """The run's result: the trained checkpoint's evaluation when there is one, else the base model's."""
        return self.trained_eval or self.base_eval


@dataclass
class Record:
    """A run's record, composed: `files` are `record_run`'s keyword arguments (run row, params, manifest, config,
    summary, tables, metrics, tags, texts, folders), `summary` what the flow returns, `report_md` report.md."""

    files: dict[str, Any]
    summary: dict[str, Any]
    report_md: str


@contextlib.contextmanager
def finished_record(cfg: ExperimentConfig, run: PipelineRun, ev: StageOutputs, progress: Progress,
                    t0: float) -> Iterator[Record]:
    """The record of a run whose stages all finished; the folders it attaches (comparison, probe) exist
    until the context closes, so record it inside."""
    # Base vs trained on the same problems, paired (rlvr_core.eval.compare): the delta's interval is much tighter
    # than two independent accuracies' would be, and the solvable sets show whether RL widened or sharpened.
    comparison = None
    if ev.base_eval and ev.trained_eval:
        comparison = compare(from_tables(ev.base_eval.samples, ev.base_eval.metrics, "base", "base"),
                             from_tables(ev.trained_eval.samples, ev.trained_eval.metrics, "trained", "trained"))
        benchmark = ev.base_eval.summary["benchmark"]
        flag = regression_flag(_comparison_summary(comparison, benchmark)["accuracy_greedy"], benchmark)
        if flag:  # with the evaluation's own flags: summary, report, warehouse health_events, the CLI's WARNING
            ev.trained_eval.summary["flags"] = [*(ev.trained_eval.summary.get("flags") or []), flag]
            progress("compare", f"flag {flag['reason']}")
    summary = _summary(cfg, run, ev, comparison, t0)
    with tempfile.TemporaryDirectory(prefix="rlvr-attach-") as tmp:
        folders = {}
        if comparison:
            write_report(comparison, Path(tmp) / "comparison")  # comparison.md / .json beside the evaluations
            folders["."] = Path(tmp) / "comparison"
        if ev.base_eval and ev.trained_eval:
            summary["probe"] = _probe_report(cfg, ev, Path(tmp) / "probe", run.run_id)
            folders["probe"] = Path(tmp) / "probe"
        report_md = report_markdown(cfg, summary)
        yield Record(dict(run=_run_row(cfg, run, ev, t0), params=run_params(run), manifest=_manifest(cfg, run, ev),
                          config=run.public, summary=summary, tables=_tables(cfg, ev), metrics=_metrics(ev),
                          tags=_tags(run, ev, summary), texts={"report.md": report_md}, folders=folders),
                     summary, report_md)


def run_params(run: PipelineRun) -> dict[str, Any]:
    sweep = run.sweep
    return {**config_params(run.public),
            **({"sweep.id": sweep["sweep_id"], "sweep.trial_id": sweep["trial_id"],
                "sweep.trial_label": sweep["trial_label"]} if sweep["sweep_id"] else {})}


def _summary(cfg: ExperimentConfig, run: PipelineRun, ev: StageOutputs, comparison, t0: float) -> dict[str, Any]:
    """The numbers `rlvr demo` prints and summary.json holds. `accuracy_greedy`, `passk`: the run's result
    (the trained checkpoint when there is one); `base_*` / `trained_*` / `delta_pass_at_1`: each side."""
    head, base, trained = ev.headline, ev.base_eval, ev.trained_eval
    return {
        "mlflow_run_id": run.run_id, "experiment": cfg.tracking.experiment, "kind": run.kind, **run.sweep,
        "accuracy_greedy": head.summary["accuracy_greedy"], "accuracy_greedy_ci95": head.summary["accuracy_greedy_ci"],
        "n_eval": head.summary["n"], "passk": head.summary["passk"],
        **({"base_pass_at_1": base.summary["accuracy_greedy"], "base_pass_at_1_ci95": base.summary["accuracy_greedy_ci"],
            "base_pass_at_k": base.summary["passk"], "base_accuracy_greedy": base.summary["accuracy_greedy"]}
           if base else {}),
        **({"trained_pass_at_1": trained.summary["accuracy_greedy"],
            "trained_pass_at_1_ci95": trained.summary["accuracy_greedy_ci"], "trained_pass_at_k": trained.summary["passk"]}
           if trained else {}),
        **({"delta_pass_at_1": trained.summary["accuracy_greedy"] - base.summary["accuracy_greedy"]}
           if base and trained else {}),
        **({"train": {k: v for k, v in ev.trained.summary.items() if not isinstance(v, (list, dict))}}
           if ev.trained else {}),
        **({"export": {"uri": ev.exported.uri, "step": ev.exported.step, "dtype": ev.exported.dtype,
                       "manifest_sha256": ev.exported.manifest_sha256}} if ev.exported else {}),
        **({"comparison": _comparison_summary(comparison, base.summary["benchmark"])} if comparison else {}),
        "eval": {k: v for k, v in (base or head).summary.items() if k != "passk"},
        **({"trained_eval": {k: v for k, v in trained.summary.items() if k != "passk"}} if trained else {}),
        # Every evaluation over a limit (G-verifier-error, G-truncation), the evaluation named.
        "eval_flags": [{"eval_id": name, **f} for name, e in (("base", base), ("trained", trained)) if e
                       for f in e.summary.get("flags") or []],
        "pass_rates": ev.passrates.summary, "pass_rate_table_id": ev.passrates.table_id,
        "curriculum_id": ev.curriculum.curriculum_id,
        "curriculum": {"id": ev.curriculum.curriculum_id, "strategy": cfg.curriculum.strategy,
                       "n_prompts": ev.curriculum.n_prompts},
        "cached": {"data": ev.data.cached, "base_model": ev.model.cached, "pass_rate_table": ev.passrates.cached,
                   "curriculum": ev.curriculum.cached, **({"train": ev.trained.cached} if ev.trained else {})},
        "guard_coverage": guard_coverage(cfg),  # every guard: active, or the setting it needs (docs/guards.md)
        "numerics": numerics(),  # thread count and CPU instruction set: with the seed, they fix the numbers
        "config_hash": run.config_hash, "mlflow_child_run_ids": run.children,
        "mlflow_experiment_id": run.tracker.experiment_id, "mlflow_tracking_uri": run.tracker.display_uri,
        "mlflow_run_url": run.tracker.run_url(run.run_id), "prefect_flow_run_id": run.prefect_id,
        "artifact_uri": run.store.url(run.prefix), "warehouse_path": str(settings.warehouse_path()),
        "duration_s": round(time.monotonic() - t0, 2),
    }


def stopped_record(cfg: ExperimentConfig, run: PipelineRun, ev: StageOutputs, t0: float) -> Record | None:
    """A serious guard stopped training (G-collapse, G-entropy, G-kl-explosion): record what the run has (its
    steps, health events, the trainer's summary, the base evaluation if any) under the `collapsed` tag with
    status FAILED, so that the warehouse's collapsed runs, the report and the MLflow run say why it stopped.
    Nothing is exported: the trainer kept no checkpoint of the bad state. Any other failure records nothing
    here (the flow run and the MLflow run fail with it). The record's `summary` is the stopped run's summary
    with the reasons, the report's address and the training folder; None when training was not stopped by a
    guard."""
    stopped = stages.stopped_training(cfg, ev.model, ev.curriculum)
    if stopped is None:
        return None
    folder, train_summary = stopped
    # What the run was guarded against goes with the stopped run's training summary too.
    train_summary = {**train_summary, "guard_coverage": train_summary.get("guard_coverage") or guard_coverage(cfg)}
    trained = stages.TrainArtifact(ev.model, str(folder / STEPS_FILE), str(folder), False, train_summary)
    summary = {"mlflow_run_id": run.run_id, "experiment": cfg.tracking.experiment, "kind": run.kind, **run.sweep,
               "status": "collapsed", "stopped_at_step": train_summary.get("stopped_at_step"),
               "stopped_by": train_summary.get("stopped_by"), "health_firings": train_summary.get("health_firings"),
               "train": {k: v for k, v in train_summary.items() if not isinstance(v, (list, dict))},
               "config_hash": run.config_hash, "artifact_uri": run.store.url(run.prefix),
               "mlflow_run_url": run.tracker.run_url(run.run_id), "mlflow_open": mlflow_link(run.tracker, run.run_id),
               "guard_coverage": train_summary["guard_coverage"], "duration_s": round(time.monotonic() - t0, 2)}
    row = {**_run_row(cfg, run, ev, t0), "status": "FAILED",
           "tags": {"collapsed": "true", "stopped_at_step": str(summary["stopped_at_step"])}}
    # A stop before the first step's row (G-no-signal before training) has no steps file.
    steps = _train_tables(trained) if Path(trained.steps_path).is_file() else {}
    tables = {**record_tables(cfg, ev.model, ev.passrates, ev.curriculum), **steps,
              "train/health_events.parquet": warehouse.health_events_table(
                  (train_summary.get("health_firings") or []) + eval_events(ev))}
    if ev.base_eval:
        tables.update({"evals/samples.parquet": ev.base_eval.samples, "evals/metrics.parquet": ev.base_eval.metrics,
                       "passk_curves.parquet": ev.base_eval.curves})
    reasons = "; ".join(f["reason"] for f in train_summary.get("health_firings") or [] if f.get("serious"))
    report_md = (f"# Pipeline run `{run.run_id}`: stopped by a guard at step {summary['stopped_at_step']}\n\n"
                 f"{reasons}\n\nNo checkpoint was exported. Artifacts: {summary['artifact_uri']}\n")
    files = dict(run=row, params=run_params(run), manifest=_manifest(cfg, run, ev), config=run.public, summary=summary,
                 tables=tables, metrics=eval_metrics(ev.base_eval) if ev.base_eval else {},
                 tags={"collapsed": "true", "stopped_at_step": str(summary["stopped_at_step"]),
                       "artifact_uri": summary["artifact_uri"]},
                 texts={"report.md": report_md, f"train/{SUMMARY_FILE}": json.dumps(train_summary, indent=2, default=str)})
    return Record(files, {**summary, "reasons": reasons, "report": run.store.url(f"{run.prefix}/report.md"),
                          "train_folder": str(folder), "train_summary": str(folder / SUMMARY_FILE)}, report_md)


def mlflow_link(tracker: Tracker, run_id: str) -> str:
    """Where a browser opens the run: its page on the MLflow server, or, for a file or database store, the
    `mlflow ui` command that serves it and the page's address under that command's default port."""
    url = tracker.run_url(run_id)
    if url.startswith(("http://", "https://")):
        return url
    return (f"`mlflow ui --backend-store-uri {tracker.display_uri}`, then "
            f"http://127.0.0.1:5000/#{url.split('#', 1)[1]}")


def _run_row(cfg: ExperimentConfig, run: PipelineRun, ev: StageOutputs, t0: float) -> dict[str, Any]:
    """The warehouse `runs` row; its `tags` become `run_tags` (`collapsed` is what collapsed_runs looks for)."""
    final = ev.exported.model if ev.exported else ev.model
    return {"run_id": run.run_id, "experiment": cfg.tracking.experiment, "name": run.name, "kind": run.kind,
            "status": "FINISHED", "started_at": run.started,
            "finished_at": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "duration_s": time.monotonic() - t0,
            "config_hash": run.config_hash, "git_sha": run.git["sha"], "git_dirty": run.git["dirty"],
            "model_id": final.model_id, "model_hash": final.model_hash, "tokenizer_hash": ev.model.tokenizer_hash,
            "dataset_hash": ev.data.dataset_hash, "prompt_template": run.template_key,
            "artifact_uri": run.store.url(run.prefix), "mlflow_run_id": run.run_id,
            "prefect_flow_run_id": run.prefect_id,
            **({"tags": {"collapsed": "true"}} if ev.trained and collapsed(ev.trained.summary) else {})}


def _manifest(cfg: ExperimentConfig, run: PipelineRun, ev: StageOutputs) -> dict[str, Any]:
    trained, exported = ev.trained, ev.exported
    return stages.experiment_manifest(
        cfg, ev.data, ev.model, config_hash=run.config_hash, resolved_config=run.public,
        template_key=run.template_key,
        extra={"mlflow_run_id": run.run_id, "mlflow_child_run_ids": run.children, "prefect_flow_run_id": run.prefect_id,
               **run.sweep, "pass_rate_table_id": ev.passrates.table_id, "curriculum_id": ev.curriculum.curriculum_id,
               "trained_model": ({"id": trained.model.model_id, "hash": trained.model.model_hash,
                                  "path": trained.model.path} if trained else None),
               "export": ({"uri": exported.uri, "step": exported.step, "dtype": exported.dtype,
                           "manifest_sha256": exported.manifest_sha256,
                           "model_hash": exported.model.model_hash} if exported else None)})


def _tables(cfg: ExperimentConfig, ev: StageOutputs) -> dict[str, pa.Table]:
    evals = [e for e in (ev.base_eval, ev.trained_eval) if e is not None]
    # "default" promotion: a column that is all-null in one eval (e.g. no extracted answers) still concatenates.
    # The curves are the evaluator's own: pass@k for every k = 1..n, per scoring, with eval_id, benchmark,
    # checkpoint and scoring as columns (warehouse `passk_curves`), so they match `rlvr eval`'s file.
    tables = {**record_tables(cfg, ev.model, ev.passrates, ev.curriculum),
              "evals/samples.parquet": pa.concat_tables([e.samples for e in evals], promote_options="default"),
              "evals/metrics.parquet": pa.concat_tables([e.metrics for e in evals], promote_options="default"),
              "passk_curves.parquet": pa.concat_tables([e.curves for e in evals])}
    if ev.trained:
        tables.update(_train_tables(ev.trained))
    events = eval_events(ev)
    if ev.trained or events:
        # Written even when nothing fired: an empty file says "no firings", whereas a missing one makes the
        # warehouse fall back to the per-step health/* flags. Training's firings and episodes, then the
        # evaluations' flags.
        firings = (ev.trained.summary.get("health_firings") or []) if ev.trained else []
        tables["train/health_events.parquet"] = warehouse.health_events_table(firings + events)
    return tables


def eval_events(ev: StageOutputs) -> list[dict[str, Any]]:
    """Health events of the evaluations' flags: the base model's at step 0, the trained checkpoint's at the
    step it was exported at."""
    out = []
    if ev.base_eval:
        out += warehouse.eval_flag_events(ev.base_eval.summary.get("flags") or [], 0, "base")
    if ev.trained_eval:
        out += warehouse.eval_flag_events(ev.trained_eval.summary.get("flags") or [], ev.exported.step, "trained")
    return out


def _train_tables(trained: stages.TrainArtifact) -> dict[str, pa.Table]:
    """The training stage's files in the run folder (docs/warehouse.md says which table each fills);
    train/health_events.parquet comes from `_tables`."""
    tables = {"train/steps.parquet": pq.read_table(trained.steps_path),
              "train/steps_long.parquet": steps_long(trained.steps_path)}
    for name in (ROLLOUTS_FILE, SEGMENTS_FILE):  # absent with rollout_samples_per_step = 0; segments: multi-turn
        if (Path(trained.folder) / name).is_file():
            tables[f"train/{name}"] = pq.read_table(Path(trained.folder) / name)
    return tables


def _metrics(ev: StageOutputs) -> dict[str, float]:
    """The parent run's headline numbers (runs compare at the top level of the MLflow UI); each stage's
    child run holds its detail. `eval/<benchmark>/…`: the base model when the run evaluated it, else the
    trained checkpoint; `eval/<benchmark>/trained/…`: the trained checkpoint."""
    first = ev.base_eval or ev.trained_eval
    metrics = {**eval_metrics(first), **passk_metrics(ev.passrates), "curriculum/n_prompts": ev.curriculum.n_prompts}
    if ev.trained_eval:
        metrics.update(eval_metrics(ev.trained_eval, "trained"))
    return metrics


def _tags(run: PipelineRun, ev: StageOutputs, summary: dict[str, Any]) -> dict[str, Any]:
    exported = ev.exported
    return {"dataset_hash": ev.data.dataset_hash, "model_hash": ev.model.model_hash,
            "artifact_uri": summary["artifact_uri"],
            **({"export_uri": exported.uri, "export_step": str(exported.step),
                "export_manifest_sha256": exported.manifest_sha256} if exported else {})}


def eval_metrics(ev: stages.EvalArtifact, sub: str | None = None) -> dict[str, float]:
    """An evaluation's numbers under `eval/<benchmark>[/<sub>]/…` (pass@k stored as pass@k)."""
    ns = f"eval/{ev.summary['benchmark']}" + (f"/{sub}" if sub else "")
    return {f"{ns}/accuracy_greedy": ev.summary["accuracy_greedy"], f"{ns}/n": ev.summary["n"],
            **{f"{ns}/pass@{k}": v for k, v in ev.curve.items()},
            **{f"{ns}/{k}": v for k, v in ev.summary.items() if k.endswith("_share")}}


def passk_metrics(passrates: stages.PassRateArtifact) -> dict[str, float]:
    return {f"passk/{k}": float(v) for k, v in passrates.summary.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _probe_report(cfg: ExperimentConfig, ev: StageOutputs, out: Path, run_id: str) -> dict[str, Any]:
    """A short RL-Probe report (docs/probes.md) of the trained checkpoint against the base on the held-out
    problems the base failed and the trained model solved: token KL, spikes and their categories. It reuses
    the two evaluations' greedy completions (nothing is sampled again); its tables go to the warehouse with
    the run (`probe/`). The probe is imported here: it loads torch, which recording otherwise never needs."""
    from rlvr_core.probe.report import ProbeSettings, run_rl_probe
    from rlvr_core.probe.tables import Checkpoint

    probe = ProbeSettings(max_problems=50, sample_figures=2, task=TaskSettings(
        template_id=cfg.prompt.template, verifier=cfg.eval.verifier, verifier_mode=cfg.eval.verifier_mode,
        max_new_tokens=cfg.eval.max_new_tokens, seed=cfg.sampling.seed))
    _, meta = run_rl_probe(Checkpoint("base", 0, ev.model.path),
                           [Checkpoint("trained", ev.exported.step, ev.exported.model.path)],
                           ev.data.test_rows(), out, probe, probe_id=f"{run_id}",
                           greedy_a=ev.base_eval.samples.to_pylist(), greedy_b=ev.trained_eval.samples.to_pylist())
    tokens = pq.read_table(out / "probe_tokens.parquet", columns=["checkpoint_b", "is_spike", "category"]).to_pylist()
    spikes = [r["category"] for r in tokens if r["checkpoint_b"] == "trained" and r["is_spike"]]
    by_cat = {c: spikes.count(c) for c in sorted(set(spikes))}
    keep = ("probe_id", "n_selected", "n_sequences", "n_tokens_per_checkpoint", "duration_s")
    return {"folder": "probe/", **{k: meta[k] for k in keep}, "spikes": len(spikes), "spikes_by_category": by_cat}


def collapsed(train_summary: dict[str, Any]) -> bool:
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


# ------------------------------------------------------------------------------------------ report
def report_markdown(cfg: ExperimentConfig, s: dict[str, Any]) -> str:
    lo, hi = s["accuracy_greedy_ci95"]
    lines = [f"# Pipeline run `{s['mlflow_run_id']}`" + (f" — trial {s['trial_id']} of `{s['sweep_id']}`"
                                                         if s.get("sweep_id") else ""), ""]
    if s.get("trial_label"):
        lines += [f"Trial: `{s['trial_label']}`", ""]
    lines += ["| metric | value |", "|---|---|",
              f"| held-out greedy accuracy | {s['accuracy_greedy']:.3f} (95% CI {lo:.3f}–{hi:.3f}, n = {s['n_eval']}) |"]
    if "base_accuracy_greedy" in s:
        lines.append(f"| base model greedy accuracy | {s['base_accuracy_greedy']:.3f} |")
    if s.get("comparison") and s["comparison"]["accuracy_greedy"]:
        d = s["comparison"]["accuracy_greedy"]
        lines.append(f"| trained − base, paired | {d['delta']:+.3f} (95% CI {d['ci_low']:+.3f} to {d['ci_high']:+.3f}) |")
    for k, v in s["passk"].items():
        lines.append(f"| pass@{k} | {v:.3f} |")
    if "train" in s:
        tr = s["train"]
        lines.append(f"| GRPO steps (resumed from step) | {tr.get('steps')} ({tr.get('resumed_from_step', 0)}) |")
        lines.append(f"| reward first → last step | {tr.get('first_reward_mean', float('nan')):.3f} → "
                     f"{tr.get('last_reward_mean', float('nan')):.3f} |")
    flags = [f"- **flag** {f['eval_id']} evaluation: {f['reason']}" for f in s.get("eval_flags") or []]
    lines += ["", *flags] if flags else []
    lines += coverage_lines(s.get("guard_coverage") or {})
    lines += ["", f"- MLflow run: {s['mlflow_run_url']}", f"- Artifacts: {s['artifact_uri']}",
              f"- Config hash: `{s['config_hash']}`; experiment `{cfg.tracking.experiment}`"]
    if "export" in s:
        lines.append(f"- Checkpoint: {s['export']['uri']} (step {s['export']['step']})")
    return "\n".join(lines) + "\n"


def coverage_lines(coverage: dict[str, str]) -> list[str]:
    """The report's guard coverage: how many guards are active, and each one that needs a setting."""
    needs = {g: v for g, v in coverage.items() if not v.startswith("active")}
    if not coverage:
        return []
    lines = ["", f"Guards (docs/guards.md): {len(coverage) - len(needs)} of {len(coverage)} active."]
    return lines + [f"- {g} {v}" for g, v in needs.items()]


def steps_long(steps_path: str | Path) -> pa.Table:
    """Per-step metrics as (step, metric, value) rows: the warehouse schema stays fixed as metrics grow."""
    table = pq.read_table(steps_path)
    cols = table.to_pydict()
    steps = cols.get("step", list(range(table.num_rows)))
    out = {"step": [], "metric": [], "value": []}
    for name, values in cols.items():
        if name == "step":
            continue
        for step, v in zip(steps, values):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            out["step"].append(int(step))
            out["metric"].append(name)
            out["value"].append(float(v))
    return pa.table(out, schema=pa.schema([("step", pa.int64()), ("metric", pa.string()), ("value", pa.float64())]))


def record_tables(cfg: ExperimentConfig, model: stages.ModelArtifact, passrates: stages.PassRateArtifact,
                  curriculum: stages.CurriculumArtifact) -> dict[str, pa.Table]:
    """The pass-rate table and the curriculum as the run folder stores them: each row carries the settings
    that produced it (table id, model hash, template, temperature, max tokens, verifier; curriculum id and
    strategy), so the warehouse rows keep their context."""
    pr_table = pq.read_table(passrates.table_path)
    context = {"table_id": passrates.table_id, "model_hash": model.model_hash,
               "prompt_template": get_template(cfg.prompt.template).key, "temperature": cfg.sampling.temperature,
               "max_new_tokens": cfg.sampling.max_new_tokens, "verifier": cfg.reward.verifier}
    for name, value in context.items():
        pr_table = pr_table.append_column(name, pa.array([value] * pr_table.num_rows))
    cur_table = pq.read_table(curriculum.path)
    cur_table = cur_table.append_column("curriculum_id", pa.array([curriculum.curriculum_id] * cur_table.num_rows))
    cur_table = cur_table.append_column("strategy", pa.array([cfg.curriculum.strategy] * cur_table.num_rows))
    return {"passk/pass_rate_table.parquet": pr_table, "curriculum/curriculum.parquet": cur_table}
