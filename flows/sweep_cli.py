"""The Prefect side of `rlvr sweep run|status` (rlvr_cli/sweep.py imports this lazily: rlvr_core itself
never imports Prefect).

Everything goes through the Prefect API at PREFECT_API_URL, so it works against a remote team server as
well as `rlvr stack up`:
- `submit`: a flow run of the `ablation-sweep/...` deployment with the validated sweep as its parameter;
- `snapshot`: the sweep's flow run, and its trial flow runs (children of its `trial` tasks), each with its
  state and, when it failed, its error in one line;
- `results`: what the finished flow left as artifacts (flows/ablation_sweep.py `_aggregate`): the pivot
  rows, the MLflow parent run link and the sweep's folder in the artifact store.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (ArtifactFilter, ArtifactFilterFlowRunId, FlowFilter, FlowFilterName,
                                            FlowRunFilter, FlowRunFilterParentFlowRunId)
from prefect.client.schemas.sorting import FlowRunSort
from prefect.exceptions import ObjectNotFound
from prefect.settings import get_current_settings

from flows.sealed import sealed_parameters
from rlvr_core.pipeline.sweeps import one_line_error

FLOW = "ablation-sweep"
# Row fields of the pivot artifact besides the swept keys (rlvr_core.pipeline.sweeps.pivot_rows).
PIVOT_FIELDS = ("n_seeds", "mean", "ci_low", "ci_high", "ci", "per_seed", "seeds", "trials")


class SweepCliError(RuntimeError):
    """A user-facing problem (no server, no deployment, no such run): printed as one line, exit 2."""


def api_url() -> str:
    url = get_current_settings().api.url
    if not url:
        raise SweepCliError("PREFECT_API_URL is not set: start the stack (`rlvr stack up`, then "
                            "`eval \"$(rlvr stack env)\"`) or point it at your Prefect server")
    return str(url)


def ui_url(flow_run_id: Any) -> str:
    return f"{api_url().removesuffix('/').removesuffix('/api')}/runs/flow-run/{flow_run_id}"


def _client():
    api_url()  # never fall back to a temporary in-process server: the sweep would run nowhere
    return get_client(sync_client=True)


def submit(name: str, parameters: dict[str, Any], deployments: list[str]) -> tuple[Any, str]:
    """A flow run of the first of `deployments` that exists; (flow run, deployment name)."""
    with _client() as client:
        for dep_name in dict.fromkeys(deployments):
            try:
                dep = client.read_deployment_by_name(dep_name)
            except ObjectNotFound:
                continue
            fr = client.create_flow_run_from_deployment(dep.id, parameters=sealed_parameters(parameters), name=name)
            return fr, dep_name
    raise SweepCliError(f"no deployment {' or '.join(dict.fromkeys(deployments))} on {api_url()}: deploy "
                        f"infra/prefect/prefect.yaml (`rlvr stack up` does)")


@dataclass
class TrialRun:
    key: str            # "t03", or "shared" for the shared-stages run
    label: str          # what differs ("loss_agg=token-mean lr=1e-05 seed=0")
    state: str          # "COMPLETED", "RUNNING", … ("RETRYING" shows as the state name)
    error: str = ""     # one line, when it failed
    run_id: str = ""    # its flow run (tells apart the shared-stages runs of a sweep with several settings)

    @property
    def ident(self) -> str:
        return self.key if self.key != "shared" else f"shared-{self.run_id}"


@dataclass
class Snapshot:
    flow_run: Any
    trials: list[TrialRun] = field(default_factory=list)

    @property
    def final(self) -> bool:
        return self.flow_run.state is not None and self.flow_run.state.is_final()

    @property
    def state(self) -> str:
        return self.flow_run.state.name if self.flow_run.state else "?"

    @property
    def error(self) -> str:
        st = self.flow_run.state
        return one_line_error(st.message) if st is not None and not st.is_completed() and st.is_final() else ""


def _trial(fr: Any) -> TrialRun:
    p = fr.parameters or {}
    if p.get("stop_after") == "curriculum":
        key, label = "shared", "data, base model, pass-rate table, curriculum"
    else:
        key, label = p.get("trial_id") or fr.name, p.get("trial_label") or ""
    st = fr.state
    failed = st is not None and st.is_final() and not st.is_completed()
    return TrialRun(key, label, st.name if st else "?", one_line_error(st.message) if failed else "", str(fr.id))


def snapshot(flow_run_id: UUID | str) -> Snapshot:
    with _client() as client:
        fr = client.read_flow_run(UUID(str(flow_run_id)))
        kids = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[fr.id])), sort=FlowRunSort.EXPECTED_START_TIME_ASC)
    # A relaunched trial (lost worker) has several runs: the latest one speaks for it.
    latest: dict[str, TrialRun] = {}
    for k in kids:
        t = _trial(k)
        latest[t.ident] = t
    return Snapshot(fr, sorted(latest.values(), key=lambda t: (t.key != "shared", t.key)))


def find_sweep_run(ref: str | None) -> Any:
    """A sweep's flow run by id, by flow-run name, by sweep id (`demo-lr-1a2b3c4d`) or by sweep name (the latest)."""
    with _client() as client:
        if ref is None:
            return _latest(client, None)
        try:
            uid = UUID(ref)
        except ValueError:
            uid = None
        if uid is not None:
            try:
                return client.read_flow_run(uid)
            except ObjectNotFound:
                raise SweepCliError(f"no flow run {ref} on {api_url()}") from None
        found = _latest(client, ref)
    if found is None:
        raise SweepCliError(f"no {FLOW} flow run named {ref!r} on {api_url()} (try `rlvr sweep status` for the latest)")
    return found


