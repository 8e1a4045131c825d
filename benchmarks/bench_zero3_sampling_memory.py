"""Weights a ZeRO-3 rank holds while it samples: with the full sampling replica (`zero3_sampling_replica: true`)
and without it (the default: the HF engine samples the partitioned policy in lockstep). CPU, 2 ranks, gloo.

    python -m torch.distributed.run --nproc_per_node 2 benchmarks/bench_zero3_sampling_memory.py [--out F.json]

Each rank builds the same random-weight Qwen2 (seed 0, fp32; `--hidden`, `--layers`, `--vocab`) in memory,
wraps it with `rlvr_core.grpo.policy.build_policy` under ZeRO-3 (DeepSpeed's default bucket settings), then
samples 4 prompts x 2 samples x `--tokens` tokens through the trainer's HF rollout engine, once per mode.
Counted exactly, from the tensors (not the process RSS, which the allocator blurs): weight elements this rank
holds at every forward pre-hook of every submodule while sampling, i.e. its ZeRO-3 partitions, the weights
gathered whole at that moment, and the replica when there is one. Reported in MB at 4 bytes per element
(fp32 here; half that in bf16). The peak without a replica is bounded by DeepSpeed's prefetch and live-
parameter limits (stage3_prefetch_bucket_size 5e7, stage3_max_live_parameters 1e9 elements by default), not
by the model: the model here is bigger than the prefetch bucket so that bound shows.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def held_elements(policy_module, replica) -> int:
    """Weight elements this rank holds now: each ZeRO-3 parameter's partition plus its whole tensor when
    gathered (DeepSpeed frees a released one to an empty tensor), and every replica parameter."""
    n = 0
    for p in policy_module.parameters():
        n += p.ds_tensor.numel() if hasattr(p, "ds_tensor") else 0
        n += p.data.numel()
    if replica is not None:
        n += sum(p.numel() for p in replica.parameters())
    return n


def measure(model_fn, tok, rows, replica_mode: bool, tokens: int) -> dict:
    import torch

    from rlvr_core.experiment.config import GRPOConfig
    from rlvr_core.grpo import policy as update  # build_policy, ds_config, load_policy_model
    from rlvr_core.grpo.rollout_engine import make_rollout_engine
    from rlvr_core.grpo.trainer import _ensure_launch_env
    from rlvr_core.sampling.base import SamplingParams

    cfg = GRPOConfig(zero_stage=3, zero3_sampling_replica=replica_mode, prompts_per_step=4, group_size=2,
                     rollout_batch_size=8, precision="fp32", warmup_steps=0)
    added = _ensure_launch_env()
    original = update.load_policy_model
    update.load_policy_model = lambda *_a, **_k: model_fn()
    try:
        policy = update.build_policy("<in-memory>", cfg, 0, batch_size=8, world=int(os.environ["WORLD_SIZE"]),
                                     added_env=added)
    finally:
        update.load_policy_model = original
    dp = policy.dp
    lockstep = (lambda n: int(dp.max([float(n)])[0])) if policy.lockstep else None
    engine = make_rollout_engine("hf", base_model_dir="<in-memory>", tokenizer=tok, cfg=cfg, device=policy.device,
                                 seed=0, policy=policy.module, replica=policy.replica, own_copy=None,
                                 lockstep=lockstep)
    engine.sync(policy.current_weights())  # a replica is refreshed here (collective gather, one weight at a time)
    peak = [held_elements(policy.module, policy.replica)]
    hooks = [m.register_forward_pre_hook(lambda *_: peak.append(held_elements(policy.module, policy.replica)))
             for m in engine.model.modules()]
    mine = rows[dp.rank * 2:(dp.rank + 1) * 2]  # 2 prompts per rank
    t0 = time.perf_counter()
    out = engine.sampler.generate([r["question"] for r in mine], [r["id"] for r in mine],
                                  SamplingParams(n=2, temperature=1.0, max_new_tokens=tokens, seed=0))
    dt = time.perf_counter() - t0
    for h in hooks:
        h.remove()
    full = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in policy.module.parameters())
    partition = sum(p.ds_tensor.numel() for p in policy.module.parameters() if hasattr(p, "ds_tensor"))
    res = {"replica": replica_mode, "full_model_elements": full, "partition_elements": partition,
           "replica_elements": sum(p.numel() for p in policy.replica.parameters()) if policy.replica is not None else 0,
           "peak_held_while_sampling_elements": max(peak), "sample_s": round(dt, 2),
           "samples": [[s.token_ids for s in g] for g in out]}
    del engine, policy
    gc.collect()
    torch.distributed.barrier()
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    import torch

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    torch.set_num_threads(1)
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlvr_core.data.synthetic import SyntheticSpec, make_synthetic_dataset
    from rlvr_core.grpo.distributed import shutdown
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_gpu_grpo import padded_tokenizer

    rows = make_synthetic_dataset(SyntheticSpec(n_train=8, n_test=2, seed=0))["train"]
    tok = padded_tokenizer([r["question"] for r in rows], a.vocab, trained_vocab=512)
    conf = Qwen2Config(hidden_size=a.hidden, intermediate_size=int(a.hidden * 2.75), num_hidden_layers=a.layers,
                       num_attention_heads=a.hidden // 64, num_key_value_heads=2, vocab_size=a.vocab,
                       tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)

    def model_fn():
        torch.manual_seed(0)
        return Qwen2ForCausalLM(conf)

    res = [measure(model_fn, tok, rows, mode, a.tokens) for mode in (True, False)]
    if int(os.environ.get("RANK", "0")) == 0:
        same = res[0]["samples"] == res[1]["samples"]
        mb = 4 / 1e6
        report = {"model": {"hidden": a.hidden, "layers": a.layers, "vocab": a.vocab,
                            "elements": res[0]["full_model_elements"]}, "world_size": int(os.environ["WORLD_SIZE"]),
                  "same_samples_with_and_without_replica": same,
                  "modes": [{k: v for k, v in r.items() if k != "samples"} for r in res]}
        for r in res:
            print(f"replica={r['replica']!s:5}: model {r['full_model_elements'] * mb:7.1f} MB, this rank's partition "
                  f"{r['partition_elements'] * mb:7.1f} MB, replica {r['replica_elements'] * mb:7.1f} MB, peak held "
                  f"while sampling {r['peak_held_while_sampling_elements'] * mb:7.1f} MB (fp32), sampling "
                  f"{r['sample_s']} s")
        print(f"same samples with and without the replica: {same}")
        if a.out:
            a.out.write_text(json.dumps(report, indent=2) + "\n")
    shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
