"""Start `vllm serve` processes on this machine for the `vllm-server` engine (`sampling.server_launch`).

Each server serves one model folder on 127.0.0.1 with what the engine needs: the weight-transfer routes
(`VLLM_SERVER_DEV_MODE=1`), the token-in/token-out generate route (`--enable-scale-out`), raw log-probs,
the push transport's server backend (`rlvr` for the file and gloo pushes, imported in the server's worker
through `--worker-extension-cls`; else vLLM's `nccl`/`ipc`) and environment, and on CPU
the in-process engine's settings (float32, eager, a fixed KV cache, no chunked prefill: see
`rlvr_core.sampling.vllm.default_llm_kwargs`). Start-up is bounded: a server that exits or is not healthy
within `start_timeout_s` is an error naming it, with the tail of its log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr_core.sampling.vllm import _on_gpu
from rlvr_core.sampling.vllm_client import ServerClient
from rlvr_core.sampling.weight_push import transport_class
from rlvr_core.core.net import free_port as _free_port

__all__ = ["LaunchedServer", "launch_servers", "server_command"]

_ROOT = Path(__file__).resolve().parents[2]  # the project root: the server's worker imports rlvr_core from it


def server_command(model_dir: str | Path, port: int, *, dtype: str = "float32", kv_cache_bytes: int = 1 << 28,
                   seed: int = 0, push: Any = "file", gpu_memory_utilization: float = 0.3,
                   extra_args: tuple[str, ...] = ()) -> list[str]:
    """The command line of one server (CPU settings unless a GPU is visible to it). push: the trainer's
    `sampling.push` (a config, mapping or type name); the server gets its transport's --weight-transfer-config."""
    backend = transport_class(push).server_backend
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    max_len = min(int(cfg.get("max_position_embeddings") or 4096), 4096)
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype, "--max-model-len", str(max_len),
           "--logprobs-mode", "raw_logprobs", "--seed", str(seed), "--enable-scale-out",
           "--worker-extension-cls", "rlvr_core.sampling.weight_push.vllm_backend.RlvrWeightPushExtension",
           "--weight-transfer-config", json.dumps({"backend": backend})]
    if _on_gpu():  # a share of the device: the trainer (and other servers) use the rest
        cmd += ["--gpu-memory-utilization", str(gpu_memory_utilization)]
    else:
        cmd += ["--enforce-eager", "--kv-cache-memory-bytes", str(kv_cache_bytes), "--no-enable-chunked-prefill",
                "--max-num-batched-tokens", str(max(4096, max_len))]
    return cmd + list(extra_args)


@dataclass
class LaunchedServer:
    url: str
    proc: subprocess.Popen
    log: Path
    _log_file: object = field(default=None, repr=False)

    def log_tail(self, n: int = 15) -> str:
        try:
            lines = [ln for ln in self.log.read_text(errors="replace").splitlines() if "Route:" not in ln]
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM, then SIGKILL after `timeout` (its engine-core and worker children go with it)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self._log_file is not None:
            self._log_file.close()


def _server_env(threads: int, push: Any) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(VLLM_SERVER_DEV_MODE="1", VLLM_CPU_OMP_THREADS_BIND="nobind", OMP_NUM_THREADS=str(threads),
               TOKENIZERS_PARALLELISM="false")
    env.update(transport_class(push).server_env)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):  # not part of a trainer's world
        env.pop(k, None)
    return env


def launch_servers(model_dir: str | Path, count: int, log_dir: str | Path, *, start_timeout_s: float = 600.0,
                   threads: int = 1, **command_kw) -> list[LaunchedServer]:
    """Start `count` servers of `model_dir` on free ports and wait until all are healthy (or raise, having
    stopped them all). Logs go to `log_dir/vllm-server-<i>.log`."""
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    servers = []
    for i in range(count):
        port = _free_port()
        log = log_dir / f"vllm-server-{i}.log"
        fh = open(log, "wb")
        proc = subprocess.Popen(server_command(model_dir, port, **command_kw),
                                env=_server_env(threads, command_kw.get("push", "file")),
                                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        servers.append(LaunchedServer(f"http://127.0.0.1:{port}", proc, log, fh))
    try:
        _wait_healthy(servers, start_timeout_s)
    except BaseException:
        for s in servers:
            s.stop()
        raise
    return servers


def _wait_healthy(servers: list[LaunchedServer], timeout_s: float) -> None:
    deadline, pending = time.monotonic() + timeout_s, list(servers)
    while pending:
        for s in list(pending):
            if s.proc.poll() is not None:
                raise RuntimeError(f"vLLM server {s.url} exited with code {s.proc.returncode} while starting "
                                   f"(log {s.log}):\n{s.log_tail()}")
            if ServerClient(s.url).healthy():
                pending.remove(s)
        if pending and time.monotonic() > deadline:
            raise TimeoutError(f"vLLM server {pending[0].url} not healthy within {timeout_s:g}s (log {pending[0].log}):"
                               f"\n{pending[0].log_tail()}")
        if pending:
            time.sleep(1.0)
