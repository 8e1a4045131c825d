"""`@sealed_flow(...)`: Prefect's `@flow`, except that the parameters Prefect stores for a run are sealed.

Prefect keeps every flow run's parameters in its database, readable by anyone with the UI or the API. A config
passed as a parameter (`rlvr demo` passes the resolved config, a sweep passes each trial's config) may hold a
password (a tracking URI `http://user:pw@host`, a value under a secret-named key). A sealed flow stores those
values as placeholders (`rlvr_core.experiment.secrets`); the call itself still receives the real values, and a
run started from the stored parameters (a deployment run on a worker) resolves the placeholders from the
worker's environment (`unseal`, in the flows' config loading). Deployment runs are submitted sealed with
`sealed_parameters`.
"""

from __future__ import annotations

from typing import Any, Callable

from prefect import Flow, flow

from rlvr_core.experiment.secrets import seal


class SealedFlow(Flow):
    def serialize_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        return sealed_parameters(super().serialize_parameters(parameters))

    def with_options(self, **options: Any) -> "SealedFlow":
        new = super().with_options(**options)  # Prefect builds a plain Flow here
        new.__class__ = SealedFlow
        return new


def sealed_flow(**options: Any) -> Callable[[Callable[..., Any]], SealedFlow]:
    """Like `prefect.flow(**options)`, returning a SealedFlow."""
    def wrap(fn: Callable[..., Any]) -> SealedFlow:
        f = flow(**options)(fn)
        f.__class__ = SealedFlow
        return f
    return wrap


def sealed_parameters(parameters: dict[str, Any]) -> dict[str, Any]:
    """Flow-run parameters with every secret replaced by its placeholder (`RLVR_SECRET_<PARAMETER>_<FIELD>`)."""
    return {k: seal(v, k)[0] for k, v in parameters.items()}
