"""One pipeline, one retry rule per layer: every Prefect task of the project has a unique name and retries
through `tasks.retry.retry_condition_fn` (transient failures only), except the sweep's tasks that launch whole
pipeline flow runs, which relaunch only a crashed run (`relaunch_condition_fn`), so no failure is retried by
two layers; and the only flow that runs the stages is `pipeline` (the demo is that flow with the demo config)."""

from __future__ import annotations

import importlib
import pkgutil

from prefect import Flow, Task

import flows
import tasks
from tasks.retry import relaunch_condition_fn, retry_condition_fn

# Tasks that launch a pipeline flow run (flows/ablation_sweep.py): the stages inside it retry their own failures.
LAUNCHERS = {"trial", "shared-stages"}


def _objects(kind: type) -> dict[str, list[tuple[str, object]]]:
    """name -> [(module, object)] for every distinct Prefect Task/Flow object that flows/ and tasks/ hold (a task
    imported into another module is the same object and counted once; a second task of the same name is not)."""
    found: dict[str, list[tuple[str, object]]] = {}
    seen: set[int] = set()
    for pkg in (flows, tasks):
        for info in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + "."):
            module = importlib.import_module(info.name)
            for obj in vars(module).values():
                if isinstance(obj, kind) and id(obj) not in seen:
                    seen.add(id(obj))
                    found.setdefault(obj.name, []).append((info.name, obj))
    return found


def test_task_names_are_unique_and_share_one_retry_rule():
    found = _objects(Task)
    assert {"make-data", "grpo-train", "evaluate", "export-checkpoint", "record-run"} <= set(found)
    duplicates = {name: [m for m, _ in objs] for name, objs in found.items() if len(objs) > 1}
    assert not duplicates, f"task names defined more than once: {duplicates}"
    assert LAUNCHERS <= set(found)
    for name, [(module, task)] in found.items():
        rule = relaunch_condition_fn if name in LAUNCHERS else retry_condition_fn
        assert task.retry_condition_fn is rule, f"{module}: task {name!r} has its own retry rule"
        assert task.retries >= 1, f"{module}: task {name!r} is never retried, even on a transient failure"


def test_the_stages_run_in_one_flow():
    found = _objects(Flow)
    assert set(found) == {"pipeline", "ablation-sweep", "nightly-eval", "probe"}, sorted(found)
    from rlvr_cli import main as cli

    # `rlvr demo` runs the pipeline flow itself (no second copy of the orchestration).
    assert "pipeline_flow" in cli.demo.__code__.co_names or "pipeline_flow" in cli.demo.__code__.co_varnames
