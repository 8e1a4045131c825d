"""What `rlvr sweep run --watch` prints as a sweep's trials change state (flows/sweep_cli.py `WatchLines`), fed
with real Prefect flow-run objects as the API returns them (no server needed: the polling itself runs against
a real stack in tests/flows/test_stack_e2e.py)."""

from __future__ import annotations

import re
import uuid

from prefect.client.schemas.objects import FlowRun, State, StateType

from flows.sweep_cli import Snapshot, WatchLines, _trial

SWEEP = FlowRun(name="sweep-run", flow_id=uuid.uuid4(), state=State(type=StateType.RUNNING, name="Running"))
STATES = {"Pending": StateType.PENDING, "Running": StateType.RUNNING, "Completed": StateType.COMPLETED}


def _runs(states: dict[str, str]) -> list[FlowRun]:
    ids = {k: uuid.UUID(int=i + 1) for i, k in enumerate(["shared", "t00", "t01", "t02", "t03"])}
    out = []
    for key, name in states.items():
        params = {"stop_after": "curriculum"} if key == "shared" else {"trial_id": key, "trial_label": f"lr=x seed={key}"}
        out.append(FlowRun(id=ids[key], name=key, flow_id=uuid.uuid4(), parameters=params,
                           state=State(type=STATES[name], name=name)))
    return out


def test_done_counter_counts_each_completed_trial_once_even_when_several_finish_between_polls():
    polls = [{"shared": "Completed", "t00": "Running", "t01": "Running"},
             {"shared": "Completed", "t00": "Completed", "t01": "Completed", "t02": "Running", "t03": "Running"},
             {"shared": "Completed", "t00": "Completed", "t01": "Completed", "t02": "Running", "t03": "Running"},
             {"shared": "Completed", "t00": "Completed", "t01": "Completed", "t02": "Completed", "t03": "Completed"}]
    printer, lines = WatchLines(), []
    for states in polls:
        lines += printer.lines(Snapshot(SWEEP, [_trial(fr) for fr in _runs(states)]), "12:00:00")
    counts = [int(m.group(1)) for ln in lines if (m := re.search(r"\[(\d+) trials? done\]", ln))]
    assert counts == [1, 2, 3, 4], lines  # the old watch printed [2 …] twice, then [4 …] twice
    assert "[1 trial done]" in lines[4] and "[2 trials done]" in lines[5], lines
    # One line per state change: the unchanged third poll printed nothing; the shared run is never counted.
    assert len(lines) == 1 + 3 + 4 + 2 and sum("shared" in ln for ln in lines) == 1, lines
    assert all(" done]" not in ln for ln in lines if "shared" in ln or "Running" in ln)


def test_the_sweep_flows_last_log_line_is_its_pivot(tmp_path):
    """`prefect deployment run 'ablation-sweep/demo-lr' --watch` shows the flow's logs: its last line carries the
    pivot table (as `rlvr sweep run --watch` prints it) and the comparison's link."""
    from flows.ablation_sweep import pivot_log_line
    from rlvr_core.pipeline.sweeps import find_sweep, format_pivot, load_sweep, pivot_rows
    from rlvr_core.records.tracking import Tracker

    sw = load_sweep(find_sweep("demo-lr"))
    pivot = [{"grpo.lr": lr, "benchmark": "synthetic", "n_seeds": 3, "mean": m, "ci_low": m - 0.05,
              "ci_high": m + 0.05, "ci_kind": "t over 3 seeds", "per_seed": [m - 0.01, m, m + 0.01],
              "seeds": [0, 1, 2], "trial_ids": ids}
             for lr, m, ids in ((3e-05, 0.0716, ["t00", "t01", "t02"]), (0.0003, 0.4433, ["t03", "t04", "t05"]))]
    tracker = Tracker("rlvr-sweeps", tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    line = pivot_log_line(sw, "demo-lr-0a1b2c3d", pivot, tracker)
    head, *table, link = line.splitlines()
    assert head == "sweep demo-lr-0a1b2c3d done: accuracy_greedy by grpo.lr", head
    assert "\n".join(table) == format_pivot(pivot_rows(pivot, ["grpo.lr"]), ["grpo.lr"], "accuracy_greedy")
    assert any("0.443" in r and "[0.393, 0.493]" in r for r in table) and any("0.072" in r for r in table), table
    assert link.startswith("MLflow compare view: ") and "viewStateShareKey=sweep-demo-lr-0a1b2c3d" in link, link
