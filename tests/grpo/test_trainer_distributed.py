"""GRPO trainer under data parallelism: N ranks with P/N prompts each must train exactly like one process
with all P (docs/grpo_training.md, "Multi-process and multi-node").

The 2-process test launches this file under `python -m torch.distributed.run --nproc_per_node 2` (gloo on
CPU, 1 thread per rank, a free MASTER_PORT); run as a script, the file is the worker (`_worker`). The
single-process references run in the pytest process with the same tiny model, verifier and configs
(grpo_helpers.py). Rewards, token counts and group statistics must be equal; losses, ratio
statistics, entropy, KL and the final weights within 1e-5; the pre-clip grad norm within 1e-4 relative
(AdamW is almost invariant to the gradient's scale, so the weights alone would not catch a loss that
is off by the world size).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from grpo_helpers import VERIFIER, model_params, tiny_cfg, train_tiny
import test_trainer_options  # noqa: F401,E402  (registers the _test_status and _test_sparse verifiers)

from rlvr_core.experiment.config import RewardConfig
from rlvr_core.grpo import trainer as trainer_mod
from rlvr_core.grpo.losses import grpo_loss, mask_from_lengths

# Every configuration the 2-process run trains, each also trained by one process for comparison. Together
# they cover every ZeRO stage, every loss aggregation, the KL term, a second epoch on the same rollouts
# (ratios leave 1), the evaluate hook under ZeRO-3 (a collective gather with rank 0 alone evaluating),
# and a resume from a checkpoint the two ranks saved together. lr 1e-3 rather than test_trainer's 1e-2:
# AdamW turns float-rounding-sized gradients into lr-sized steps of either sign, and at 1e-2 even one
# process under ZeRO-2 and ZeRO-3 (same maths, other summation order) ends 1.2e-5 apart after 2 steps.
LR = 1e-3
RUNS = {
    "z2_token_mean_resumed": dict(cfg=dict(zero_stage=2, loss_agg="token-mean", steps=3), calls=[1, None]),
    "z3_seq_mean_kl_eval": dict(cfg=dict(zero_stage=3, loss_agg="seq-mean-token-mean", beta=0.05, eval_every=1),
                                evaluate=True),
    "z1_sum_norm_rloo": dict(cfg=dict(zero_stage=1, loss_agg="seq-mean-token-sum-norm", advantage="rloo")),
    "z0_two_epochs": dict(cfg=dict(zero_stage=0, epochs_per_step=2, advantage="dr_grpo")),
    # DAPO dynamic sampling (rounds decided from gathered rewards), overlong penalty and Δlog p reweighting,
    # across a resume; verifier statuses cycle, so groups are dropped and refilled. Weights within 5e-5: the
    # ranks sum different subsets of the kept groups (one 1, the other 3, ...), and in one measured run one
    # element of all (the embedding of a rare token, moved 4.5e-4 where the median element moved 1.9e-3)
    # ended 1.4e-5 apart: AdamW's g / (|g| + eps) turns rounding in a near-zero gradient into a visible
    # step. Every other element agreed within 1e-6 and losses / grad norms within 1e-7 relative.
    "z2_dynamic_options_resumed": dict(cfg=dict(zero_stage=2, steps=3, dynamic_sampling=True,
                                                dynamic_sampling_max_rounds=3, overlong_buffer_len=8,
                                                overlong_penalty_factor=0.5, dlogp_reweight_c=0.5),
                                       calls=[1, None], verifier="_test_status", weight_tol=5e-5),
    # One round only, and only prompts with a gold divisible by 3 can have variance: the ranks keep
    # different numbers of groups, often none (a zero-loss forward/backward), under ZeRO-3's collectives.
    "z3_dynamic_sparse": dict(cfg=dict(zero_stage=3, dynamic_sampling=True, dynamic_sampling_max_rounds=1),
                              verifier="_test_sparse"),
    # Adaptive sampling: each rank loops over its own prompts' chunks (no collective inside), so the ranks
    # make different numbers of engine calls and train groups of different sizes.
    "z2_adaptive": dict(cfg=dict(zero_stage=2, adaptive_sampling=True, adaptive_k_success=2, adaptive_k_failure=1,
                                 adaptive_max_samples=14), verifier="_test_status"),
    # The same under ZeRO-3, where the ranks sample the partitioned policy in lockstep: a rank whose prompts
    # have enough samples joins the other's further rounds with empty engine calls (dummy forwards).
    "z3_adaptive": dict(cfg=dict(zero_stage=3, adaptive_sampling=True, adaptive_k_success=2, adaptive_k_failure=1,
                                 adaptive_max_samples=14), verifier="_test_status"),
    # Bounded staleness 1 under ZeRO-3: every step's weight sync is a gather (collective) in the trainer
    # thread while each rank's sampler thread runs ahead; resumed at step 2, whose checkpoint carries version 1.
    "z3_stale1_resumed": dict(cfg=dict(zero_stage=3, max_staleness=1, steps=3), calls=[2, None]),
}
LATE_SAVE_RUN = "z2_token_mean_resumed"  # rank 1 saves its partitions late (the worker's `late_save`)
EXACT = ("step", "epoch", "reward_mean", "reward_std", "zero_var_group_share", "n_tokens", "completion_len_mean",
         "truncation_share", "unique_frac_mean", "health/G-onpolicy-ratio", "health/G-kl-explosion",
         "health/G-fixed-seed", "health/G-verifier-format", "status/correct", "status/incorrect", "status/no_answer",
         "status/error", "status/timeout", "overlong/penalty_mean", "overlong/penalized_share", "dynamic/rounds",
         "dynamic/prompts_consumed", "dynamic/groups_dropped", "dynamic/groups_kept", "samples_per_prompt_mean",
         "samples_per_prompt_max")
CLOSE = ("loss", "pg_loss", "loss_last_epoch", "ratio_mean", "ratio_max", "ratio_min", "clip_frac",
         "clip_frac_low", "clip_frac_high", "approx_kl_old_new", "logprob_abs_diff", "entropy", "kl_ref_mean",
         "kl_ref_max", "drift/kl_mean", "drift/kl_max")


def _probe(model, tok) -> dict[str, float]:
    """An evaluate hook that needs every parameter whole: under ZeRO-3 a partitioned one has numel 0."""
    ids = torch.tensor([tok("Question: 1 + 2?\nAnswer:")["input_ids"]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    return {"numel": sum(p.numel() for p in model.parameters()),
            "param_sum": float(sum(p.detach().double().sum() for p in model.parameters())),
            "logit_abs_sum": float(logits.abs().sum())}


@contextlib.contextmanager
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)



# ------------------------------------------------------------------------------------------------- tests
def test_one_step_is_the_same_under_zero_1_2_and_3(tiny, tmp_path):
    res = {s: train_tiny(tiny, tmp_path / f"z{s}", tiny_cfg(zero_stage=s, steps=1)) for s in (1, 2, 3)}
    rows = {s: pq.read_table(r.steps_path).to_pylist()[0] for s, r in res.items()}
    weights = {s: model_params(r.final_model_dir) for s, r in res.items()}
    for s in (2, 3):
        assert rows[s]["reward_mean"] == rows[1]["reward_mean"]
        assert rows[s]["loss"] == pytest.approx(rows[1]["loss"], abs=1e-6)
        assert rows[s]["grad_norm"] == pytest.approx(rows[1]["grad_norm"], rel=1e-4)
        diff = max(float((weights[s][k] - weights[1][k]).abs().max()) for k in weights[1])
        assert diff < 1e-5, f"ZeRO-{s} weights differ from ZeRO-1 by {diff}"


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_rank_losses_with_global_normalisers_give_the_full_batch_gradient(agg):
    # What the trainer does on each of 2 ranks, without processes: each half of the batch is normalised
    # by the whole batch's counts and scaled by the world size; DeepSpeed then averages the gradients.
    g = torch.Generator().manual_seed(0)
    B, T, world = 8, 6, 2
    logp = (-torch.rand(B, T, generator=g, dtype=torch.float64) * 3).requires_grad_()
    old, ref = logp.detach() + 0.1 * torch.randn(B, T, generator=g, dtype=torch.float64), logp.detach() - 0.2
    adv, lengths = torch.randn(B, generator=g, dtype=torch.float64), torch.tensor([6, 1, 3, 6, 2, 5, 4, 6])
    mask = mask_from_lengths(lengths, T)
    kw = dict(beta=0.05, agg_mode=agg, norm_len=T)
    full, _ = grpo_loss(logp, old, adv, mask, ref_logp=ref, **kw)
    (want,) = torch.autograd.grad(full, logp)
    total, grad = 0.0, torch.zeros_like(logp)
    for r in range(world):
        sl = slice(r * B // world, (r + 1) * B // world)
        part, _ = grpo_loss(logp[sl], old[sl], adv[sl], mask[sl], ref_logp=ref[sl], num_tokens=int(mask.sum()),
                            num_seqs=B, **kw)
        total = total + part.detach()
        grad += torch.autograd.grad(part * world, logp)[0] / world
    torch.testing.assert_close(total, full.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, want, rtol=1e-12, atol=1e-12)


def test_prompts_not_divisible_by_world_size_fail_before_any_work(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(trainer_mod, "launch_world_size", lambda: 2)
    with pytest.raises(ValueError, match=r"prompts_per_step=3 is not divisible by the world size 2"):
        train_tiny(tiny, tmp_path / "odd", tiny_cfg(prompts_per_step=3))
    assert not (tmp_path / "odd").exists()


def test_two_processes_train_like_one(tiny, tmp_path):
    model_dir, rows, ids = tiny
    spec = {"model_dir": str(model_dir), "rows": rows, "ids": ids, "out": str(tmp_path / "ddp"), "runs": RUNS}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    from twoproc import run_two_ranks  # here: the launched ranks run this file without tests/ on sys.path

    proc, t_launch = run_two_ranks(__file__, tmp_path / "spec.json")
    assert proc.returncode == 0, proc.stdout[-4000:] + "\n" + proc.stderr[-8000:]

    # P = 3 on 2 ranks: both ranks refuse before DeepSpeed starts, with the message.
    for r in (0, 1):
        err = json.loads((tmp_path / "ddp" / f"odd_rank{r}.json").read_text())
        assert err["type"] == "ValueError" and "not divisible by the world size 2" in err["msg"]

    t0 = time.perf_counter()
    report = {"launch_s": round(t_launch, 1)}
    for name, run in RUNS.items():
        cfg = tiny_cfg(lr=LR, **run["cfg"])
        with _one_thread():  # like each rank; more threads than free cores only slows the busy test machine
            ref = trainer_mod.train_grpo(model_dir, rows, ids, tmp_path / "one" / name, cfg, template_id="qa",
                                         reward=RewardConfig(verifier=run.get("verifier", VERIFIER)),
                                         max_new_tokens=12, seed=0, evaluate=_probe if run.get("evaluate") else None)
        out = tmp_path / "ddp" / name
        a = pq.read_table(ref.steps_path).to_pylist()
        b = pq.read_table(out / "steps.parquet").to_pylist()
        assert len(a) == len(b) == cfg.steps
        for ra, rb in zip(a, b):
            for k in EXACT + (("adaptive/enough_share",) if cfg.adaptive_sampling else ()) + \
                    (("staleness", "buffer/evicted") if cfg.max_staleness else ()):
                assert ra[k] == rb[k], (name, ra["step"], k, ra[k], rb[k])
            for k in CLOSE:
                # relative too: lr 1e-2 moves the tiny policy far, token KLs to the reference reach ~140
                assert rb[k] == pytest.approx(ra[k], rel=1e-5, abs=1e-5, nan_ok=True), (name, ra["step"], k)
            assert rb["lr"] == pytest.approx(ra["lr"], rel=1e-9)
            assert rb["grad_norm"] == pytest.approx(ra["grad_norm"], rel=1e-4), (name, ra["step"])
            evals = sorted(k for k in ra if k.startswith("eval/"))
            assert evals == sorted(k for k in rb if k.startswith("eval/"))
            for k in evals:
                assert rb[k] == pytest.approx(ra[k], rel=1e-5), (name, ra["step"], k)
        if run.get("evaluate"):
            assert a[-1]["eval/numel"] == sum(p.numel() for p in model_params(model_dir).values())
        wa, wb = model_params(ref.final_model_dir), model_params(out / "final_model")
        diff = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
        assert diff < run.get("weight_tol", 1e-5), f"{name}: final weights differ by {diff}"
        n_off = sum(int(((wa[k] - wb[k]).abs() > 1e-6).sum()) for k in wa)
        if "weight_tol" in run:  # a wider bound for a few elements, not for the model
            assert n_off <= 10, f"{name}: {n_off} weights differ by more than 1e-6"
        summary = json.loads((out / "grpo_summary.json").read_text())
        assert summary["steps"] == cfg.steps and summary["done"]
        if len(run.get("calls", [None])) > 1:
            assert summary["resumed_from_step"] == run["calls"][0]
        if name == LATE_SAVE_RUN:  # while rank 1 was still writing a checkpoint, `latest` named an older one
            seen = json.loads((out / "latest_seen_rank1.json").read_text())
            assert len(seen) >= 2 and all(s["latest"] != s["tag"] for s in seen), seen

        # rollouts.parquet (rank 0 writes what the ranks picked): the same rows as one process, 4 per step.
        ra, rb = pq.read_table(ref.rollouts_path).to_pylist(), pq.read_table(out / "rollouts.parquet").to_pylist()
        assert len(ra) == len(rb) == sum(min(4, r["dynamic/groups_kept"] * cfg.group_size) for r in a), name
        for x, y in zip(ra, rb):
            assert {k: v for k, v in x.items() if k != "advantage"} == {k: v for k, v in y.items() if k != "advantage"}
            assert y["advantage"] == pytest.approx(x["advantage"], abs=1e-6), name
        seen = [json.loads((out / f"prompts_rank{r}.json").read_text()) for r in (0, 1)]
        if cfg.dynamic_sampling:
            # Every round's prompts, half on each rank: the two ranks' calls together are the curriculum's
            # next prompts_consumed ids of the run.
            used = sum(r["dynamic/prompts_consumed"] for r in a)
            assert sum(len(c) for c in seen[0]) == sum(len(c) for c in seen[1]) == used // 2, name
            want = [ids[i % len(ids)] for i in range(used)]
            assert sorted(i for r in (0, 1) for c in seen[r] for i in c) == sorted(want), name
        else:
            # Rank r sampled the r-th contiguous half of every step's prompts, in curriculum order.
            for step in range(cfg.steps):
                want = [ids[(step * cfg.prompts_per_step + i) % len(ids)] for i in range(cfg.prompts_per_step)]
                half = cfg.prompts_per_step // 2
                assert seen[0][step] == want[:half] and seen[1][step] == want[half:], (name, step)
        # ZeRO-3 samples the partitioned policy itself (lockstep), never a full replica, unless the ahead
        # sampler owns a copy (max_staleness); each rank holds about half of every weight.
        for r in (0, 1):
            for p in json.loads((out / f"policy_rank{r}.json").read_text()):
                assert p["replica"] is False, (name, r)
                if cfg.zero_stage == 3:
                    assert p["partitioned"], (name, r, p)
                    assert p["local_numel"] <= p["full_numel"] // 2 + 64, (name, r, p)
        report[name] = {"max_weight_diff": diff, "n_weights_off_1e-6": n_off, "kept": [r["dynamic/groups_kept"] for r in a],
                        "max_loss_diff": max(abs(ra["loss"] - rb["loss"]) for ra, rb in zip(a, b)),
                        "max_grad_norm_rel_diff": max(abs(ra["grad_norm"] / rb["grad_norm"] - 1) for ra, rb in zip(a, b))}
    report["one_process_refs_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(report, indent=1))


# ------------------------------------------------------------------------------------------------ worker
def _worker(spec_path: str) -> None:
    """One rank of the 2-process run: every configuration of the spec, then a clean exit of the group."""
    from rlvr_core.grpo.distributed import shutdown
    from rlvr_core.grpo.trainer import train_grpo
    from rlvr_core.sampling.hf import HFEngine

    torch.set_num_threads(1)
    spec = json.loads(Path(spec_path).read_text())
    rank, out = int(os.environ["RANK"]), Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    prompts: list[list[str]] = []
    generate = HFEngine.generate

    def recording_generate(self, prompts_, prompt_ids, params, **kw):
        # a rollout's first chunk (adaptive sampling adds more calls); ZeRO-3 lockstep's empty calls join others'
        if prompt_ids and not kw.get("first_sample_index"):
            prompts.append(list(prompt_ids))
        return generate(self, prompts_, prompt_ids, params, **kw)

    HFEngine.generate = recording_generate

    # ZeRO-3: every weight partitioned, however small (DeepSpeed keeps weights under 1e5 elements whole on
    # every rank by default, i.e. all of this tiny model's), so sampling the partitioned policy really gathers.
    from rlvr_core.grpo import policy as update  # ds_config lives in policy.py, where build_policy looks it up

    ds_config = update.ds_config

    def fully_partitioned(cfg, batch_size, world_size=1):
        conf = ds_config(cfg, batch_size, world_size)
        if cfg.zero_stage == 3:
            conf["zero_optimization"]["stage3_param_persistence_threshold"] = 0
        return conf

    update.ds_config = fully_partitioned
    # What each run sampled with: a full replica, or the partitioned policy itself (and how many weight
    # elements this rank held whole at most while sampling: its partition plus the layers being gathered).
    policies: list = []
    build_policy = trainer_mod.build_policy

    def recording_build_policy(*a, **kw):
        policies.append(build_policy(*a, **kw))
        return policies[-1]

    trainer_mod.build_policy = recording_build_policy

    # A checkpoint's `latest` may name it only once every rank's partition is on disk (a node lost in between
    # would leave a `latest` that cannot be loaded): in one run rank 1 writes its optimizer partition 0.5 s
    # late and records what `latest` named meanwhile.
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

    save, late = TorchCheckpointEngine.save, {"on": False, "seen": []}

    def late_save(self, state_dict, path):
        if late["on"] and rank == 1 and str(path).endswith("optim_states.pt"):
            time.sleep(0.5)
            latest = Path(path).parent.parent / "latest"
            late["seen"].append({"tag": Path(path).parent.name,
                                 "latest": latest.read_text().strip() if latest.is_file() else None})
        return save(self, state_dict, path)

    TorchCheckpointEngine.save = late_save

    def train(name: str, cfg, verifier: str = "_test_parity", **kw):
        return train_grpo(spec["model_dir"], spec["rows"], spec["ids"], out / name, cfg, template_id="qa",
                          reward=RewardConfig(verifier=verifier),  max_new_tokens=12, seed=0, **kw)

    try:
        train("odd", tiny_cfg(prompts_per_step=3))
        raise AssertionError("P=3 on 2 ranks was accepted")
    except ValueError as e:
        (out / f"odd_rank{rank}.json").write_text(json.dumps({"type": type(e).__name__, "msg": str(e)}))

    for name, run in spec["runs"].items():
        prompts.clear()
        policies.clear()
        late["on"] = name == LATE_SAVE_RUN
        for stop in run.get("calls", [None]):
            train(name, tiny_cfg(lr=LR, **run["cfg"]), run.get("verifier", "_test_parity"), stop_after_steps=stop,
                  evaluate=_probe if run.get("evaluate") else None)
        (out / name / f"prompts_rank{rank}.json").write_text(json.dumps(prompts))
        if late["on"] and rank == 1:
            (out / name / "latest_seen_rank1.json").write_text(json.dumps(late["seen"]))
        (out / name / f"policy_rank{rank}.json").write_text(json.dumps(
            [{"replica": p.replica is not None, "partitioned": p.partitioned, "lockstep": p.lockstep,
              "local_numel": sum(x.ds_tensor.numel() if hasattr(x, "ds_tensor") else x.numel()
                                 for x in p.module.parameters()),
              "full_numel": sum(x.ds_numel if hasattr(x, "ds_numel") else x.numel() for x in p.module.parameters())}
             for p in policies]))
    shutdown()


if __name__ == "__main__":
    _worker(sys.argv[1])
