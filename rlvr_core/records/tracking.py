"""MLflow conventions in one place (docs/tracking.md explains them for users).

We use `MlflowClient` with explicit run ids rather than MLflow's fluent "active run" globals, because
stages run in Prefect worker threads and subprocesses where a thread-local active run is a trap.

The conventions, each enforced here rather than remembered by callers:

- One experiment per project config (`tracking.experiment`).
- A pipeline run is a parent run; each stage is a child run (`child_run(parent_id, stage)`; a relaunched
  parent finds its stage runs again). A sweep is a parent run with one child per trial; trials run in other
  processes, so they receive the parent id and the sweep's common tags and call
  `start_run(..., parent_run_id=...)` themselves. MLflow's runs table folds each level under the one above.
- Every run carries the same standard tags (`STANDARD_TAGS`): `common_tags()` builds them, and a
  Tracker stamps its common tags on every run it starts and re-stamps them when one becomes known
  later (`add_common_tags`), so the parent and all children always agree.
- Metric names are hierarchical, `<namespace>/<...>/<name>` (`train/reward_mean`,
  `eval/gsm8k/pass@1`, `health/G-kl-explosion`), and the namespace must be one of `METRIC_NAMESPACES`.
  MLflow forbids `@` in names, so `pass@1` is stored as `pass_at_1` (`metric_key`).
- Params are the resolved config flattened to dotted keys, with secrets redacted (`config_params`): values
  under names that are credentials (`is_secret_key`), passwords inside URLs.
- Per-step training metrics reach MLflow while training runs, each at its own step and time, batched in a
  background thread, never twice (`StepMetricsSink`; `log_step_rows` backfills only what is missing).
- Experiments open on MLflow 3's runs view, not its GenAI page (`EXPERIMENT_KIND_TAG`, `UI_QUERY`), and carry
  saved views (`saved_view`, `view_url`): the runs without their stage runs, and per sweep its trials with the
  pivot metric's chart first.
- System metrics (CPU, memory, disk, network, GPU) are sampled into the run as `system/*`
  (`system_metrics`); MLflow's monitor takes an explicit run id, so it works with client-created runs.
- Artifacts go through the client, so against `mlflow server --serve-artifacts` they travel through
  the server's proxy and the client needs no bucket credentials.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import urlsplit, urlunsplit
from urllib.parse import quote

from rlvr_core.core import settings
from rlvr_core.records.redact import redact, redact_url, text_without_credentials

_PARAM_VALUE_MAX = 6000  # MLflow's limit on a param value
_log = logging.getLogger("rlvr.tracking")

# The tags every run carries (value "" when it does not apply, e.g. `sweep_id` outside a sweep), so a
# search like `tags.config_hash = '…'` finds parents and children alike.
STANDARD_TAGS = ("sweep_id", "trial_id", "config_hash", "git_sha", "prefect_flow_run_id", "dataset_hash")
KIND_TAG = "kind"  # on every run: demo, pipeline, sweep, trial (parents) or stage (children)
STAGE_TAG = "stage"  # on stage runs: data, base-model, passk, curriculum, train, export, evaluate

# Top-level metric namespaces; a metric outside them is a bug in the caller (a typo splits a chart).
METRIC_NAMESPACES = frozenset({
    "train",       # per-step training numbers
    "eval",        # eval/<benchmark>/<metric>
    "passk",       # pass-rate table summaries
    "curriculum",  # curriculum size and shape
    "data",        # data set sizes
    "model",       # base-model facts (parameters, warm-start loss)
    "export",      # exported checkpoint facts
    "health",      # guard firings: health/<guard id from BUGZOO>
    "probe",       # probes: token KL, Δlog p, entropy
    "sweep",       # sweep-level aggregates on a sweep's parent run
    "system",      # MLflow's system metrics monitor
    "time",        # stage durations in seconds
})
_SEGMENT = re.compile(r"^[A-Za-z0-9_.\-:@ ]+$")

# MLflow 3's UI opens an experiment on its GenAI pages (traces) unless told it is "machine learning". MLflow
# 3.17's UI decides from its GenAI/Machine-learning switch (kept in the browser, default GenAI) or the link's
# `workflowType` parameter, so every link we print carries `UI_QUERY`; UIs that read the experiment's kind
# tag instead get `EXPERIMENT_KIND_TAG` on every experiment a Tracker creates or uses.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
UI_QUERY = "?workflowType=machine_learning"


def ui_home(server_url: str) -> str:
    """The MLflow server's experiments list in the model-training view (what `rlvr stack up` prints)."""
    return f"{server_url.rstrip('/')}/#/experiments{UI_QUERY}"

