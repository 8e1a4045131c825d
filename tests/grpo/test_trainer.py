"""GRPO trainer (rlvr_core.grpo.trainer): real DeepSpeed steps on CPU with a tiny model built here.

The model is warm-started for a few steps only, so its gsm8k reward would be almost always 0 (no
signal). The loop tests use a test verifier instead, `_test_parity` (reward 1 when the completion text
has an even number of characters; tests/grpo/grpo_helpers.py, with the tiny model and the config the GRPO
tests share): groups then nearly always have reward variance, so every step produces a gradient. Everything else is the production path: HFEngine rollouts, VerifierPool,
grpo_loss, DeepSpeed ZeRO, checkpoints.

Multi-process runs make DeepSpeed compile its shared-memory op on first use (~35 s); the suite shares the
project's cache for it (TORCH_EXTENSIONS_DIR, tests/conftest.py), so that cost is paid once per checkout. A
single process compiles nothing (test below).
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
os.environ.setdefault("DS_ACCELERATOR", "cpu")

from grpo_helpers import model_params, tiny_cfg, train_tiny  # noqa: E402
from rlvr_core.grpo.losses import grpo_loss, mask_from_lengths  # noqa: E402
from rlvr_core.experiment.guards import GuardError  # noqa: E402
from rlvr_core.grpo.logprobs import sequence_logprobs  # noqa: E402
from rlvr_core.grpo.trainer import rows_for_curriculum  # noqa: E402
from rlvr_core.grpo.update import build_batch  # noqa: E402


def test_steps_change_every_parameter_and_record_metrics(tiny, tmp_path):
    res = train_tiny(tiny, tmp_path / "run", tiny_cfg())
    before, after = model_params(tiny[0]), model_params(res.final_model_dir)
    assert before.keys() == after.keys()
    unchanged = [k for k in before if torch.equal(before[k], after[k])]
    assert not unchanged, f"parameters not updated: {unchanged}"

    steps = pq.read_table(res.steps_path).to_pylist()
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        # On-policy, one epoch: the first-epoch ratio is exactly ~1 and nothing is clipped (G-onpolicy-ratio).
        assert abs(r["ratio_mean"] - 1) < 1e-4 and r["clip_frac"] == 0
        assert r["logprob_abs_diff"] < 1e-4
        assert r["grad_norm"] > 0 and r["lr"] > 0 and r["tokens_per_s"] > 0
        for k in ("reward_mean", "zero_var_group_share", "completion_len_mean", "truncation_share",
                  "unique_frac_mean", "entropy", "t_rollout_s", "t_reward_s", "t_train_s"):
            assert k in r
    assert res.summary["steps"] == 2 and res.summary["done"]
    assert (res.checkpoints_dir / "latest").read_text().strip() == "step2"


def test_logprob_guard_fires_on_tempered_trainer_logprobs(tiny, tmp_path):
    # Planted G-logprob-temp bug: the trainer divides logits by the sampling temperature (0.8).
    with pytest.raises(GuardError) as e:
        train_tiny(tiny, tmp_path / "bad", tiny_cfg(logprob_temperature=0.8, steps=1))
    msg = str(e.value)
    assert "G-logprob-temp" in msg and "sampling temperature 0.8" in msg and "temperature 1" in msg


def test_pad_id_and_zero_inside_completion_do_not_change_the_loss(tiny):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny[0]).eval()
    tok = AutoTokenizer.from_pretrained(tiny[0])
    pad = tok.pad_token_id
    prompts = [tok("Question: 2 + 2?\nAnswer:")["input_ids"], tok("Question: hi\nAnswer:")["input_ids"]]
    # Real tokens equal to the pad id and to 0 in the middle of completions (G-pad-mask).
    comps = [[5, pad, 0, 7, pad], [0, 9]]

    def loss_for(filler: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b = build_batch(prompts, comps, filler)
        mask = mask_from_lengths(b["lengths"], b["targets"].shape[1])
        logp, _ = sequence_logprobs(model, b)
        loss, _ = grpo_loss(logp, logp.detach(), torch.tensor([1.0, -1.0]), mask)
        return loss, logp, mask

    with torch.no_grad():
        l_pad, logp, mask = loss_for(pad)
        l_zero, _, _ = loss_for(0)
        l_other, _, _ = loss_for(123)
    assert mask.sum() == 7 and mask[0].all()  # every completion token counts, whatever its id
    assert torch.equal(l_pad, l_zero) and torch.equal(l_pad, l_other)
    # Each token's log-prob equals an unpadded single-sequence forward.
    with torch.no_grad():
        for b, (p, c) in enumerate(zip(prompts, comps)):
            logits = model(torch.tensor([p + c])).logits[0].float()
            ref = torch.log_softmax(logits[len(p) - 1:len(p) - 1 + len(c)], -1).gather(-1, torch.tensor(c)[:, None])[:, 0]
            torch.testing.assert_close(logp[b, :len(c)], ref, atol=1e-5, rtol=1e-5)


def test_missing_curriculum_id_fails_loudly(tiny):
    _, rows, ids = tiny
    with pytest.raises(KeyError, match="1 of 3 curriculum ids"):
        rows_for_curriculum(rows, ids[:2] + ["nope"])


def test_resume_reproduces_the_uninterrupted_run(tiny, tmp_path):
    cfg = tiny_cfg(steps=4, checkpoint_every=2, warmup_steps=1)
    full = train_tiny(tiny, tmp_path / "full", cfg)
    first = train_tiny(tiny, tmp_path / "resumed", cfg, stop_after_steps=2)  # "killed" after step 2
    assert not first.summary["done"] and not first.final_model_dir.exists()
    second = train_tiny(tiny, tmp_path / "resumed", cfg)
    assert second.summary["resumed_from_step"] == 2 and second.summary["done"]
    a, b = pq.read_table(full.steps_path).to_pylist(), pq.read_table(second.steps_path).to_pylist()
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    for ra, rb in zip(a, b):
        assert ra["reward_mean"] == rb["reward_mean"]  # same prompts, same seeds, same weights
        assert ra["lr"] == pytest.approx(rb["lr"], rel=1e-9)
        assert ra["loss"] == pytest.approx(rb["loss"], abs=1e-5)
    pa_, pb = model_params(full.final_model_dir), model_params(second.final_model_dir)
    for k in pa_:
        torch.testing.assert_close(pa_[k], pb[k], atol=1e-5, rtol=1e-4)


def test_zero_stages_1_and_2_agree(tiny, tmp_path):
    runs = {s: pq.read_table(train_tiny(tiny, tmp_path / f"z{s}", tiny_cfg(zero_stage=s)).steps_path).to_pylist()
            for s in (1, 2)}
    for r1, r2 in zip(runs[1], runs[2]):
        assert r1["loss"] == pytest.approx(r2["loss"], abs=1e-6)
        assert r1["reward_mean"] == r2["reward_mean"]
        assert r1["grad_norm"] == pytest.approx(r2["grad_norm"], rel=1e-4)


def test_launcher_variables_it_invented_do_not_outlive_the_engine(tiny, tmp_path, monkeypatch):
    # Left in os.environ, a made-up MASTER_PORT is inherited by every process started later, which then
    # fails to listen on the port this process's group holds (EADDRINUSE, seen in the integration tests).
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    res = train_tiny(tiny, tmp_path / "run", tiny_cfg(steps=1))
    assert res.summary["done"]
    assert "MASTER_PORT" not in os.environ


def test_one_process_compiles_no_deepspeed_op(tiny, tmp_path, monkeypatch):
    # DeepSpeed's CPU backend would JIT-build its shared-memory all-reduce (~35 s on a fresh machine) into
    # TORCH_EXTENSIONS_DIR; one process has nothing to reduce, so that directory must stay empty.
    ext = tmp_path / "torch_extensions"
    ext.mkdir()
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(ext))
    res = train_tiny(tiny, tmp_path / "run", tiny_cfg(steps=1))
    assert res.summary["done"] and list(ext.iterdir()) == []


def test_lr_schedule_spans_the_run_with_several_epochs_per_step(tiny, tmp_path):
    # Two updates per step step DeepSpeed's scheduler twice: laid out in steps, the cosine would reach its
    # floor (cos_min_ratio x lr, where it stays flat) halfway through. Laid out in updates, the lr each
    # step ends on keeps falling and reaches the floor at the last step.
    cfg = tiny_cfg(steps=4, epochs_per_step=2, warmup_steps=0, lr=1e-3, cos_min_ratio=0.1)
    lrs = [r["lr"] for r in pq.read_table(train_tiny(tiny, tmp_path / "run", cfg).steps_path).to_pylist()]
    assert len(lrs) == 4 and all(a > b for a, b in zip(lrs, lrs[1:])), lrs
    assert lrs[-1] == pytest.approx(0.1 * 1e-3), lrs
