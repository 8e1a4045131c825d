"""A planted sympy hang in training and in the pass-rate stage (BUGZOO G-verifier-hang).

The hang is real: one training problem's gold answer is `10^{10^{10}}`, so the `math` verifier's
comparison of any completion against it makes sympy try to build a ten-billion digit integer. Training
and pass-rate sampling score through `reward:` (here: math, 2 worker processes, 1 s): every completion of
that problem must come back `timeout` within its limit, the step's status counts must show them, the
G-verifier-hang flag must fire, and every other completion must get the verdict the in-process verifier
gives it.
"""

from __future__ import annotations

import time

import pyarrow.parquet as pq
import pytest

from rlvr_core.experiment.config import GRPOConfig, RewardConfig
from rlvr_core.grpo.trainer import train_grpo
from rlvr_core.verifiers import get_verifier
from rlvr_core.verifiers.pool import _KILL_MARGIN_S

from grpo_helpers import build_tiny

HANG_GOLD = "10^{10^{10}}"
TIMEOUT_S = 1.0
P, G = 4, 4


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    model_dir, rows, ids = build_tiny(tmp_path_factory.mktemp("tiny-hang"))
    rows = [dict(r) for r in rows]
    rows[1]["final_answer"] = HANG_GOLD  # in the first step's prompts
    return model_dir, rows, ids, rows[1]["id"]


def _in_process_status(response: str, gold: str) -> str:
    return get_verifier("math").verify(response, gold).status.value


def _hang_status(response: str) -> str:
    """What a completion of the hanging problem must get: `timeout` when it has an answer to compare
    (the comparison hangs), `no_answer` when there is nothing to compare (parsing alone cannot hang)."""
    return "timeout" if get_verifier("math").extract(response) else "no_answer"


def test_grpo_step_with_a_hanging_answer_finishes_and_loses_nothing_else(planted, tmp_path):
    model_dir, rows, ids, hang_id = planted
    reward = RewardConfig(verifier="math", workers=2, timeout_s=TIMEOUT_S)
    cfg = GRPOConfig(steps=2, prompts_per_step=P, group_size=G, lr=1e-2, warmup_steps=0, temperature=0.8,
                     zero_stage=2, checkpoint_every=1000, rollout_samples_per_step=P * G)
    said: list[str] = []
    t0 = time.monotonic()
    res = train_grpo(model_dir, rows, ids, tmp_path / "run", cfg, template_id="qa", reward=reward,
                     max_new_tokens=12, seed=0, progress=said.append)
    wall = time.monotonic() - t0
    steps = pq.read_table(res.steps_path).to_pylist()
    assert [s["step"] for s in steps] == [1, 2]
    first, second = steps
    rollouts = pq.read_table(tmp_path / "run" / "rollouts.parquet").to_pylist()
    assert len(rollouts) == 2 * P * G
    gold = {r["id"]: r["final_answer"] for r in rows}
    hangs = 0
    for r in rollouts:
        if r["prompt_id"] == hang_id:
            assert r["status"] == _hang_status(r["completion"]) and r["reward"] == 0.0, r
            hangs += r["status"] == "timeout"
        else:  # nothing else lost: the verdict the in-process verifier gives
            assert r["status"] == _in_process_status(r["completion"], gold[r["prompt_id"]]), r
    assert hangs >= 2, "too few planted hangs reached the verifier to test anything"
    # The step finished with the hangs counted and flagged.
    assert first["status/timeout"] == hangs and second["status/timeout"] == 0
    assert first["health/G-verifier-hang"] == 1 and second["health/G-verifier-hang"] == 0
    assert any("G-verifier-hang" in m and f"{hangs} of {P * G}" in m for m in said), said
    # The hangs on 2 workers cost about hangs / 2 timeouts of wall time, not a stall (generous for a busy machine).
    assert first["t_reward_s"] < hangs * (TIMEOUT_S + _KILL_MARGIN_S) + 5.0, first["t_reward_s"]
    assert wall < 600


def test_pass_rate_sampling_with_a_hanging_answer(planted):
    from rlvr_core.data.curriculum import pass_rate_table
    from rlvr_core.sampling.models import load_model
    from rlvr_core.sampling.verified import sample_and_verify

    model_dir, rows, _, hang_id = planted
    model, tok = load_model(model_dir)
    part = rows[:6]
    records = sample_and_verify(model, tok, part, template_id="qa", n=4, temperature=1.0, top_p=1.0,
                                max_new_tokens=12, seed=0, batch_size=32, verifier="math", verifier_mode=None,
                                verifier_workers=2, verifier_timeout_s=TIMEOUT_S)
    assert len(records) == 6 * 4
    hangs = 0
    for r in records:
        row = next(x for x in part if x["id"] == r["problem_id"])
        if r["problem_id"] == hang_id:
            assert r["status"] == _hang_status(r["response"]) and not r["correct"], r
            hangs += r["status"] == "timeout"
        else:
            assert r["status"] == _in_process_status(r["response"], row["final_answer"])
    assert hangs >= 1, "no planted hang reached the verifier"
    table = {t["problem_id"]: t for t in pass_rate_table(records, ks=[1, 4]).to_pylist()}
    assert table[hang_id]["status_timeout"] == hangs
    assert sum(t["status_timeout"] for t in table.values()) == hangs
