"""A trajectory stored as `rollout_segments` rows and read back gives the trainer the same batch and the same loss
as the live one; the loss sees only the policy's ids (changing what the environment said changes nothing the mask
lets through, and an observation token trained is refused)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from env_helpers import TOOL_QA
from rlvr_core.core.registry import lookup
from rlvr_core.environments.boundary import TextBoundary
from rlvr_core.environments.loop import Budgets, rollout
from rlvr_core.environments.trajectory import from_rows, to_rows
from rlvr_core.grpo.logprobs import sequence_logprobs
from rlvr_core.grpo.losses import grpo_loss
from rlvr_core.grpo.update import _groups_batch
from rlvr_core.sampling.base import SamplingParams
from rlvr_core.sampling.trajectories import as_sample
from rlvr_core.verifiers import get_verifier

GSM8K = get_verifier("gsm8k")


@pytest.fixture(scope="module")
def live(taught_engine):
    engine = taught_engine
    env = lookup("environment", "tools")(engine.tokenizer, TOOL_QA, tools=["calculator"],
                                         boundary=TextBoundary(engine.tokenizer, prefix="\n= ", suffix="\n"))
    problems = [{"question": "What is 12 * 34?", "gold": "408"}, {"question": "What is 7 * 8?", "gold": "56"}]
    trajs = rollout(engine, env, problems, ["a", "b"], SamplingParams(n=2, temperature=1.0, max_new_tokens=24, seed=3),
                    Budgets(max_turns=3), score=lambda pairs: [GSM8K.verify(t, g).reward for t, g in pairs])
    return engine, [t for group in trajs for t in group]


def _inputs(engine, trajs):
    """The trainer's batch for the trajectories (`_groups_batch`), the policy's log-probs and the advantages."""
    samples = [as_sample(t, f"p{i}", 0) for i, t in enumerate(trajs)]
    group = SimpleNamespace(samples=samples, prompt="(unused: the samples carry their prompt ids)")
    sampler = SimpleNamespace(pad_token_id=engine.pad_token_id, add_special_tokens=False)
    batch, old, mask = _groups_batch([group], engine.tokenizer, sampler, torch.device("cpu"))
    with torch.no_grad():
        logp, _ = sequence_logprobs(engine.model, batch)
    return batch, old, mask, logp, torch.tensor([t.reward - 0.5 for t in trajs])


def _loss(engine, trajs):
    batch, old, mask, logp, adv = _inputs(engine, trajs)
    return grpo_loss(logp, old, adv, mask)[0], batch, mask


def test_a_stored_trajectory_replays_to_the_same_loss(live):
    engine, trajs = live
    assert any(t.tool_calls for t in trajs)
    stored = [json.loads(json.dumps(to_rows(t))) for t in trajs]  # what the warehouse holds, as plain data
    replayed = [from_rows(rows[::-1]) for rows in stored]  # read back in any order
    loss, batch, mask = _loss(engine, trajs)
    again, batch2, mask2 = _loss(engine, replayed)
    assert torch.equal(batch["input_ids"], batch2["input_ids"]) and torch.equal(mask, mask2)
    assert float(loss) == float(again)


def test_the_loss_sees_only_the_policys_tokens(live):
    engine, trajs = live
    loss, batch, mask = _loss(engine, trajs)
    for b, t in enumerate(trajs):
        assert mask[b, :len(t.loss_mask())].tolist() == [bool(m) for m in t.loss_mask()]
        assert int(mask[b].sum()) == sum(len(s.token_ids) for s in t.segments if s.role == "model")
    # What sits at the environment's positions (old log-probs, the policy's log-probs) never reaches the loss.
    _, old, _, logp, adv = _inputs(engine, trajs)
    env_positions = ~mask & (torch.arange(mask.shape[1])[None, :] < batch["lengths"][:, None])
    assert bool(env_positions.any())
    noisy_old = torch.where(env_positions, torch.full_like(old, -7.0), old)
    noisy_logp = torch.where(env_positions, torch.full_like(logp, 3.0), logp)
    assert float(grpo_loss(noisy_logp, noisy_old, adv, mask)[0]) == float(loss)


def test_per_turn_advantages_sit_on_each_turns_model_ids(live):
    """The trainer's (B, T) advantages under turn_advantage: to_go, on live trajectories: turn k's value on the ids
    of model turn k, 0 on every observation id; a failed call's turn reward is charged to its own turn only."""
    from rlvr_core.environments.advantages import turn_to_go_advantages
    from rlvr_core.grpo.update import turn_token_advantages

    _, trajs = live
    samples = [as_sample(t, f"p{i}", i) for i, t in enumerate(trajs)]
    rewards = [t.reward for t in trajs]
    group = SimpleNamespace(samples=samples, stats=SimpleNamespace(rewards=rewards, penalties=[0.0] * len(trajs)))
    adv = turn_token_advantages([group], max(len(s.token_ids) for s in samples) + 3)
    per_turn = turn_to_go_advantages(rewards, [t.turn_rewards + [None] * (t.turns - len(t.turn_rewards))
                                               for t in trajs])
    for b, t in enumerate(trajs):
        pos = 0
        for s in t.segments:
            want = per_turn[b][s.turn] if s.role == "model" else 0.0
            assert adv[b, pos:pos + len(s.token_ids)].tolist() == pytest.approx([want] * len(s.token_ids))
            pos += len(s.token_ids)
        assert not adv[b, pos:].any()