# Saved views (docs/tracking.md, "Views"): MLflow 3.17's UI keeps a runs-page view (search filter, charts and
# their order) as an experiment tag `mlflow.sharedViewState.<id>`, lists it under "Views" and opens it from a
# link with `viewStateShareKey=<id>`. rlvr saves one that hides the stage runs and one per sweep.
VIEW_TAG_PREFIX = "mlflow.sharedViewState."
RUNS_VIEW_ID = "rlvr-runs"
# The run-name order as MLflow 3.17's runs page names it in its sort menu; `attributes.run_name` sorts the same
# but the menu has no label for it ("Sort: undefined").
RUN_NAME_ORDER = "tags.`mlflow.runName`"
NO_STAGE_RUNS = "tags.kind != 'stage'"  # the runs a person compares: demos, pipelines, sweeps, trials
# MLflow's experiment tag naming the metric runs are judged by (the sweep's pivot metric).
PRIMARY_METRIC_TAG = "mlflow.experiment.primaryMetric.name"
GREATER_IS_BETTER_TAG = "mlflow.experiment.primaryMetric.greaterIsBetter"
# The curves a view shows first, by importance: reward, accuracy, KL, entropy, length, then the loss; a missing
# one is an empty chart, which the view hides. (A run's own "Model metrics" tab orders its charts by name:
# MLflow 3.17 keeps no chart order for it; docs/tracking.md.)
TRAINING_CURVES = ("train/reward_mean", "train/eval/greedy_pass_at_1", "train/kl_ref_mean", "train/entropy",
                   "train/completion_len_mean", "train/loss")


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} → {'a.b': 1}; lists stay values."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out


def config_params(resolved: dict[str, Any], *sections: str) -> dict[str, Any]:
    """MLflow params from a resolved config: flattened, redacted; only `sections` when given."""
    flat = flatten(redact(resolved))
    if sections:
        flat = {k: v for k, v in flat.items() if k.split(".", 1)[0] in sections}
    return flat


def metric_key(*parts: str) -> str:
    """Join name segments into a conventional MLflow metric key and validate it.

    >>> metric_key("eval", "gsm8k", "pass@1")
    'eval/gsm8k/pass_at_1'
    >>> metric_key("health/G-kl-explosion")
    'health/G-kl-explosion'
    """
    segments = [s for p in parts for s in str(p).split("/")]
    name = "/".join(segments)
    if len(segments) < 2:
        raise ValueError(f"metric {name!r}: needs a namespace, e.g. 'train/{name}' "
                         f"(namespaces: {', '.join(sorted(METRIC_NAMESPACES))})")
    if segments[0] not in METRIC_NAMESPACES:
        raise ValueError(f"metric {name!r}: unknown namespace {segments[0]!r} "
                         f"(namespaces: {', '.join(sorted(METRIC_NAMESPACES))})")
    for s in segments:
        if not _SEGMENT.match(s) or s in (".", ".."):
            raise ValueError(f"metric {name!r}: segment {s!r} may hold only letters, digits, _ . - : @ and spaces")
    return name.replace("@", "_at_")  # MLflow rejects "@"; `pass@1` is stored as `pass_at_1`


def common_tags(*, config_hash: str | None = None, git_sha: str | None = None,
                prefect_flow_run_id: str | None = None, dataset_hash: str | None = None,
                sweep_id: str | None = None, trial_id: str | None = None) -> dict[str, str]:
    """The standard tag set, every key present ("" where it does not apply)."""
    values = {"sweep_id": sweep_id, "trial_id": trial_id, "config_hash": config_hash, "git_sha": git_sha,
              "prefect_flow_run_id": prefect_flow_run_id, "dataset_hash": dataset_hash}
    return {k: "" if values[k] is None else str(values[k]) for k in STANDARD_TAGS}


