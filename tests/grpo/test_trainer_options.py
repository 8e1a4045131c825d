"""GRPO trainer options (docs/grpo_training.md, "Options"): DAPO dynamic sampling, DAPO soft overlong
punishment, Δlog p advantage reweighting, verifier status counts and the rollouts.parquet sample.

Same tiny model and production path as test_trainer.py (grpo_helpers.py). The verifiers here
make the options observable:
  * `_test_status`: the status cycles with the completion's character count (len % 5: correct, incorrect,
    no answer, error, timeout), reward 1 only for correct. About 40% of groups of 4 are all-zero, so
    dynamic sampling has groups to drop, and every status can occur.
  * `_test_zero`: always incorrect: every group has zero variance (the partial-batch case).
  * `_test_sparse` (used by the 2-process test): parity reward only for prompts whose gold is a multiple
    of 3, 0 otherwise, so a rank may keep no group at all.

Every trainer call records, through monkeypatched hooks, the rewards each advantage estimator was given,
the tensors each `grpo_loss` call was given, and the prompt ids / step / epoch of each engine call.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from grpo_helpers import model_params, tiny_cfg

from rlvr_core.data.templates import get_template
from rlvr_core.experiment.config import GRPOConfig, RewardConfig
from rlvr_core.grpo import trainer as trainer_mod
from rlvr_core.grpo.losses import grpo_loss
from rlvr_core.sampling import SamplingParams
from rlvr_core.sampling.hf import HFEngine
from rlvr_core.verifiers.base import _REGISTRY, Outcome, Status, register_verifier

STATUS_CYCLE = (Status.CORRECT, Status.INCORRECT, Status.NO_ANSWER, Status.ERROR, Status.TIMEOUT)
STATUS_COLS = [f"status/{s.value}" for s in STATUS_CYCLE]
ROLLOUT_COLS = {"step", "position", "prompt_id", "sample_index", "prompt", "completion", "reward", "status",
                "length", "finish_reason", "overlong_penalty", "advantage"}
P, G, MAX_NEW = 4, 4, 12


class _StatusCycle:
    name, version = "_test_status", "1"
    can_hang = False  # no input makes it slow

    def warm_up(self) -> None:
        pass

    def verify(self, response: str, gold) -> Outcome:
        st = STATUS_CYCLE[len(response) % 5]
        return Outcome(st, float(st is Status.CORRECT), None, self.name, self.version)


class _Zero:
    name, version = "_test_zero", "1"
    can_hang = False  # no input makes it slow

    def warm_up(self) -> None:
        pass

    def verify(self, response: str, gold) -> Outcome:
        return Outcome(Status.INCORRECT, 0.0, None, self.name, self.version)


class _Sparse:
    name, version = "_test_sparse", "1"
    can_hang = False  # no input makes it slow

    def warm_up(self) -> None:
        pass

    def verify(self, response: str, gold) -> Outcome:
        ok = int(gold) % 3 == 0 and len(response) % 2 == 0
        return Outcome(Status.CORRECT if ok else Status.INCORRECT, float(ok), None, self.name, self.version)


for _cls in (_StatusCycle, _Zero, _Sparse):
    if _cls.name not in _REGISTRY:
        register_verifier(_cls.name)(_cls)


@dataclass
class Record:
    adv_in: list[torch.Tensor] = field(default_factory=list)   # rewards given to the advantage estimator
    loss_in: list[dict] = field(default_factory=list)          # grpo_loss inputs (detached) and its loss
    gen: list[tuple[list[str], int, int]] = field(default_factory=list)  # (prompt ids, step, epoch) per call
    chunks: list[tuple[list[str], int, int, int]] = field(default_factory=list)  # (ids, step, first index, n)


@contextlib.contextmanager
def recording():
    rec = Record()
    real_adv, real_loss, real_gen = trainer_mod.get_advantage, trainer_mod.grpo_loss, HFEngine.generate

    def get_advantage(name):
        fn = real_adv(name)

        def wrapped(rewards, *a, **kw):
            rec.adv_in.append(rewards.detach().clone())
            return fn(rewards, *a, **kw)
        return wrapped

    def grpo_loss(logp, old_logp, adv, mask, **kw):
        loss, m = real_loss(logp, old_logp, adv, mask, **kw)
        rec.loss_in.append(dict(logp=logp.detach().clone(), old=old_logp.clone(), adv=adv.clone(), mask=mask.clone(),
                                kw=dict(kw), loss=loss.detach().clone()))
        return loss, m

    def generate(self, prompts, prompt_ids, params, **kw):
        rec.gen.append((list(prompt_ids), kw["step"], kw["epoch"]))
        rec.chunks.append((list(prompt_ids), kw["step"], kw.get("first_sample_index", 0), params.n))
        return real_gen(self, prompts, prompt_ids, params, **kw)

    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trainer_mod, "get_advantage", get_advantage)
        mp.setattr(trainer_mod, "grpo_loss", grpo_loss)
        mp.setattr(HFEngine, "generate", generate)
        torch.set_num_threads(1)  # the machine's 2 cores are shared; more threads only slow it down
        try:
            yield rec
        finally:
            torch.set_num_threads(threads)


def _run(tiny, out: Path, cfg: GRPOConfig, verifier: str = "_test_status", **kw):
    model_dir, rows, ids = tiny
    with recording() as rec:
        res = trainer_mod.train_grpo(model_dir, rows, ids, out, cfg, template_id="qa", reward=RewardConfig(verifier=verifier),
                                      max_new_tokens=MAX_NEW, seed=0, **kw)
    return res, rec


def _rows(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def _hand_penalty(length: int, buffer: int, factor: float) -> float:
    """DAPO's soft overlong punishment written out (docs): 0 up to max - buffer, then linear to -factor at max."""
    start = MAX_NEW - buffer
    return 0.0 if length <= start else -factor * (length - start) / buffer


