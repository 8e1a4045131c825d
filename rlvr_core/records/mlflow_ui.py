"""`python -m rlvr_core.records.mlflow_ui server ARGS…`: `mlflow server ARGS…` whose UI opens in MLflow's
model-training view wherever a user clicks, not only from the links rlvr prints.

Why a wrapper: MLflow 3.17's UI decides between its GenAI pages and its model-training pages from a link's
`workflowType` parameter, else from the GenAI/Model-training switch it keeps in the browser's localStorage
(`mlflow.workflowType_v1`, a JSON string; nothing stored means GenAI). The experiment's `mlflow.experimentKind`
tag, which rlvr sets (tracking.EXPERIMENT_KIND_TAG), is not read by that UI (its "workflow-based navigation"
flag is on). MLflow's own links carry no `workflowType` (an experiment's name in the experiments list, a run's
name in a table, "Child runs"), so from a fresh browser they open on the GenAI overview even when the page they
start from was opened in model-training mode. The server therefore puts one line of script at the top of the
UI's page (`/`, the page every UI address loads: the rest is the `#/…` fragment): when the browser has no
choice stored, it stores `machine_learning`, before MLflow's own script reads it. A choice the user made on the
switch stays theirs. Everything else (API, artifacts, MLflow's security middleware) is MLflow's, unchanged.

`rlvr stack up` starts the MLflow server this way (rlvr_core/pipeline/stack.py), `rlvr ui` its UI over the
project's own store, tests/mlflow_server.py the tests' servers.
The Docker stack (infra/compose) runs plain `mlflow server`: there the switch is the user's one click.
"""

from __future__ import annotations

import sys
from typing import Any, Awaitable, Callable

WORKFLOW_KEY = "mlflow.workflowType_v1"  # MLflow 3.17's useLocalStorage key: `${key}_v${version}`
WORKFLOW_VALUE = "machine_learning"
MLFLOW_APP = "mlflow.server.fastapi_app:app"  # what `mlflow server` runs under uvicorn
APP = "rlvr_core.records.mlflow_ui:app"  # a literal: run as `-m`, __name__ is "__main__"
SCRIPT = (f'<script>try{{if(localStorage.getItem("{WORKFLOW_KEY}")===null)'
          f'localStorage.setItem("{WORKFLOW_KEY}",JSON.stringify("{WORKFLOW_VALUE}"))}}catch(e){{}}</script>')

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def with_default_view(html: bytes) -> bytes:
    """MLflow's index page with SCRIPT first in <head> (it runs before MLflow's deferred bundle)."""
    head = html.find(b"<head>")
    if head < 0:
        return html
    at = head + len(b"<head>")
    return html[:at] + SCRIPT.encode() + html[at:]


def default_view_middleware(inner: Callable[[Scope, Receive, Send], Awaitable[None]]):
    """An ASGI app: `inner`, with the UI page (GET `/` answered 200 with HTML) rewritten by `with_default_view`.
    Conditional headers are dropped from that request so MLflow answers 200 with the page (never a 304 that
    would keep a browser on a page cached without the script)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "GET" or scope.get("path") != "/":
            await inner(scope, receive, send)
            return
        scope = {**scope, "headers": [(k, v) for k, v in scope.get("headers", [])
                                      if k.lower() not in (b"if-none-match", b"if-modified-since")]}
        start: Message = {}
        body = bytearray()

        async def capture(message: Message) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                body.extend(message.get("body", b""))
                if not message.get("more_body", False):
                    await _send_page(send, start, bytes(body))
            else:
                await send(message)

        await inner(scope, receive, capture)

    return app


async def _send_page(send: Send, start: Message, body: bytes) -> None:
    headers = list(start.get("headers", []))
    names = {k.lower(): v for k, v in headers}
    if (start.get("status") == 200 and names.get(b"content-type", b"").startswith(b"text/html")
            and b"content-encoding" not in names):
        body = with_default_view(body)
        headers = [(k, v) for k, v in headers if k.lower() not in (b"content-length", b"etag", b"last-modified",
                                                                    b"cache-control")]
        headers += [(b"content-length", str(len(body)).encode()), (b"cache-control", b"no-cache")]
    await send({**start, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _mlflow_app():
    from mlflow.server.fastapi_app import app as mlflow_app

    return mlflow_app


class _LazyApp:
    """The wrapped app, built on first use, so importing this module (the CLI below) does not build MLflow's."""

    def __init__(self) -> None:
        self._app = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._app is None:
            self._app = default_view_middleware(_mlflow_app())
        await self._app(scope, receive, send)


app = _LazyApp()


def main(argv: list[str]) -> None:
    """Run MLflow's own `mlflow …` command line, with uvicorn serving `app` instead of MLflow's app."""
    import mlflow.server as server

    build = server._build_uvicorn_command

    def build_ours(uvicorn_opts, host, port, workers, app_name, *args, **kwargs):
        if app_name != MLFLOW_APP:
            raise SystemExit(f"rlvr_core.records.mlflow_ui: mlflow server asked uvicorn for {app_name!r}, not "
                             f"{MLFLOW_APP!r}; this MLflow version starts differently: run plain `mlflow server`")
        return build(uvicorn_opts, host, port, workers, APP, *args, **kwargs)

    server._build_uvicorn_command = build_ours
    from mlflow.cli import cli

    cli.main(args=argv, prog_name="mlflow")


if __name__ == "__main__":
    main(sys.argv[1:])
