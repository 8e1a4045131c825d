"""The stage tasks' retry hooks. Which failures are worth a retry is `rlvr_core.pipeline.child.transient`'s one
rule (`is_transient`), the same a stage child and a rank judge their own failures by.

Only one layer retries a failure. `retry_condition_fn` is the stage tasks' Prefect hook
(`@task(retry_condition_fn=...)`); `relaunch_condition_fn`, the hook of the tasks that launch whole flow
runs (sweep trials), relaunches only a flow run that crashed, never a failure its stages already retried.
"""

from __future__ import annotations

from typing import Any

from rlvr_core.pipeline.child.errors import TransientError
from rlvr_core.pipeline.child.transient import is_transient


class FlowRunCrashed(TransientError):
    """A launched flow run crashed (its worker was lost): launching it again resumes it (`relaunch_condition_fn`)."""


def retry_condition_fn(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect's hook for stage tasks: retry only when the failed state's exception is transient."""
    exc = _state_exception(state)
    return isinstance(exc, BaseException) and is_transient(exc)


def relaunch_condition_fn(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect's hook for tasks that launch flow runs (sweep trials): launch again only a run that crashed (its
    worker was lost). A failure inside the run, transient or not, has had its stage task's retries already;
    retrying it here too would multiply them."""
    return isinstance(_state_exception(state), FlowRunCrashed)


def _state_exception(state: Any) -> Any:
    try:
        return state.result(raise_on_failure=False)
    except BaseException as e:  # noqa: BLE001 - the result itself could not be read: look at that error
        return e
