"""The `probe` flow: the analyses of `rlvr_core.probe` (docs/probes.md) on chosen checkpoints, as one flow run.

    prefect deployment run 'probe/probe' --param a=<base model dir> --param 'b=["<trained dir>"]'

Each analysis (`report` = RL-Probe token KL and spikes, `dlogp` = Δlog p with replacement and
extrapolation, `boundary` = pass@k capability boundary) is one task that runs `rlvr probe <analysis>`
in a child process (`rlvr_core.pipeline.child.run_child`, under the parent watch): a clean process per analysis
(model memory freed when it ends, GPU tag and slot as the other heavy stages). A kill is a transient failure
that is retried (`tasks.retry`); a kill by the kernel's OOM killer, or a failed analysis, is not (the kill ends
with the G-oom line, as a stage's does). Each writes
its folder under the flow's work dir and, with `publish_prefix`, copies it into the artifact store at
`<publish_prefix>/probes/<analysis>/`. When `publish_prefix` is a run folder (`EXPERIMENT/RUN_ID` with a
run.json), the run is re-ingested afterwards, so the probe tables land in the warehouse beside it.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from flows.sealed import sealed_flow
from rlvr_core.artifacts.storage import open_store
from rlvr_core.core import settings
from rlvr_core.pipeline.child.run import child_env, death_error, run_child
from rlvr_core.records import warehouse
from tasks.stages import GPU_TAG, RETRY

ANALYSES = ("report", "dlogp", "boundary")


@task(name="probe-analysis", tags=[GPU_TAG], **RETRY)
def run_analysis(analysis: str, a: str, b: list[str], out: str, options: dict[str, Any],
                 publish: str | None, artifact_uri: str | None) -> dict[str, Any]:
    """`rlvr probe ANALYSIS --a A --b B… --out OUT [options]` in a child process; returns its meta.json."""
    if analysis not in ANALYSES:  # a typo is a bad request, not worth a retry
        raise ValueError(f"unknown probe analysis {analysis!r}: use one of {ANALYSES}")
    bs = b if analysis == "report" else b[-1:]  # dlogp and boundary compare A with one checkpoint
    cmd = [sys.executable, "-m", "rlvr_core.pipeline.child.watched", "rlvr_cli.probe", analysis, "--a", a, "--out", out]
    for x in bs:
        cmd += ["--b", x]
    for k, v in options.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    if publish:
        cmd += ["--publish", f"{publish}/probes/{analysis}"]
        if artifact_uri:
            cmd += ["--artifact-uri", artifact_uri]
    logger = get_run_logger()
    logger.info("probe %s: %s", analysis, " ".join(cmd[4:]))
    outcome = run_child(f"probe {analysis}", cmd, child_env(), log=logger.info)
    if outcome.returncode != 0:
        # Killed by a signal (a lost worker, pre-emption): transient; by the kernel's OOM killer: G-oom. A usage
        # error or a failed analysis would fail the same way again: not retried.
        raise death_error(f"rlvr probe {analysis} exited with status {outcome.returncode}", outcome, "probe",
                          retry="a retry runs the analysis again")
    meta = Path(out) / "meta.json"
    return json.loads(meta.read_text()) if meta.is_file() else {"out": out}


@task(name="ingest-probed-run", **RETRY)
def ingest_run(run_prefix: str, artifact_uri: str | None) -> dict[str, int] | None:
    store = open_store(artifact_uri)
    if not store.exists(f"{run_prefix}/run.json"):
        return None  # published somewhere that is not a run folder: nothing to attach the tables to
    return warehouse.ingest_run(store, run_prefix)


@sealed_flow(name="probe", log_prints=True, validate_parameters=False)
def probe_flow(a: str, b: list[str], analyses: list[str] | None = None, options: dict[str, dict[str, Any]] | None = None,
               publish_prefix: str | None = None, artifact_uri: str | None = None,
               work_dir: str | None = None) -> dict[str, Any]:
    """Run the chosen probe analyses of checkpoint(s) `b` against `a` (model folders).

    `options` maps an analysis to extra `rlvr probe` options, e.g. {"boundary": {"n_samples": 64}}.
    Returns {analysis: its meta.json} plus "ingested" (warehouse row counts, or None)."""
    analyses = list(analyses or ANALYSES)
    options = options or {}
    bad = [x for x in analyses if x not in ANALYSES] + [x for x in options if x not in ANALYSES]
    if bad or not b:
        raise ValueError(f"probe flow: unknown analyses {bad} (use {ANALYSES})" if bad else "probe flow: b is empty")
    root = Path(work_dir or tempfile.mkdtemp(prefix="rlvr-probe-", dir=settings.paths().home))
    results: dict[str, Any] = {}
    for analysis in analyses:  # one after another: each loads both models
        results[analysis] = run_analysis(analysis, a, list(b), str(root / analysis), options.get(analysis, {}),
                                         publish_prefix, artifact_uri)
    results["ingested"] = ingest_run(publish_prefix, artifact_uri) if publish_prefix else None
    lines = [f"# Probe of {', '.join(b)} against {a}", ""]
    lines += [f"- **{k}**: `{root / k}`" + (f", published to `{publish_prefix}/probes/{k}/`" if publish_prefix else "")
              for k in analyses]
    create_markdown_artifact("\n".join(lines), key="probe-summary", description="probe analyses")
    return results
