"""The worker children of the pipeline's stages, in one room: a stage child (`stage`, started by the stage task
`tasks/stage_process.py`), the nodes of a launched training group (`rank`, started by
`rlvr_core/pipeline/launch.py`), and a probe analysis (`rlvr probe` under `watched`, started by the probe flow).
Not here: the local stack's services (`pipeline/stack.py`, `flows/local_stack.py`), the verifiers' process pool
(`verifiers/pool.py`) and vLLM servers (`sampling/vllm_server_launch.py`), which start and watch their own.

* `protocol`: the sealed request (no secret in the file; its secrets travel in the child's environment), the
  parent watch, the typed `ChildFailure(kind, transient, message, traceback)` a child reports, the atomic result
  write, and `serve`, the skeleton of the stage and rank entry points: read the request inside the `try`, run,
  write a result or a failure (a `watched` command has no request: its report is its exit status). `ChildError` is what a parent raises for a child that failed.
* `transient`: the one rule for "a retry can fix it" (`is_transient`) and for out of memory (`is_oom`, G-oom).
* `death`: the verdict on a child that died without reporting (its exit status and the memory cgroup's
  OOM-kill counter).
* `run`: `run_child` (environment defaults in one table, start, streamed output with a timeout, the verdict).
* `stage`, `rank`, `watched`: the entry points.

Plain Python: no Prefect; torch only in `rank`.
"""