def _hand_loss(rec: dict, c: float, clip_low: float = 0.2, clip_high: float = 0.28) -> float:
    """token-mean PPO-clip loss with advantages A_b * (1 + c - c * pi_old(token)), in float64."""
    lp, old, m = rec["logp"].double(), rec["old"].double(), rec["mask"]
    a = rec["adv"].double()[:, None] * (1 + c - c * old.exp())
    r = (lp - old).exp()
    per = -torch.minimum(r * a, r.clamp(1 - clip_low, 1 + clip_high) * a)
    return float(torch.where(m, per, torch.zeros_like(per)).sum() / rec["kw"]["num_tokens"])


# ------------------------------------------------------------------------------ one step, each option
@pytest.fixture(scope="module")
def base(tiny, tmp_path_factory):
    """One step with every option at its default, every completion logged (100 > P * G: capped at 16)."""
    return _run(tiny, tmp_path_factory.mktemp("opt") / "base", tiny_cfg(steps=1, rollout_samples_per_step=100))


def test_defaults_are_off_and_bad_buffer_fails_before_work(tiny, tmp_path):
    d = GRPOConfig()
    assert (d.dynamic_sampling, d.overlong_buffer_len, d.dlogp_reweight_c) == (False, 0, 0.0)
    assert d.rollout_samples_per_step == 4 and d.dynamic_sampling_max_rounds == 4 and d.overlong_penalty_factor == 1.0
    with pytest.raises(ValueError, match="overlong_buffer_len=13 exceeds max_new_tokens=12"):
        _run(tiny, tmp_path / "bad", tiny_cfg(overlong_buffer_len=13))
    assert not (tmp_path / "bad").exists()


