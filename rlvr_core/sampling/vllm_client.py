"""The HTTP client of one `vllm serve` process, shared by the `vllm-server` engine (generation) and the
weight-push transports (`rlvr_core/sampling/weight_push/`).

Every call has a timeout, and a failure names the server: a dead or hung server is a `ServerError`, never a
hang. No vLLM import here: the client needs only `requests`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

__all__ = ["ServerError", "ServerClient"]


class ServerError(RuntimeError):
    """A vLLM server failed, timed out or answered wrongly; the message starts with its URL."""


@dataclass
class ServerClient:
    """One `vllm serve` process at `url` (http://host:port). request_timeout_s bounds one generation request;
    push_timeout_s bounds each call of a weight push and each version check."""

    url: str
    request_timeout_s: float = 300.0
    push_timeout_s: float = 120.0

    def call(self, method: str, path: str, timeout: float, body: dict | None = None) -> dict:
        """One route of the server; its JSON answer ({} when empty). ServerError on a timeout, a lost
        connection or an HTTP status other than 200."""
        import requests

        t0 = time.monotonic()
        try:
            r = requests.request(method, f"{self.url.rstrip('/')}{path}", json=body, timeout=timeout)
        except requests.Timeout:
            raise ServerError(f"vLLM server {self.url}: no answer to {path} within {timeout:g}s") from None
        except requests.ConnectionError as e:
            raise ServerError(f"vLLM server {self.url}: {path} failed after {time.monotonic() - t0:.1f}s "
                              f"(connection: {type(e).__name__})") from None
        if r.status_code != 200:
            raise ServerError(f"vLLM server {self.url}: {path} answered HTTP {r.status_code}: {r.text[:300]}")
        return r.json() if r.content else {}

    def healthy(self, timeout: float = 2.0) -> bool:
        try:
            self.call("GET", "/health", timeout)
            return True
        except ServerError:
            return False

    def weight_version(self) -> str | None:
        return self.call("GET", "/weight_info", self.push_timeout_s).get("weight_version")

    def generate(self, token_ids: list[int], sampling_params: dict) -> dict:
        """One request; the single choice of vLLM's answer (token_ids, logprobs, finish_reason, weight_versions),
        with the prompt ids the server conditioned on (`prompt_token_ids`, None where it reports none)."""
        body = {"token_ids": token_ids, "sampling_params": sampling_params, "output_mode": "tokens",
                "return_token_ids": True}
        out = self.call("POST", "/inference/v1/generate", self.request_timeout_s, body)
        return {**out["choices"][0], "prompt_token_ids": out.get("prompt_token_ids")}

    def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        """log p(token_ids[j] | token_ids[:j]) for j = 1 .. len - 1, as the served model computes them (vLLM's
        `prompt_logprobs`, raw log-softmax at temperature 1): a teacher scoring a finished sequence. One greedy
        token is generated and thrown away (a request must generate); no text is decoded. vLLM floors -inf at
        -9999. ServerError when the answer does not hold one log-prob per scored token."""
        params = {"n": 1, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0, "detokenize": False}
        body = {"token_ids": token_ids, "sampling_params": params, "output_mode": "tokens"}
        out = self.call("POST", "/inference/v1/generate", self.request_timeout_s, body).get("prompt_logprobs") or []
        if len(out) != len(token_ids):
            raise ServerError(f"vLLM server {self.url}: {len(out)} prompt log-probs for {len(token_ids)} tokens")
        try:
            return [float(out[j][str(token_ids[j])]["logprob"]) for j in range(1, len(token_ids))]
        except (KeyError, TypeError) as e:
            raise ServerError(f"vLLM server {self.url}: prompt log-probs without the scored token ({e!r})") from None
