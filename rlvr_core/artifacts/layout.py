"""Where a run's folder lives in the artifact store, and how to find it again from a run id.

Layout (docs/artifacts.md), chosen so a person browsing the bucket sees names, not ids:

    <experiment>/<run name>-<run id[:8]>/          a single run (rlvr demo, a pipeline run, rlvr eval --record)
    <experiment>/<sweep id>/index.html             a sweep: its index page and pivot
    <experiment>/<sweep id>/<trial id>_<label>/    one trial of that sweep, e.g. t01_lr=5e-05_seed=0

Names are made safe for S3 keys, URLs and file systems by `slug`. A single run's folder always ends in the
first 8 characters of its run id: two runs with the same name (every `rlvr demo` is named "demo") never
share a folder, and the name follows from the run id alone, so a relaunched run (same MLflow run) finds its
folder again without asking the store. Trial folders need no suffix: trial ids are unique in their sweep and
the sweep id holds the sweep's Prefect flow run id.

Readers never rebuild these names: they find a run's folder by its `run.json` (`find_run_folders`,
`resolve_run`), so folders written under the earlier `<experiment>/<run_id>/` layout keep working.
"""

from __future__ import annotations

import json
import re

from rlvr_core.artifacts.storage import ArtifactStore, join

RUN_FILE = "run.json"
# The training stage's folder (written by rlvr_core.grpo.checkpointing, read by the pipeline's recorder): named
# here, below the trainer, so that reading a file name does not import torch.
STEPS_FILE = "steps.parquet"
SUMMARY_FILE = "grpo_summary.json"
ROLLOUTS_FILE = "rollouts.parquet"
SEGMENTS_FILE = "rollout_segments.parquet"  # a multi-turn run's sampled trajectories, one row per segment
SUFFIX_LEN = 8
_UNSAFE = re.compile(r"[^A-Za-z0-9._=+-]+")


def slug(text: str, max_len: int = 80) -> str:
    """`text` as one readable path segment: runs of other characters become '_', never '.' or '..' alone."""
    s = _UNSAFE.sub("_", str(text)).strip("_.")[:max_len].strip("_.")
    return s or "run"


def run_folder_name(name: str | None, run_id: str) -> str:
    return f"{slug(name or 'run', 60)}-{run_id[:SUFFIX_LEN]}"


def mlflow_run_name(kind: str, *, name: str | None = None, sweep_id: str | None = None, trial_id: str | None = None,
                    trial_label: str | None = None, checkpoint: str | None = None) -> str:
    """The MLflow run name of every run a flow opens, decided here and nowhere else.

    demo / pipeline: the experiment config's `name`; sweep: the sweep id (the parent run); trial: what the
    trial varies (its label, "lr=5e-05 seed=1"), so MLflow's run list tells trials apart, else
    `<sweep id>/<trial id>`; eval (nightly evaluation of a checkpoint): `eval <checkpoint folder>`. The ids
    themselves are tags."""
    names = {"sweep": sweep_id, "trial": trial_label or f"{sweep_id}/{trial_id}", "eval": f"eval {checkpoint}",
             "demo": name, "pipeline": name}
    if kind not in names:
        raise ValueError(f"unknown run kind {kind!r}; known: {sorted(names)}")
    return str(names[kind])


def run_prefix(experiment: str, name: str | None, run_id: str) -> str:
    """A single run's folder: `<experiment>/<name>-<run id[:8]>`."""
    return join(slug(experiment), run_folder_name(name, run_id))


def sweep_prefix(experiment: str, sweep_id: str) -> str:
    return join(slug(experiment), slug(sweep_id))


def trial_prefix(experiment: str, sweep_id: str, trial_id: str, label: str | None = None) -> str:
    """A sweep trial's folder: `<experiment>/<sweep id>/<trial id>_<label>`."""
    return join(sweep_prefix(experiment, sweep_id), slug(f"{trial_id} {label}" if label else trial_id, 100))


def pipeline_prefix(experiment: str, name: str | None, run_id: str, sweep_id: str | None = None,
                    trial_id: str | None = None, trial_label: str | None = None) -> str:
    """The folder of a `pipeline` flow run: a trial's folder inside its sweep, else a single run's."""
    if sweep_id and trial_id:
        return trial_prefix(experiment, sweep_id, trial_id, trial_label)
    return run_prefix(experiment, name, run_id)


def find_run_folders(store: ArtifactStore, under: str = "") -> list[str]:
    """Every run folder (a folder holding run.json, at least `<experiment>/<run>`), outermost only."""
    base = under.strip("/")
    folders = sorted({k.rsplit("/", 1)[0] for k in store.list(base)
                      if k.endswith("/" + RUN_FILE) and k.count("/") >= 2})
    out: list[str] = []
    for f in folders:  # sorted: a parent comes right before its children
        if not any(f.startswith(p + "/") for p in out[-1:]):
            out.append(f)
    return out


def resolve_run(store: ArtifactStore, ref: str, read_trials: bool = True) -> str:
    """The folder of a run given as a folder (`EXP/NAME-ID8`, `EXP/SWEEP/TRIAL`), `EXP/RUN_ID` or a bare
    run id (full, or at least its first 8 characters). Raises FileNotFoundError naming `ref` and the store.
    A trial's folder is named by its trial, not its run id, so finding one reads every trial's run.json (one
    request each on S3); `read_trials` False looks at the folder names only (rlvr_core.records.locate asks
    MLflow first, one request, for a full run id)."""
    ref = ref.strip("/")
    if not ref or any(p in (".", "..") for p in ref.split("/")):
        raise FileNotFoundError(f"run {ref!r} not found in the artifact store {store.uri}")
    if store.exists(join(ref, RUN_FILE)):
        return ref
    experiment, _, run_id = ref.rpartition("/")
    hits = []
    if len(run_id) >= SUFFIX_LEN:
        for folder in find_run_folders(store, experiment):
            last = folder.rsplit("/", 1)[-1]
            named = last == run_id or last.endswith("-" + run_id[:SUFFIX_LEN])
            if (named or (read_trials and folder.count("/") >= 2)) and _run_id_of(store, folder).startswith(run_id):
                hits.append(folder)
    if len(hits) == 1:
        return hits[0]
    if hits:
        raise FileNotFoundError(f"run {ref!r} is ambiguous in {store.uri}: {', '.join(hits)}")
    raise FileNotFoundError(f"run {ref!r} not found in the artifact store {store.uri}")


def _run_id_of(store: ArtifactStore, folder: str) -> str:
    try:
        return str(json.loads(store.get_text(join(folder, RUN_FILE))).get("run_id") or "")
    except (ValueError, OSError, AttributeError):
        return ""