def test_status_counts_and_rollout_rows(base, tiny):
    res, rec = base
    (row,) = _rows(res.steps_path)
    rollouts = _rows(res.rollouts_path)
    assert len(rollouts) == P * G and set(rollouts[0]) == ROLLOUT_COLS
    assert sum(row[c] for c in STATUS_COLS) == P * G
    assert Counter(r["status"] for r in rollouts) == Counter({c.removeprefix("status/"): row[c] for c in STATUS_COLS})
    assert row["status/error"] + row["status/timeout"] > 0  # visible, not folded into "incorrect" (G-verifier-error)
    # Round-robin over prompts: the k-th row is sample k // P of prompt k % P; every (prompt, sample) once.
    _, rows, ids = tiny
    for k, r in enumerate(rollouts):
        assert (r["step"], r["position"], r["prompt_id"], r["sample_index"]) == (1, k % P, ids[k % P], k // P)
        assert r["prompt"] == get_template("qa").render(rows[k % P]["question"])
        assert r["reward"] == float(r["status"] == "correct") and r["overlong_penalty"] == 0
        assert 1 <= r["length"] <= MAX_NEW and r["finish_reason"] in ("stop", "length")
        assert (r["finish_reason"] == "length") <= (r["length"] == MAX_NEW)
        assert STATUS_CYCLE[len(r["completion"]) % 5].value == r["status"]
    assert row["reward_mean"] == pytest.approx(sum(r["reward"] for r in rollouts) / (P * G))
    assert (row["dynamic/rounds"], row["dynamic/prompts_consumed"], row["dynamic/groups_dropped"],
            row["dynamic/groups_kept"]) == (1, P, 0, P)
    assert row["overlong/penalty_mean"] == 0 and row["overlong/penalized_share"] == 0
    assert res.summary["data_position"] == P
    # c = 0 (the default) is today's loss, bit for bit.
    (call,) = rec.loss_in
    assert call["kw"]["lowprob_c"] == 0
    plain = {k: v for k, v in call["kw"].items() if k != "lowprob_c"}
    want, _ = grpo_loss(call["logp"], call["old"], call["adv"], call["mask"], **plain)
    assert torch.equal(call["loss"], want)
    assert row["loss"] == pytest.approx(_hand_loss(call, 0.0), rel=1e-5, abs=1e-7)


def test_dlogp_reweighting_changes_only_the_loss(base, tiny, tmp_path):
    c = 0.5
    res, rec = _run(tiny, tmp_path / "dlogp", tiny_cfg(steps=1, rollout_samples_per_step=100, dlogp_reweight_c=c))
    (row,), (row0,) = _rows(res.steps_path), _rows(base[0].steps_path)
    # Same rollouts, rewards and advantages as the default run ...
    assert _rows(res.rollouts_path) == _rows(base[0].rollouts_path)
    torch.testing.assert_close(rec.adv_in[0], base[1].adv_in[0], rtol=0, atol=0)
    for k in ("reward_mean", "reward_std", "n_tokens", "completion_len_mean", *STATUS_COLS):
        assert row[k] == row0[k], k
    (call,), (call0,) = rec.loss_in, base[1].loss_in
    assert torch.equal(call["old"], call0["old"]) and torch.equal(call["adv"], call0["adv"])
    assert call["kw"]["lowprob_c"] == c
    # ... and the loss is the hand computation with A * (1 + c - c * pi_old), not the unweighted one.
    want = _hand_loss(call, c)
    assert row["loss"] == pytest.approx(want, rel=1e-5, abs=1e-7)
    assert float(call["loss"]) == pytest.approx(want, rel=1e-5, abs=1e-7)
    assert abs(want - _hand_loss(call, 0.0)) > 1e-4
    assert row["loss"] != row0["loss"]


def test_overlong_penalty_lowers_long_completions_rewards(base, tiny, tmp_path):
    buffer, factor = 8, 0.5
    res, rec = _run(tiny, tmp_path / "overlong", tiny_cfg(steps=1, rollout_samples_per_step=100, overlong_buffer_len=buffer,
                                                       overlong_penalty_factor=factor))
    (row,), (row0,) = _rows(res.steps_path), _rows(base[0].steps_path)
    roll, roll0 = _rows(res.rollouts_path), _rows(base[0].rollouts_path)
    # Same completions and verifier rewards (the verifier reward is what reward_mean reports) ...
    def strip(rs):
        return [{k: v for k, v in r.items() if k not in ("overlong_penalty", "advantage")} for r in rs]
    assert strip(roll) == strip(roll0)
    for k in ("reward_mean", "reward_std", "zero_var_group_share", *STATUS_COLS):
        assert row[k] == row0[k], k
    # ... but the advantage estimator saw reward + penalty, the penalty exactly as documented.
    pens = [_hand_penalty(r["length"], buffer, factor) for r in roll]
    assert any(p < 0 for p in pens) and any(r["length"] > MAX_NEW - buffer for r in roll)
    for r, pen in zip(roll, pens):
        assert r["overlong_penalty"] == pytest.approx(pen, abs=1e-6)
        assert float(rec.adv_in[0][r["position"], r["sample_index"]]) == pytest.approx(r["reward"] + pen, abs=1e-6)
        assert float(base[1].adv_in[0][r["position"], r["sample_index"]]) == r["reward"]
    assert row["overlong/penalty_mean"] == pytest.approx(sum(pens) / len(pens), abs=1e-6)
    assert row["overlong/penalized_share"] == sum(p < 0 for p in pens) / len(pens)
    assert not torch.equal(rec.loss_in[0]["adv"], base[1].loss_in[0]["adv"])


# ------------------------------------------------------------------------------------- dynamic sampling
DYN = dict(steps=4, checkpoint_every=2, warmup_steps=1, dynamic_sampling=True, dynamic_sampling_max_rounds=3)


@pytest.fixture(scope="module")
def dyn(tiny, tmp_path_factory):
    return _run(tiny, tmp_path_factory.mktemp("opt") / "dyn", tiny_cfg(**DYN))


def test_dynamic_sampling_keeps_informative_groups_and_advances_the_data(dyn, tiny):
    res, rec = dyn
    _, _, ids = tiny
    rows = _rows(res.steps_path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    # Every advantage call saw only the kept groups, each with reward variance, at most P of them.
    assert len(rec.adv_in) == sum(r["dynamic/groups_kept"] > 0 for r in rows)
    kept_calls = iter(rec.adv_in)
    pos = 0
    for r in rows:
        rounds, used, dropped, kept = (r["dynamic/rounds"], r["dynamic/prompts_consumed"], r["dynamic/groups_dropped"],
                                       r["dynamic/groups_kept"])
        assert 1 <= rounds <= DYN["dynamic_sampling_max_rounds"] and used == rounds * P
        assert kept <= P and kept + dropped <= used
        if dropped:
            assert used > P  # refilled with the next prompts
        if kept < P:
            assert rounds == DYN["dynamic_sampling_max_rounds"]  # partial batch only after the last round
        if kept:
            adv_in = next(kept_calls)
            assert adv_in.shape == (kept, G) and bool(((adv_in.max(1).values - adv_in.min(1).values) > 0).all())
        assert sum(r[c] for c in STATUS_COLS) == used * G  # every verified completion, all rounds
        # The engine was asked for the next `used` curriculum prompts in order, each with its own epoch.
        calls = [c for c in rec.gen if c[1] == r["step"] - 1]
        assert [i for c in calls for i in c[0]] == [ids[(pos + i) % len(ids)] for i in range(used)]
        seen = 0
        for call_ids, _, epoch in calls:
            assert {(pos + seen + i) // len(ids) for i in range(len(call_ids))} == {epoch}
            seen += len(call_ids)
        assert r["epoch"] == pos // len(ids)
        pos += used
    assert sum(r["dynamic/groups_dropped"] for r in rows) > 0, "no group was dropped: the test shows nothing"
    assert res.summary["data_position"] == pos > P * len(rows)
    # rollouts.parquet: 4 rows per step, from kept (informative) groups of that step.
    roll = _rows(res.rollouts_path)
    assert [r["step"] for r in roll] == [s for s in (1, 2, 3, 4) for _ in range(4)]


def test_resume_with_dynamic_sampling_equals_uninterrupted_without_duplicate_rollouts(dyn, tiny, tmp_path):
    full, _ = dyn
    out = tmp_path / "resumed"
    first, _ = _run(tiny, out, tiny_cfg(**DYN), stop_after_steps=2)
    assert not first.summary["done"]
    # A call killed after it logged step 3's rollouts but before its step-4 checkpoint: the resume from the
    # step-2 checkpoint must drop those rows, not append a second copy.
    import pyarrow as pa

    logged = _rows(out / "rollouts.parquet")
    assert [r["step"] for r in logged] == [1] * 4 + [2] * 4
    pq.write_table(pa.Table.from_pylist(logged + [dict(r, step=3) for r in logged[:4]]), out / "rollouts.parquet")
    second, _ = _run(tiny, out, tiny_cfg(**DYN))
    assert second.summary["resumed_from_step"] == 2 and second.summary["done"]
    assert second.summary["data_position"] == full.summary["data_position"]
    a, b = _rows(full.steps_path), _rows(second.steps_path)
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    for ra, rb in zip(a, b):
        for k in ("reward_mean", "epoch", "n_tokens", "dynamic/rounds", "dynamic/prompts_consumed",
                  "dynamic/groups_dropped", "dynamic/groups_kept", *STATUS_COLS):
            assert ra[k] == rb[k], (ra["step"], k)
        assert ra["lr"] == pytest.approx(rb["lr"], rel=1e-9)
        assert ra["loss"] == pytest.approx(rb["loss"], abs=1e-5)
    wa, wb = model_params(full.final_model_dir), model_params(second.final_model_dir)
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=1e-5, rtol=1e-4)
    ra, rb = _rows(full.rollouts_path), _rows(second.rollouts_path)
    assert len(rb) == 4 * 4
    assert len({(r["step"], r["prompt_id"], r["sample_index"]) for r in rb}) == len(rb)
    for x, y in zip(ra, rb):
        assert {k: v for k, v in x.items() if k != "advantage"} == {k: v for k, v in y.items() if k != "advantage"}
        assert x["advantage"] == pytest.approx(y["advantage"], abs=1e-6)


def test_partial_batch_is_trained_as_it_is_after_the_last_round(tiny, tmp_path):
    # Every group has zero variance: two rounds, nothing kept, the step still completes (G-partial-batch)
    # with a zero gradient, and the data position moved past both rounds.
    cfg = tiny_cfg(steps=1, dynamic_sampling=True, dynamic_sampling_max_rounds=2)
    res, rec = _run(tiny, tmp_path / "empty", cfg, verifier="_test_zero")
    (row,) = _rows(res.steps_path)
    assert (row["dynamic/rounds"], row["dynamic/prompts_consumed"], row["dynamic/groups_dropped"],
            row["dynamic/groups_kept"]) == (2, 2 * P, 2 * P, 0)
    assert row["health/G-verifier-format"] == 1 and row["status/incorrect"] == 2 * P * G
    assert row["loss"] == 0 and row["n_tokens"] == 0 and row["grad_norm"] == 0
    assert res.summary["done"] and res.summary["data_position"] == 2 * P
    assert not rec.adv_in and len(rec.gen) == 2
    assert not res.rollouts_path.exists()  # nothing trained, nothing to log
    before, after = model_params(tiny[0]), model_params(res.final_model_dir)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_step_that_trains_nothing_measures_the_kl_on_what_it_sampled(tiny, tmp_path):
    # Every group zero-variance, dynamic sampling drops them all: no token is trained, so the update measures no
    # KL. With a reference model (beta > 0) the KL to it is measured on the step's sampled completions instead,
    # so the KL detectors' window keeps filling exactly when a run collapses (no group with a learning signal).
    # Nothing was ever trained here, so the policy is the reference: the KL is ~0 (k3 >= 0), and finite.
    cfg = tiny_cfg(steps=2, dynamic_sampling=True, dynamic_sampling_max_rounds=2, beta=0.1)
    res, _ = _run(tiny, tmp_path / "kl", cfg, verifier="_test_zero")
    rows = _rows(res.steps_path)
    assert len(rows) == 2
    for row in rows:
        assert row["n_tokens"] == 0 and row["kl_ref_from_samples"] == 1
        assert 0 <= row["kl_ref_mean"] < 1e-4 and 0 <= row["kl_ref_max"] < 1e-3
    # A step that trains tokens measures the KL on them, as before.
    trained, _ = _run(tiny, tmp_path / "trained", tiny_cfg(steps=1, beta=0.1))
    (row,) = _rows(trained.steps_path)
    assert row["n_tokens"] > 0 and row["kl_ref_from_samples"] == 0 and row["kl_ref_mean"] >= 0


def test_step_rows_carry_the_base_models_numbers_on_the_prompts_each_step_drew(tiny, tmp_path):
    # `base_rollouts` (the pass-rate table's numbers per prompt) becomes base/* columns: the mean over exactly the
    # prompts a step consumed (every round of dynamic sampling, cycling past the curriculum's end), recomputed
    # here from the rows' own prompts_consumed. A prompt missing from the table is left out of the mean.
    _, rows, ids = tiny
    base = {pid: {"reward_mean": (i % 7) / 7, "truncation_share": (i % 3) / 3, "completion_len_mean": 5.0 + i}
            for i, pid in enumerate(ids) if i != 1}
    cfg = tiny_cfg(steps=4, dynamic_sampling=True, dynamic_sampling_max_rounds=2)
    res, _ = _run(tiny, tmp_path / "base", cfg, base_rollouts=base)
    pos = 0
    for row in _rows(res.steps_path):
        drawn = [ids[(pos + k) % len(ids)] for k in range(row["dynamic/prompts_consumed"])]
        known = [base[p] for p in drawn if p in base]
        for key in ("reward_mean", "truncation_share", "completion_len_mean"):
            assert row[f"base/{key}"] == pytest.approx(sum(b[key] for b in known) / len(known))
        pos += row["dynamic/prompts_consumed"]
    assert pos > len(ids)  # the run cycled past the curriculum's end
    plain, _ = _run(tiny, tmp_path / "plain", tiny_cfg(steps=1))
    assert not any(k.startswith("base/") for k in _rows(plain.steps_path)[0])


# ------------------------------------------------------------------------------------- adaptive sampling
# Chunks of G = 4 until 2 correct and 1 not correct, at most 14 (so a prompt that never gets there ends
# with a chunk cut to 2). Every completion of the run's steps is logged (100 > 2 x P x 14).
ADA = dict(steps=2, adaptive_sampling=True, adaptive_k_success=2, adaptive_k_failure=1, adaptive_max_samples=14,
           rollout_samples_per_step=100)


def _hand_stop(correct: list[bool], k_s: int, k_f: int, cap: int) -> int:
    """Where the stopping rule ends a prompt whose completions, in sample order, are `correct`: at the
    first chunk boundary (G, 2G, ..., cap) whose prefix has k_s correct and k_f incorrect ones, else cap."""
    n = G
    while n < cap and not (sum(correct[:n]) >= k_s and n - sum(correct[:n]) >= k_f):
        n = min(n + G, cap)
    return n


def test_adaptive_sampling_draws_chunks_until_enough_like_one_large_draw(tiny, tmp_path):
    cfg = tiny_cfg(**ADA)
    res, rec = _run(tiny, tmp_path / "ada", cfg)
    model_dir, rows, ids = tiny
    cap = ADA["adaptive_max_samples"]
    # Independent reference: step 1 samples the base weights, so one plain engine call drawing all 14
    # completions of every step-1 prompt must hold, in order, exactly what the chunks drew.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    template = get_template("qa")
    engine = HFEngine(AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir),
                      batch_size=cfg.rollout_batch_size)
    full = engine.generate([template.render(r["question"]) for r in rows[:P]], ids[:P],
                           SamplingParams(n=cap, temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=MAX_NEW,
                                          stop=template.stop, seed=0), step=0, epoch=0)
    status = [[STATUS_CYCLE[len(x.text) % 5] for x in g] for g in full]
    want_n = [_hand_stop([st is Status.CORRECT for st in sts], 2, 1, cap) for sts in status]
    assert G in want_n and max(want_n) == cap and any(G < n < cap for n in want_n), \
        f"sizes {want_n}: the test needs a prompt stopping early, one later and one at the cap"

    # The engine calls of step 1: a first chunk of G for every prompt, then, for the prompts still short,
    # chunks whose sample indices continue where the last ended; the last cut to fit the cap.
    calls = [(c_ids, first, n) for c_ids, step, first, n in rec.chunks if step == 0]
    want_calls, first = [], 0
    while first < cap:
        n = min(G, cap - first)
        active = [ids[k] for k in range(P) if want_n[k] > first]
        if active:
            want_calls.append((active, first, n))
        first += n
    assert calls == want_calls

    roll = [r for r in _rows(res.rollouts_path) if r["step"] == 1]
    assert len(roll) == sum(want_n)
    # Round-robin over the groups: sample 0 of each prompt, then sample 1 of each, ... skipping finished ones.
    order = [(k, i) for i in range(cap) for k in range(P) if i < want_n[k]]
    assert [(r["position"], r["sample_index"]) for r in roll] == order
    adv_rows = {}
    for r in roll:
        k, i = r["position"], r["sample_index"]
        x = full[k][i]
        assert (r["prompt_id"], r["completion"], r["length"]) == (ids[k], x.text, len(x.token_ids))
        assert r["status"] == status[k][i].value
        adv_rows[k, i] = r["advantage"]
    # GRPO advantages per group over the completions it has (unbiased std, eps 1e-6, 0 for a flat group).
    for k in range(P):
        rew = torch.tensor([float(st is Status.CORRECT) for st in status[k][:want_n[k]]], dtype=torch.float64)
        hand = torch.zeros_like(rew) if rew.max() == rew.min() else (rew - rew.mean()) / (rew.std() + 1e-6)
        for i in range(want_n[k]):
            assert adv_rows[k, i] == pytest.approx(float(hand[i]), abs=1e-5), (k, i)
    (adv_in, *_), (loss_in, *_) = rec.adv_in, rec.loss_in
    assert adv_in.shape == (sum(want_n),)  # the estimator got the ragged groups flat, with group ids
    assert loss_in["adv"].shape[0] == sum(want_n) and loss_in["kw"]["num_seqs"] == sum(want_n)

    steps = _rows(res.steps_path)
    one = steps[0]
    assert sum(one[c] for c in STATUS_COLS) == sum(want_n)
    assert one["samples_per_prompt_mean"] == sum(want_n) / P and one["samples_per_prompt_max"] == cap
    assert one["adaptive/enough_share"] == sum(
        sum(st is Status.CORRECT for st in status[k][:n]) >= 2 and n - sum(st is Status.CORRECT for st in status[k][:n]) >= 1
        for k, n in enumerate(want_n)) / P
    assert one["reward_mean"] == pytest.approx(sum(r["reward"] for r in roll) / len(roll))
    two = steps[1]  # trained weights: sizes differ, but the counts agree with each other
    assert sum(two[c] for c in STATUS_COLS) == two["samples_per_prompt_mean"] * P
    assert G <= two["samples_per_prompt_mean"] <= two["samples_per_prompt_max"] <= cap
    assert res.summary["done"] and res.summary["data_position"] == 2 * P


def test_adaptive_cap_below_the_first_chunk_fails_on_the_field():
    with pytest.raises(ValueError, match="adaptive_max_samples=3 is below group_size=4"):
        tiny_cfg(adaptive_sampling=True, adaptive_max_samples=3)
    assert not GRPOConfig().adaptive_sampling


# ------------------------------------------------------------------------------------ bounded staleness
# Staleness 1: step t (0-based) samples with the weights after max(0, t - 1) updates, ahead of the trainer.
STALE = dict(steps=3, max_staleness=1, checkpoint_every=1, rollout_samples_per_step=100)


def _draw(model_dir, step: int, cfg: GRPOConfig, tiny):
    """Step `step`'s groups drawn by a plain engine on the weights in `model_dir` (the prompts of that step)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, rows, ids = tiny
    template = get_template("qa")
    part = [(step * P + i) % len(ids) for i in range(P)]
    engine = HFEngine(AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(tiny[0]),
                      batch_size=cfg.rollout_batch_size)
    return engine.generate([template.render(rows[k]["question"]) for k in part], [ids[k] for k in part],
                           SamplingParams(n=G, temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=MAX_NEW,
                                          stop=template.stop, seed=0), step=step, epoch=step * P // len(ids))


def _completions(roll: list[dict], step: int) -> list[tuple]:
    return sorted((r["prompt_id"], r["sample_index"], r["completion"], r["length"]) for r in roll if r["step"] == step)


@pytest.fixture(scope="module")
def stale(tiny, tmp_path_factory):
    return _run(tiny, tmp_path_factory.mktemp("opt") / "stale", tiny_cfg(**STALE))


def test_staleness_one_samples_each_step_with_the_weights_one_update_behind(stale, tiny, tmp_path):
    from rlvr_core.artifacts.export import export_checkpoint

    res, _ = stale
    cfg = tiny_cfg(**STALE)
    rows, roll = _rows(res.steps_path), _rows(res.rollouts_path)
    assert [r["staleness"] for r in rows] == [0, 1, 1]
    # Independent reference: plain engine draws on the base weights (version 0) and on the weights after
    # update 1, exported by DeepSpeed's own checkpoint of step 1 (not by the ahead sampler's copies).
    v1 = export_checkpoint(res.checkpoints_dir, "step1", base_model_dir=tiny[0], out_dir=tmp_path / "v1").out_dir
    for step, weights in ((0, tiny[0]), (1, tiny[0]), (2, v1)):
        want = sorted((x.prompt_id, x.sample_index, x.text, len(x.token_ids))
                      for g in _draw(weights, step, cfg, tiny) for x in g)
        assert _completions(roll, step + 1) == want, f"step {step + 1}"
    # Step 2's rollouts are not step 2's on-policy ones (those come from v1), so the ratio is not 1 and the
    # on-policy guard, which only applies to staleness 0, stays quiet.
    on_policy = sorted((x.prompt_id, x.sample_index, x.text, len(x.token_ids)) for g in _draw(v1, 1, cfg, tiny) for x in g)
    assert _completions(roll, 2) != on_policy
    assert rows[0]["logprob_abs_diff"] < 1e-3 and rows[1]["logprob_abs_diff"] > 1e-3
    assert abs(rows[1]["ratio_mean"] - 1) > 1e-4
    assert all(r["health/G-onpolicy-ratio"] == 0 for r in rows)
    assert all(r["buffer/evicted"] == 0 and 0 <= r["buffer/size"] <= 2 for r in rows)
    assert all(r["t_generate_s"] > 0 for r in rows)


def test_resume_with_staleness_equals_uninterrupted(stale, tiny, tmp_path):
    full, _ = stale
    out = tmp_path / "resumed"
    first, _ = _run(tiny, out, tiny_cfg(**STALE), stop_after_steps=2)
    assert not first.summary["done"] and (out / "checkpoints" / "step2" / "ahead_weights.pt").is_file()
    second, _ = _run(tiny, out, tiny_cfg(**STALE))  # step 3 samples version 1, restored from the step-2 checkpoint
    assert second.summary["resumed_from_step"] == 2 and second.summary["done"]
    a, b = _rows(full.steps_path), _rows(second.steps_path)
    for ra, rb in zip(a, b, strict=True):
        for k in ("reward_mean", "n_tokens", "staleness", *STATUS_COLS):
            assert ra[k] == rb[k], (ra["step"], k)
        assert ra["loss"] == pytest.approx(rb["loss"], abs=1e-5)
    assert _completions(_rows(full.rollouts_path), 3) == _completions(_rows(second.rollouts_path), 3)
    wa, wb = model_params(full.final_model_dir), model_params(second.final_model_dir)
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=1e-5, rtol=1e-4)


def test_staleness_refuses_options_that_decide_while_sampling():
    for other in ("dynamic_sampling", "adaptive_sampling"):
        with pytest.raises(ValueError, match="max_staleness > 0 cannot be combined"):
            tiny_cfg(max_staleness=1, **{other: True})
