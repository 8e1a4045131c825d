"""Rollouts (and wrong evaluation samples) as MLflow traces on the run (docs/tracking.md, "Rollout traces").

A researcher reads samples at step N with their rewards and verdicts; MLflow's Traces tab is where its UI shows
such records. `TraceSink` is the trainer's `on_rollouts` hook (and the periodic evaluation's `on_samples`): on a
traced step (`traced_reason`: the evaluation steps by default, and a step a guard flagged, at most once per guard
per `flagged_cooldown` steps) it copies the first `tracking.traces.groups_per_step` trained groups into plain
records (prompt, each completion with its reward, verifier status and detail, length, finish reason, weight
version) and hands them to a background thread that writes one trace per group:

    rollout group (CHAIN)   inputs: prompt, prompt id, gold   outputs: one row per completion
      ├ sample (LLM)        the step's generation phase        outputs: completions, lengths, finish reasons
      │ └ turn k · sample i (LLM)      a multi-turn trajectory's model turn (when its engine call ran)
      │   └ tool <name> (TOOL)         the call it made: argument in, answer and error out
      └ verify (EVALUATOR)  the step's verification phase      outputs: status, reward, detail, extracted

Traces carry searchable tags (`rlvr.kind` rollout|eval, `step`, `prompt_id`, `reward_mean`, `n_correct`,
`flagged`) and the run in `mlflow.sourceRun`, so `MlflowClient().search_traces(locations=[exp], run_id=run,
filter_string="tags.step = '40'")` finds them. Records are copied on the training thread (a few dicts); building
and sending the traces happens on the sink's thread, so the trainer never waits for MLflow. Traces are written
with MLflow's tracing store API for the run's own tracking URI (no process-wide tracing destination), and pass
through `redact` like every other record.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import queue
import threading
import time
from typing import Any

from rlvr_core.core import settings
from rlvr_core.data import gold_of
from rlvr_core.records.redact import redact, redact_text, text_without_credentials

__all__ = ["TraceSink", "traced_reason", "fresh_flags", "group_records", "eval_records", "trace_entities",
           "preview_heading"]

_log = logging.getLogger("rlvr.tracking")
KIND_TAG = "rlvr.kind"  # rollout | eval


def traced_reason(policy: Any, step: int, last_step: int, eval_interval: int, flagged: list[str]) -> str | None:
    """Why step `step` (1-based) is traced, or None: 'flagged' (a guard flagged it and `policy.flagged`),
    'eval' (an evaluation step under every='eval'), 'every' (every N steps, and the last)."""
    if not policy.enabled:
        return None
    if flagged and policy.flagged:
        return "flagged"
    if policy.every == "eval":
        return "eval" if (eval_interval and step % eval_interval == 0) or step == last_step else None
    n = int(policy.every)
    return "every" if n and (step % n == 0 or step == last_step) else None


def fresh_flags(last_traced: dict[str, int], step: int, flagged: list[str], policy: Any) -> list[str]:
    """The guards among `flagged` whose last fully traced step (`last_traced`, updated here) lies
    `policy.flagged_cooldown` or more steps back: the step is traced in full for them. A guard that flags many
    steps in a row (G-kl-explosion's per-step flag on a drifting policy) would otherwise trace every group of each."""
    cooldown = policy.flagged_cooldown
    fresh = [g for g in flagged if not cooldown or step - last_traced.get(g, -cooldown) >= cooldown]
    if policy.enabled and policy.flagged:
        last_traced.update((g, step) for g in fresh)
    return fresh


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"… [{len(text) - limit} more characters]"


def group_records(row: dict, rollouts: Any, *, n_groups: int | None, max_chars: int) -> list[dict]:
    """Plain records of the first `n_groups` trained groups this rank holds (None = all), from a step's row of
    steps.parquet and its RolloutBatch: what the trace of each group shows."""
    step = int(row["step"])
    fallback = rollouts.version if rollouts.version is not None else step - 1  # the sampling weights' version: updates they had
    out = []
    for j in rollouts.selected:
        g = rollouts.local.get(j)
        if g is None:
            continue
        if n_groups is not None and len(out) >= n_groups:
            break
        comps = [{"sample_index": x.sample_index, "completion": _cut(x.text, max_chars), "reward": float(o.reward),
                  "status": o.status.value, "detail": o.detail, "extracted": o.extracted, "length": len(x.token_ids),
                  "finish_reason": x.finish_reason,
                  "weight_version": x.weight_version if x.weight_version is not None else fallback,
                  **({"turns": _turns(x.env["turn_log"], max_chars)} if x.env and x.env.get("turn_log") else {})}
                 for x, o in zip(g.samples, g.outcomes)]
        out.append({"kind": "rollout", "step": step, "prompt_id": g.row["id"], "position": g.position,
                    "prompt": _cut(g.prompt, max_chars), "gold": str(gold_of(g.row)), "completions": comps})
    return out


def _turns(turn_log: list[dict], max_chars: int) -> list[dict]:
    """A trajectory's turn log (rlvr_core/environments/loop.py) with its texts cut, for the turn and tool spans."""
    out = []
    for t in turn_log:
        turn = {**t, "text": _cut(t["text"], max_chars)}
        if t.get("call"):
            turn["call"] = {**t["call"], "argument": _cut(str(t["call"]["argument"] or ""), max_chars),
                            "observation": _cut(str(t["call"]["observation"] or ""), max_chars)}
        out.append(turn)
    return out


def _turn_spans(trace_id: str, tid: bytes, parent: str, comps: list[dict]) -> list:
    """One span per model turn of each multi-turn completion (under `sample`), a child span per tool call."""
    spans = []
    for c in comps:
        for t in c.get("turns", ()):
            turn_id = base64.b64encode(os.urandom(8)).decode()
            spans.append(_span(trace_id, tid, turn_id, parent, f"turn {t['turn']} · sample {c['sample_index']}",
                               "LLM", tuple(t["ns"]), {"sample_index": c["sample_index"], "turn": t["turn"]},
                               {"text": t["text"], "tokens": t["tokens"]}))
            call = t.get("call")
            if call:
                spans.append(_span(trace_id, tid, base64.b64encode(os.urandom(8)).decode(), turn_id,
                                   f"tool {call['tool']}", "TOOL", tuple(call["ns"]), {"argument": call["argument"]},
                                   {"observation": call["observation"], "error": call["error"]}))
    return spans


def eval_records(samples: list[dict], problems: list[dict], *, step: int, limit: int, max_chars: int) -> list[dict]:
    """The first `limit` wrong greedy samples of a periodic evaluation (rows as in samples.parquet), one
    record each, with the problem's question."""
    question = {p["id"]: p.get("question", "") for p in problems}
    wrong = [s for s in samples if s.get("greedy") and s["status"] != "correct"][:limit]
    return [{"kind": "eval", "step": step, "prompt_id": s["problem_id"],
             "prompt": _cut(str(question.get(s["problem_id"], "")), max_chars), "gold": "",
             "completions": [{"sample_index": s["sample_index"], "completion": _cut(s["response"], max_chars),
                              "reward": float(s["reward"]), "status": s["status"], "detail": "",
                              "extracted": s["extracted"], "length": s["length"],
                              "finish_reason": s["finish_reason"], "weight_version": step}]} for s in wrong]


def _sealed(value: Any) -> Any:
    """`redact` (values under secret-named keys, URL passwords), and URL passwords inside free text, as the run
    record masks its tables (the warehouse's rollout rows)."""
    if isinstance(value, dict):
        return {k: _sealed(v) for k, v in redact(value).items()}
    if isinstance(value, list):
        return [_sealed(v) for v in value]
    return redact_text(value) if isinstance(value, str) else value


def _span(trace_id: str, tid: bytes, span_id: str, parent: str | None, name: str, kind: str, t: tuple[int, int],
          inputs: Any, outputs: Any, experiment_id: str | None = None) -> Any:
    from mlflow.entities import Span

    attrs = {"mlflow.traceRequestId": trace_id, "mlflow.spanType": kind, "mlflow.spanInputs": inputs,
             "mlflow.spanOutputs": outputs}
    if experiment_id is not None:
        attrs["mlflow.experimentId"] = experiment_id
    return Span.from_dict({
        "trace_id": base64.b64encode(tid).decode(), "span_id": span_id, "parent_span_id": parent, "name": name,
        "start_time_unix_nano": t[0], "end_time_unix_nano": t[1], "events": [], "links": [],
        "status": {"code": "STATUS_CODE_OK", "message": ""},
        "attributes": {k: json.dumps(v, default=str) for k, v in attrs.items()}})


def trace_entities(rec: dict, *, experiment_id: str, run_id: str, phases: dict[str, tuple[int, int]],
                   flagged: str = "") -> tuple[Any, list]:
    """(TraceInfo, spans) of one record; `phases`: ns intervals of 'step', 'sample' and 'verify'."""
    from mlflow.entities import TraceInfo, TraceLocation, TraceState

    rec = _sealed(rec)
    tid = os.urandom(16)
    trace_id = "tr-" + tid.hex()
    root, s_sample, s_verify = (base64.b64encode(os.urandom(8)).decode() for _ in range(3))
    comps = rec["completions"]
    rewards = [c["reward"] for c in comps]
    inputs = {"prompt": rec["prompt"], "prompt_id": rec["prompt_id"], "step": rec["step"], "gold": rec["gold"]}
    name = f"{rec['kind']} step {rec['step']} {rec['prompt_id']}"
    spans = [
        _span(trace_id, tid, root, None, name, "CHAIN", phases["step"], inputs,
              [{k: v for k, v in c.items() if k != "turns"} for c in comps], experiment_id),
        _span(trace_id, tid, s_sample, root, "sample", "LLM", phases["sample"], {"prompt": rec["prompt"]},
              [{k: c[k] for k in ("sample_index", "completion", "length", "finish_reason", "weight_version")}
               for c in comps]),
        _span(trace_id, tid, s_verify, root, "verify", "EVALUATOR", phases["verify"],
              {"completions": [c["completion"] for c in comps], "gold": rec["gold"]},
              [{k: c[k] for k in ("sample_index", "status", "reward", "detail", "extracted")} for c in comps]),
        *_turn_spans(trace_id, tid, s_sample, comps),
    ]
    t0, t1 = phases["step"]
    tags = {"mlflow.traceName": name, KIND_TAG: rec["kind"], "step": str(rec["step"]), "prompt_id": rec["prompt_id"],
            "reward_mean": f"{sum(rewards) / max(len(rewards), 1):.4f}",
            "n_correct": str(sum(c["status"] == "correct" for c in comps)), "n_completions": str(len(comps)),
            "flagged": flagged}
    info = TraceInfo(trace_id=trace_id, trace_location=TraceLocation.from_experiment_id(experiment_id),
                     request_time=t0 // 1_000_000, state=TraceState.OK, execution_duration=(t1 - t0) // 1_000_000,
                     request_preview=preview_heading(rec) + rec["prompt"][:1000],
                     response_preview=json.dumps({"rewards": rewards, "statuses": [c["status"] for c in comps]})[:1000],
                     trace_metadata={"mlflow.sourceRun": run_id, "mlflow.trace_schema.version": "3"}, tags=tags)
    return info, spans


def preview_heading(rec: dict) -> str:
    """What the trace's "Request" starts with: its kind, step and prompt id. MLflow 3.17's traces table shows
    Trace ID, Request, Response, Execution time and State by default (the tags are columns a user must pick),
    so the Request column is where every row says whether it is a rollout or an evaluation sample, and of
    which step; sorted by Request, the eval rows sit apart from the rollout rows."""
    return f"[{rec['kind']} step {rec['step']} {rec['prompt_id']}] "


def _log_trace(client: Any, experiment_id: str, info: Any, spans: list) -> None:
    """One trace into the store: its spans, then its info (as MLflow's own exporter does); a store that keeps
    no spans (file store) gets them as the trace's data artifact."""
    from mlflow.entities import TraceData

    try:
        client.log_spans(experiment_id, spans)
    except NotImplementedError:
        pass
    returned = client.start_trace(info)
    if returned.tags.get("mlflow.trace.spansLocation") != "TRACKING_STORE":
        client._upload_trace_data(returned, TraceData(spans=spans))


class TraceSink:
    """The trainer's `on_rollouts(row, rollouts)` and the periodic evaluation's `on_samples(samples, problems)`:
    traced steps' groups and wrong evaluation samples → traces on run `run_id`, written by a background thread.

    `policy`: the `tracking.traces` section; `last_step`, `eval_interval`: the training's (grpo.steps,
    `GRPOConfig.eval_interval()`). MLflow unreachable: the trace is dropped (the warehouse holds the rollouts),
    warned once; training goes on. `close()` waits at most `close_timeout_s` for the queue."""

    def __init__(self, run_id: str, tracking_uri: str | None, policy: Any, *, last_step: int, eval_interval: int,
                 close_timeout_s: float = 60.0):
        self.run_id, self.policy, self.last_step, self.eval_interval = run_id, policy, last_step, eval_interval
        self.tracking_uri = settings.mlflow_tracking_uri(tracking_uri)
        self.close_timeout_s = close_timeout_s
        self.sent = self.dropped = 0
        self.cpu_s = 0.0  # CPU time the sink's thread spent building and writing traces (what it takes from training)
        self._eval: list[tuple[list[dict], list[dict], int, int]] = []  # evaluations waiting for their step's row
        self._queue: queue.Queue = queue.Queue()
        self._warned = False
        self._flag_traced: dict[str, int] = {}  # guard -> the last step traced in full for its flag
        self._thread = threading.Thread(target=self._loop, name="mlflow-traces", daemon=True)
        self._thread.start()

    def on_samples(self, samples: list[dict], problems: list[dict], t_start_ns: int) -> None:
        """A periodic evaluation's samples (rows as in samples.parquet); traced with the step whose row comes next."""
        if self.policy.enabled and self.policy.eval_wrong:
            self._eval.append((samples, problems, t_start_ns, time.time_ns()))

    def __call__(self, row: dict, rollouts: Any) -> None:
        step, now = int(row["step"]), time.time_ns()
        flagged = sorted(k.removeprefix("health/") for k, v in row.items() if k.startswith("health/") and v)
        pending, self._eval = self._eval, []
        for samples, problems, t0, t1 in pending:
            recs = eval_records(samples, problems, step=step, limit=self.policy.eval_wrong,
                                max_chars=self.policy.max_chars)
            self._queue.put((recs, {"step": (t0, t1), "sample": (t0, t1), "verify": (t1, t1)}, ""))
        fresh = fresh_flags(self._flag_traced, step, flagged, self.policy)
        reason = traced_reason(self.policy, step, self.last_step, self.eval_interval, fresh)
        if reason is None:
            return
        recs = group_records(row, rollouts, n_groups=None if reason == "flagged" else self.policy.groups_per_step,
                             max_chars=self.policy.max_chars)
        ns = {k: int(row.get(f"t_{k}_s", 0.0) * 1e9) for k in ("rollout", "reward", "train")}
        start = now - sum(ns.values())
        phases = {"step": (start, now), "sample": (start, start + ns["rollout"]),
                  "verify": (start + ns["rollout"], start + ns["rollout"] + ns["reward"])}
        self._queue.put((recs, phases, ",".join(flagged)))

    def _loop(self) -> None:
        client = experiment_id = None
        while (item := self._queue.get()) is not None:
            recs, phases, flagged = item
            cpu0 = time.thread_time()
            try:
                if client is None:
                    from mlflow.tracing.client import TracingClient
                    from mlflow.tracking import MlflowClient

                    experiment_id = MlflowClient(self.tracking_uri).get_run(self.run_id).info.experiment_id
                    client = TracingClient(self.tracking_uri)
                for rec in recs:
                    info, spans = trace_entities(rec, experiment_id=experiment_id, run_id=self.run_id, phases=phases,
                                                 flagged=flagged)
                    _log_trace(client, experiment_id, info, spans)
                    self.sent += 1
            except Exception as e:  # noqa: BLE001 - MLflow down must not stop training; the warehouse has the rows
                self.dropped += len(recs)
                if not self._warned:
                    _log.warning("rollout traces for MLflow run %s not written (%s); training goes on",
                                 self.run_id, text_without_credentials(str(e))[:300])
                    self._warned = True
            self.cpu_s += time.thread_time() - cpu0

    def __enter__(self) -> "TraceSink":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(self.close_timeout_s)
        if self._thread.is_alive() or self.dropped:
            _log.warning("rollout traces: %d written, %d dropped, %s", self.sent, self.dropped,
                         "still writing" if self._thread.is_alive() else "done")