def _new_params(logged: dict[str, str], params: dict[str, Any] | None) -> dict[str, Any]:
    """The params a reused run does not hold yet: MLflow refuses to log a param again with another value (the
    run keeps what its first launch logged, the same config for a relaunched trial)."""
    return {k: v for k, v in (params or {}).items() if k[:250] not in logged}


def _param_str(v: Any) -> str:
    s = v if isinstance(v, str) else json.dumps(v)
    return s[:_PARAM_VALUE_MAX]


def _metric_items(metrics: dict[str, Any], step: int, timestamp_ms: int | None = None) -> list:
    """MLflow Metric entities for one step, names checked by `metric_key`; None and NaN are skipped.
    `timestamp_ms` is the wall-clock time the values belong to (now when None)."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    return [Metric(metric_key(k), float(v), now, step) for k, v in sorted(metrics.items())
            if v is not None and not (isinstance(v, float) and math.isnan(v))]


def step_items(row: dict[str, Any], prefix: str = "train/", timestamp_ms: int | None = None) -> list:
    """One trainer step row as Metric entities at its own step: `{prefix}<name>`, except columns that carry
    their own namespace (`health/<guard id>`); non-numeric, bool and NaN values are skipped."""
    numeric = {(k if k.startswith("health/") else prefix + k): v for k, v in row.items()
               if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}
    return _metric_items(numeric, int(row.get("step", 0)), timestamp_ms)


def logged_steps(client: Any, run_id: str, keep: Callable[[str], bool]) -> dict[str, set[int]]:
    """{metric key: steps already logged} of the run's metrics whose key passes `keep`: what a resumed
    training or a repeated record must not log again (MLflow appends, it never replaces a step's value)."""
    keys = [k for k in client.get_run(run_id).data.metrics if keep(k)]
    return {k: {m.step for m in client.get_metric_history(run_id, k)} for k in keys}


def _chart(kind: str, key: str, section: str, n_runs: int) -> dict[str, Any]:
    """One chart card as MLflow's runs page stores it (BAR: the latest value per run; LINE: the history by step)."""
    card = {"uuid": f"{section}:{key}", "type": kind, "metricKey": key, "displayName": key,
            "runsCountToCompare": n_runs, "metricSectionId": section, "deleted": False, "isGenerated": False}
    if kind == "LINE":
        card.update(selectedMetricKeys=[key], lineSmoothness=0, xAxisScaleType="linear", scaleType="linear",
                    range={}, xAxisKey="step", selectedXAxisMetricKey="", yAxisKey="metric", yAxisExpressions=[],
                    ignoreOutliers=False, useGlobalXaxisKey=True, useGlobalLineSmoothing=True)
    return card


def saved_view(name: str, *, search_filter: str, sections: dict[str, tuple[str, list[str]]], n_runs: int = 10,
               group_by: list[str] | None = None, now_ms: int | None = None, order_by: str | None = None) -> str:
    """The tag value of a saved runs view (`VIEW_TAG_PREFIX`): MLflow's envelope {name, createdAt, updatedAt,
    state}, the state a JSON string of the runs page's settings. `sections`: {section title: (chart kind,
    metric keys)} in the order shown; the UI adds every other metric in sections after them, and hides empty
    charts. `n_runs`: how many runs each chart draws. `group_by`: params whose values group the runs (the
    table then lists one row per group, not nested under parents, and each chart draws a group's mean).
    `order_by`: the runs' order (e.g. `RUN_NAME_ORDER`). MLflow's runs page, ordered by start time (its
    default), also fetches the parents of the runs the filter matched, so a sweep's view of its 6 trials said
    "7 matching runs"; any other order fetches only the matching runs."""
    charts = [_chart(kind, key, title, n_runs) for title, (kind, keys) in sections.items() for key in keys]
    state = {"searchFilter": search_filter, "compareRunCharts": charts, "isAccordionReordered": True,
             "compareRunSections": [{"uuid": t, "name": t, "display": True, "isReordered": True, "deleted": False,
                                     "isGenerated": False} for t in sections],
             "hideEmptyCharts": True, "runsHiddenMode": "FIRST_20_RUNS" if n_runs > 10 else "FIRST_10_RUNS"}
    if order_by:
        state.update(orderByKey=order_by, orderByAsc=True)
    if group_by:
        state.update(groupBy={"aggregateFunction": "average",
                              "groupByKeys": [{"mode": "param", "groupByData": k} for k in group_by]},
                     useGroupedValuesInCharts=True)
    stamp = int(time.time() * 1000) if now_ms is None else now_ms
    return json.dumps({"name": name, "createdAt": stamp, "updatedAt": stamp, "state": json.dumps(state)})


class StepMetricsSink:
    """Per-step training metrics → one MLflow run *while* training runs (docs/tracking.md, "Training curves").

    The trainer calls the sink with each finished step's row (`on_step`); the values are stamped with that
    moment's wall-clock time (ms) and their step, and buffered. A background thread sends the buffer with
    `log_batch` (≤ 1,000 values a call) every `every_steps` steps or `every_s` seconds, whichever comes
    first, and once more at `close()`, so the trainer never waits for MLflow.

    MLflow unreachable: the values stay buffered and are retried at the next flush; the first failure is
    warned once (and the recovery), training goes on. What is still unsent when `close()` gives up
    (`close_timeout_s`) is warned with its count; steps.parquet keeps every step, and the run's record
    (`Tracker.log_step_rows`) logs the missing ones afterwards.

    Resume: at its first flush the sink reads which (key, step) pairs the run already holds and never
    sends those again, so a training resumed from a checkpoint (which re-runs the steps after it) and a
    relaunched trial reusing its run do not duplicate steps."""

    def __init__(self, run_id: str, tracking_uri: str | None = None, *, prefix: str = "train/",
                 every_steps: int = 10, every_s: float = 10.0, close_timeout_s: float = 60.0):
        from mlflow.tracking import MlflowClient

        self.run_id, self.prefix = run_id, prefix
        self.every_steps, self.every_s, self.close_timeout_s = every_steps, every_s, close_timeout_s
        self.client = MlflowClient(tracking_uri=settings.mlflow_tracking_uri(tracking_uri))
        self.sent = 0                                   # values logged so far
        self._pending: list = []                        # Metric entities not yet in MLflow, oldest first
        self._logged: dict[str, set[int]] | None = None  # (key, step) already in the run: read at first flush
        self._new_steps = 0
        self._failing = self._warned = self._stop = self._abandoned = False
        self._lock, self._wake = threading.Lock(), threading.Event()
        self._thread = threading.Thread(target=self._loop, name="mlflow-step-metrics", daemon=True)
        self._thread.start()

    def __call__(self, row: dict[str, Any]) -> None:
        items = step_items(row, self.prefix, int(time.time() * 1000))
        with self._lock:
            self._pending += items
            self._new_steps += 1
            if self._new_steps >= self.every_steps:
                self._wake.set()

    def __enter__(self) -> "StepMetricsSink":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _loop(self) -> None:
        while True:
            self._wake.wait(self.every_s)
            self._wake.clear()
            stop = self._stop
            self._flush()
            if stop:
                return

    def _mine(self, key: str) -> bool:
        return key.startswith(self.prefix) or key.startswith("health/")

    def _flush(self) -> None:
        with self._lock:
            items, self._new_steps = list(self._pending), 0
        if not items:
            return
        try:
            if self._logged is None:
                self._logged = logged_steps(self.client, self.run_id, self._mine)
            fresh = [m for m in items if m.step not in self._logged.get(m.key, ())]
            for i in range(0, len(fresh), 1000):  # MLflow's log_batch takes at most 1,000 metrics
                if self._abandoned:
                    return
                chunk = fresh[i:i + 1000]
                self.client.log_batch(self.run_id, metrics=chunk)
                for m in chunk:  # a retry after a later chunk failed must not send these again
                    self._logged.setdefault(m.key, set()).add(m.step)
                self.sent += len(chunk)
        except Exception as e:  # noqa: BLE001 - MLflow down must not stop training: keep, retry, warn once
            if not self._warned:
                _log.warning("MLflow run %s unreachable (%s): per-step metrics are kept and retried every %gs; "
                             "training goes on", self.run_id, text_without_credentials(str(e))[:300], self.every_s)
            self._failing = self._warned = True
            return
        if self._failing:
            _log.warning("MLflow run %s reachable again: buffered per-step metrics sent", self.run_id)
            self._failing = False
        with self._lock:
            del self._pending[:len(items)]

    def close(self) -> None:
        """Send what is left (waiting at most `close_timeout_s`); warn about anything that could not be."""
        self._stop = True
        self._wake.set()
        self._thread.join(self.close_timeout_s)
        self._abandoned = self._thread.is_alive()
        if self._pending:
            steps = len({m.step for m in self._pending})
            _log.warning("%d per-step metric values (%d steps) did not reach MLflow run %s; steps.parquet keeps "
                         "them and recording the run logs them", len(self._pending), steps, self.run_id)


class Tracker:
    """A thin, explicit MLflow client bound to one tracking URI and experiment.

    `common` tags (see `common_tags`) go on every run this Tracker starts."""

    def __init__(self, experiment: str, tracking_uri: str | None = None, common: dict[str, Any] | None = None):
        import mlflow
        from mlflow.tracking import MlflowClient

        # Against a server, MlflowClient prints "View run … at <tracking URI>" to *stdout* when a run
        # ends: that breaks `--json` output and would print credentials kept in the URI.
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        self.tracking_uri = settings.mlflow_tracking_uri(tracking_uri)
        # mlflow.set_tracking_uri also exports MLFLOW_TRACKING_URI into this process's environment, which
        # every process started later inherits (a Prefect worker, a stage process, another test's stack)
        # and would then log to this store instead of its own. Keep the environment as it was.
        before = os.environ.get("MLFLOW_TRACKING_URI")
        mlflow.set_tracking_uri(self.tracking_uri)
        if before is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = before
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        exp = self.client.get_experiment_by_name(experiment)
        if exp is None:
            location = None
            if self.tracking_uri.startswith("sqlite:"):
                # MLflow's default artifact root for a sqlite store is ./mlruns in the cwd: keep it in RLVR_HOME.
                location = (settings.paths().mlflow_artifacts / experiment).as_uri()
            # Against a server no location is given: the server picks its own (with --serve-artifacts,
            # `mlflow-artifacts:/…`, so uploads go through its proxy to the bucket).
            try:
                self.experiment_id = self.client.create_experiment(
                    experiment, artifact_location=location, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
            except Exception:  # created concurrently by another process
                exp = self.client.get_experiment_by_name(experiment)
                if exp is None:
                    raise
        if exp is not None:
            self.experiment_id = exp.experiment_id
            self._mark_experiment_kind(exp.tags.get(EXPERIMENT_KIND_TAG))
        self._ensure_runs_view(exp.tags if exp is not None else {})
        self.experiment = experiment
        self.common: dict[str, str] = {k: "" if v is None else str(v) for k, v in (common or {}).items()}
        self._runs: list[str] = []  # runs started here, so late common tags reach all of them

    def _ensure_runs_view(self, tags: dict[str, str]) -> None:
        """The experiment's "rlvr: runs (no stage runs)" view, saved once (a view a person edited stays)."""
        if VIEW_TAG_PREFIX + RUNS_VIEW_ID not in tags:
            self.save_view(RUNS_VIEW_ID, saved_view(
                "rlvr: runs (no stage runs)", search_filter=NO_STAGE_RUNS,
                sections={"Training curves": ("LINE", list(TRAINING_CURVES))}))

    def save_view(self, view_id: str, value: str) -> None:
        """Save a runs view (`saved_view`) on the experiment; the UI lists it under "Views" (`view_url` opens it)."""
        try:
            self.client.set_experiment_tag(self.experiment_id, VIEW_TAG_PREFIX + view_id, value)
        except Exception as e:  # noqa: BLE001 - cosmetic (e.g. a read-only user): the runs are what matter
            _log.info("could not save MLflow view %s: %s", view_id, text_without_credentials(str(e))[:200])

    def set_primary_metric(self, key: str, greater_is_better: bool = True) -> None:
        """Name the metric runs are judged by (MLflow's experiment tag; a sweep sets its pivot metric)."""
        try:
            self.client.set_experiment_tag(self.experiment_id, PRIMARY_METRIC_TAG, key)
            self.client.set_experiment_tag(self.experiment_id, GREATER_IS_BETTER_TAG, str(greater_is_better).lower())
        except Exception as e:  # noqa: BLE001 - cosmetic, like the views
            _log.info("could not set the primary metric: %s", text_without_credentials(str(e))[:200])

    def _mark_experiment_kind(self, current: str | None) -> None:
        """Tag an existing experiment "machine learning" (runs view) unless someone chose a kind: no tag, or
        one MLflow only inferred (`*_inferred`, `no_inferred_type`), is replaced."""
        if current and "inferred" not in current:
            return
        try:
            self.client.set_experiment_tag(self.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        except Exception as e:  # noqa: BLE001 - cosmetic (e.g. a read-only user): the runs are what matter
            _log.info("could not tag experiment %s as machine learning: %s", self.experiment_id,
                      text_without_credentials(str(e))[:200])

    @property
    def display_uri(self) -> str:
        """The tracking URI without any password in it: safe to print and record."""
        return redact_url(self.tracking_uri)

    def start_run(self, name: str, tags: dict[str, Any], parent_run_id: str | None = None,
                  start_time_ms: int | None = None) -> str:
        """A run with the common tags (and `tags`); `start_time_ms`: when its work began, if before now."""
        t = {**self.common, **{k: str(v) for k, v in tags.items() if v is not None}}
        if parent_run_id:
            t["mlflow.parentRunId"] = parent_run_id
        run_id = self.client.create_run(self.experiment_id, run_name=name, tags=t, start_time=start_time_ms).info.run_id
        self._runs.append(run_id)
        return run_id

    def adopt(self, run_id: str) -> None:
        """Treat a run started elsewhere (e.g. by another process, or found again on a relaunch) as one of
        this Tracker's: its common tags go on it, now and when `add_common_tags` adds more."""
        if self.common:
            self.set_tags(run_id, self.common)
        self._runs.append(run_id)

    def add_common_tags(self, **tags: Any) -> None:
        """A common tag that became known mid-pipeline (e.g. `dataset_hash` after the data stage):
        set it on every run started so far and on every later one."""
        new = {k: "" if v is None else str(v) for k, v in tags.items()}
        self.common.update(new)
        for run_id in self._runs:
            self.set_tags(run_id, new)

    @contextlib.contextmanager
    def child_run(self, parent_run_id: str, stage: str, *, params: dict[str, Any] | None = None,
                  tags: dict[str, Any] | None = None, name: str | None = None) -> Iterator[str]:
        """A stage of a pipeline as a child run: yields its id; ends FINISHED, or FAILED on an exception.

        The stage's time is logged as `time/<stage>_s` on the child. A relaunched pipeline run (a trial found
        again by `tasks.stages.open_run`) finds the run its stage had (same parent, same name) and goes on in
        it, so the trial keeps one run per stage in MLflow's table, not one more per launch."""
        name = name or stage
        stage_tags = {KIND_TAG: "stage", STAGE_TAG: stage, **(tags or {})}
        run_id = self._stage_run(parent_run_id, name)
        if run_id is None:
            run_id = self.start_run(name, stage_tags, parent_run_id=parent_run_id)
        else:
            self.set_tags(run_id, {**self.common, **stage_tags})
            self.client.update_run(run_id, status="RUNNING")
            self._runs.append(run_id)
            params = _new_params(self.client.get_run(run_id).data.params, params)  # MLflow params are write-once
        if params:
            self.log_params(run_id, params)
        t0 = time.monotonic()
        try:
            yield run_id
        except BaseException:
            self.end_run(run_id, "FAILED")
            raise
        self.log_metrics(run_id, {f"time/{stage}_s": time.monotonic() - t0})
        self.end_run(run_id, "FINISHED")

    def _stage_run(self, parent_run_id: str, name: str) -> str | None:
        """The stage run named `name` under this parent, if an earlier launch of the parent started one."""
        found = self.client.search_runs(
            [self.experiment_id], f"tags.mlflow.parentRunId = '{parent_run_id}' and tags.{KIND_TAG} = 'stage' "
                                  f"and attributes.run_name = '{name}'", max_results=1)
        return found[0].info.run_id if found else None

    @contextlib.contextmanager
    def system_metrics(self, run_id: str, sampling_interval: float = 10.0) -> Iterator[None]:
        """Sample CPU/memory/disk/network (and GPU, when present) into `run_id` as `system/*`.

        MLflow's monitor takes an explicit run id and tracking URI, so it works with client-created
        runs; MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL overrides the interval. Off with
        RLVR_SYSTEM_METRICS=0. A run shorter than one interval records nothing."""
        if not settings.system_metrics_enabled():
            yield
            return
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)  # start/stop INFO lines are noise
        monitor = SystemMetricsMonitor(run_id, sampling_interval=sampling_interval, tracking_uri=self.tracking_uri)
        monitor.start()
        try:
            yield
        finally:
            monitor.finish()

    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k[:250], _param_str(v)) for k, v in sorted(redact(params).items())]
        for i in range(0, len(items), 100):  # MLflow's batch limit is 100 params
            self.client.log_batch(run_id, params=items[i:i + 100])

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
        """Log metrics named by the conventions (`metric_key` validates each name; `@` → `_at_`)."""
        self._log_batches(run_id, _metric_items(metrics, step))

    def log_step_rows(self, run_id: str, rows: list[dict[str, Any]], prefix: str = "train/") -> int:
        """Per-step metric rows (the trainer's steps.parquet) at their own step (`step_items`), except the
        (key, step) pairs the run already holds: those a `StepMetricsSink` sent during training, or an
        earlier record of the same run. So this is the backfill after live logging (nothing, when it all
        arrived) and safe to repeat. The values go out in batches of 1,000 (MLflow's log_batch limit),
        stamped with the time of this call (steps.parquet holds no wall-clock time). Returns the number
        of values logged."""
        items = [m for row in rows for m in step_items(row, prefix)]
        logged = logged_steps(self.client, run_id, lambda k: k.startswith(prefix) or k.startswith("health/"))
        items = [m for m in items if m.step not in logged.get(m.key, ())]
        self._log_batches(run_id, items)
        return len(items)

    def _log_batches(self, run_id: str, items: list) -> None:
        for i in range(0, len(items), 1000):  # MLflow's log_batch takes at most 1,000 metrics
            self.client.log_batch(run_id, metrics=items[i:i + 1000])

    def set_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        for k, v in tags.items():
            if v is not None:
                self.client.set_tag(run_id, k, redact(str(v), k))

    def log_artifact(self, run_id: str, local: str | Path, artifact_path: str | None = None) -> None:
        p = Path(local)
        if p.is_dir():
            self.client.log_artifacts(run_id, str(p), artifact_path)
        else:
            self.client.log_artifact(run_id, str(p), artifact_path)

    def end_run(self, run_id: str, status: str = "FINISHED") -> None:
        self.client.set_terminated(run_id, status)

    def _ui_path(self, path: str, query: str = "") -> str:
        parts = urlsplit(self.tracking_uri)
        base = urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1])) if parts.scheme else self.tracking_uri
        return f"{base}#/experiments/{self.experiment_id}{path}{UI_QUERY}{query}"

    def experiment_url(self) -> str:
        """The experiment's runs table in the MLflow UI (a server); no credentials in it. `UI_QUERY` makes
        MLflow 3 open the runs, not its GenAI traces page."""
        return self._ui_path("")

    def view_url(self, view_id: str = RUNS_VIEW_ID, charts: bool = True) -> str:
        """The experiment's runs page in a saved view (`save_view`), as charts or as the table; no credentials."""
        url = self._ui_path("/runs", f"&viewStateShareKey={quote(view_id)}&compareRunsMode="
                                     + ("CHART" if charts else "TABLE"))
        return url.replace("#/", "/#/", 1) if url.startswith(("http://", "https://")) and "/#/" not in url else url

    def compare_url(self, run_ids: list[str]) -> str:
        """MLflow's compare view of these runs (params side by side, parallel coordinates); no credentials."""
        runs, exps = quote(json.dumps(sorted(run_ids))), quote(json.dumps([self.experiment_id]))
        base = self._ui_path("").split("#", 1)[0]
        base += "/" if base.startswith(("http://", "https://")) and not base.endswith("/") else ""
        return base + f"#/compare-runs?runs={runs}&experiments={exps}" + UI_QUERY.replace("?", "&")

    def run_url(self, run_id: str) -> str:
        """The run's page in the MLflow UI (a server), or its place in the store; no credentials in it."""
        return self._ui_path(f"/runs/{run_id}")
