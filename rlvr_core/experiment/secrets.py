"""Secrets in a config never leave the process that holds them: what crosses a boundary carries a placeholder.

A config value holds a secret when it sits under a secret-named key (`is_secret_key`: `api_key`, `hf_token`, …)
or is a URL with a password (`http://user:pw@host`). Wherever a config leaves the process that read it, it is
*sealed*: each such value becomes `${secret:RLVR_SECRET_<PATH>}` (its dotted path, upper-cased) and the real
values come back separately, by that name. The boundaries:

- a Prefect flow run's parameters (Prefect stores them in its database): `flows.sealed.sealed_flow` seals what
  Prefect stores for every call, and deployment runs are submitted sealed;
- a stage process's request file (`tasks.stage_process`): the file holds the placeholders, the child process
  gets the values in its environment.

Whoever receives a sealed config *unseals* it from its own environment (`unseal`): an in-process flow call has
the real values anyway (only Prefect's stored copy is sealed); a flow run started on a worker needs the named
variable in the worker's environment, or fails with an error naming the field and the variable.
"""

from __future__ import annotations

import os
import re
from typing import Any, Mapping

from rlvr_core.records.redact import is_secret_key, redact_text

ENV_PREFIX = "RLVR_SECRET_"
_PLACEHOLDER = re.compile(r"\$\{secret:(" + ENV_PREFIX + r"[A-Z0-9_]+)\}")


class SecretUnavailable(ValueError):
    """A sealed value whose variable is missing from this process's environment (the message says which)."""


def env_name(path: str) -> str:
    """`config.tracking.tracking_uri` → `RLVR_SECRET_CONFIG_TRACKING_TRACKING_URI`."""
    return ENV_PREFIX + re.sub(r"[^A-Za-z0-9]+", "_", path).strip("_").upper()


def holds_secret(key: str, value: Any) -> bool:
    """Whether `value`, stored under `key` (a dotted key counts by its last segment), is or contains a secret."""
    if key and is_secret_key(key) and value not in (None, ""):
        return True
    return isinstance(value, str) and redact_text(value) != value


def seal(value: Any, path: str = "") -> tuple[Any, dict[str, str]]:
    """(`value` with every secret replaced by its placeholder, {variable name: secret}). Dicts and lists are
    walked; `path` names `value` itself (the placeholders' names start with it)."""
    found: dict[str, str] = {}

    def walk(v: Any, p: str, key: str) -> Any:
        if isinstance(v, dict):
            return {k: walk(x, f"{p}.{k}" if p else str(k), str(k)) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [walk(x, f"{p}.{i}" if p else str(i), key) for i, x in enumerate(v)]
        if not holds_secret(key, v):
            return v
        name = env_name(p or "value")
        found[name] = str(v)
        return "${secret:" + name + "}"

    return walk(value, path, path.rsplit(".", 1)[-1]), found


def is_sealed(value: Any) -> bool:
    """Whether a placeholder is anywhere inside `value`."""
    if isinstance(value, dict):
        return any(is_sealed(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(is_sealed(v) for v in value)
    return isinstance(value, str) and _PLACEHOLDER.search(value) is not None


def unseal(value: Any, source: str = "<parameters>", environ: Mapping[str, str] | None = None, path: str = "") -> Any:
    """`value` with every placeholder replaced by its variable from `environ` (default: this process's
    environment); raises SecretUnavailable naming `source`, the field and the variable when one is missing."""
    env = os.environ if environ is None else environ
    if isinstance(value, dict):
        return {k: unseal(v, source, env, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [unseal(v, source, env, f"{path}.{i}" if path else str(i)) for i, v in enumerate(value)]
    if not isinstance(value, str) or "${secret:" not in value:
        return value

    def resolve(m: re.Match[str]) -> str:
        if m.group(1) not in env:
            raise SecretUnavailable(
                f"{source}: field {path or '<value>'!r} held a secret, which is never passed in parameters or "
                f"request files; set {m.group(1)} in this process's environment (e.g. the worker's), or keep "
                "credentials out of configs: AWS_* for S3, MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD "
                "for MLflow (docs/tracking.md, Secrets)")
        return env[m.group(1)]

    return _PLACEHOLDER.sub(resolve, value)