def _sweep_name(fr: Any) -> str:
    s = (fr.parameters or {}).get("sweep")
    return s.get("name", "") if isinstance(s, dict) else str(s or "")


def _latest(client: Any, ref: str | None) -> Any:
    runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[FLOW])),
                                 sort=FlowRunSort.EXPECTED_START_TIME_DESC, limit=200)
    for fr in runs:
        sweep_id = f"{_sweep_name(fr)}-{str(fr.id)[:8]}"
        if ref is None or ref in (fr.name, _sweep_name(fr), sweep_id) or str(fr.id).startswith(ref):
            return fr
    if ref is None:
        raise SweepCliError(f"no {FLOW} flow runs on {api_url()} yet")
    return None


class WatchLines:
    """What `watch` prints for each snapshot: the sweep's state when it changes, and a line per trial whose
    state changed. A trial's first Completed line carries the number of trials completed so far, counted
    line by line: trials that finish between two polls get 3 and 4, not 4 twice."""

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}
        self.completed: set[str] = set()

    def lines(self, snap: Snapshot, clock: str) -> list[str]:
        out = []
        if self.seen.get("sweep") != snap.state:
            self.seen["sweep"] = snap.state
            out.append(f"{clock} sweep {snap.flow_run.name}: {snap.state}")
        for t in snap.trials:
            if self.seen.get(t.ident) == t.state:
                continue
            self.seen[t.ident] = t.state
            count = ""
            if t.state == "Completed" and t.key != "shared" and t.key not in self.completed:
                self.completed.add(t.key)
                n = len(self.completed)
                count = f"  [{n} trial{'s' if n > 1 else ''} done]"
            out.append(f"{clock}   {t.key:<6} {t.label}: {t.state}{count}" + (f" — {t.error}" if t.error else ""))
        return out


def watch(flow_run_id: UUID | str, echo: Callable[[str], None], poll_s: float = 2.0) -> Snapshot:
    """Poll until the sweep's flow run is final, echoing each change of the sweep's or a trial's state."""
    printer = WatchLines()
    while True:
        snap = snapshot(flow_run_id)
        for line in printer.lines(snap, time.strftime("%H:%M:%S")):
            echo(line)
        if snap.final:
            return snap
        time.sleep(poll_s)


_LINK = re.compile(r"^\[(?P<text>.*)\]\((?P<url>.*)\)$", re.S)


def results(flow_run_id: UUID | str) -> dict[str, Any]:
    """The finished sweep's artifacts: pivot rows, swept keys, metric, MLflow parent link, artifact folder."""
    with _client() as client:
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[UUID(str(flow_run_id))])))
    out: dict[str, Any] = {"rows": None, "swept_keys": [], "metric": "accuracy_greedy", "mlflow": None, "artifacts": None,
                           "compare": None}
    for a in arts:
        key = a.key or ""
        if a.type == "table" and key.startswith("sweep-"):
            rows = json.loads(a.data) if isinstance(a.data, str) else a.data
            out["rows"] = rows
            out["swept_keys"] = [k for k in (rows[0] if rows else {}) if k not in PIVOT_FIELDS]
            m = re.search(r"mean (\S+) by cell", a.description or "")
            out["metric"] = m.group(1) if m else out["metric"]
            if not rows and (s := re.search(r"swept: (.*)$", a.description or "")):
                out["swept_keys"] = [k.strip() for k in s.group(1).split(",") if k.strip()]
        elif key.endswith(("-mlflow", "-artifacts", "-compare")) and (m := _LINK.match(str(a.data).strip())):
            out[key.rsplit("-", 1)[1]] = m.group("url")
    return out
