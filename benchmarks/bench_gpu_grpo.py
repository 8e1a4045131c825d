"""GRPO steps of a real architecture at random weights on one GPU: rollout tokens/s, step-time split, MFU.

Why: every GRPO number so far comes from the demo's ~1M-parameter model on 2 CPU cores. This script is the
GPU path ready to run on a lent machine (one H100/H200, CUDA, no network, no hub): it builds a model of a
real shape (`--shape` qwen2.5-0.5b, qwen2.5-1.5b, qwen2.5-7b or qwen3-0.6b) with random weights and the real
vocabulary size (151936; 152064 for 7B; so N and the FLOPs are the real ones) and a tokenizer, both locally, then runs
`rlvr_core.grpo.trainer.train_grpo` for a few steps in bf16 with DeepSpeed (ZeRO stage configurable) and
reports, from the trainer's own steps.parquet (`t_rollout_s`, `t_reward_s`, `t_train_s`, `tokens_per_s`):

  step_s         the trainer's step time, gen_tok / tokens_per_s (the trainer divides by its own clock);
                 the split t_rollout_s + t_reward_s + t_train_s must add up to it
  rollout tok/s  completion tokens generated / t_rollout_s
  MFU            train-phase model FLOPs utilisation:
                   train_flops = (6 * epochs_per_step + 2 * [beta > 0]) * N * train_tokens
                   MFU = train_flops / t_train_s / (world_size * peak_bf16_dense_flops)
                 N = distinct parameters (tied embeddings once: the shared matrix is the LM head's matmul,
                 the embedding lookup costs no FLOPs); train_tokens = prompt + completion tokens of the P*G
                 trained sequences, no padding. 6N per token = forward (2N) + backward (4N) of every epoch
                 over the batch (the trainer re-runs the full prompt+completion forward: the rollout's
                 activations are not reused, so the prompt is counted); +2N per token for the frozen
                 reference model's forward when beta > 0. Not counted (so the MFU is conservative): padding
                 (the trainer's batch is padded to its longest sequence), attention score/value matmuls
                 (4 * layers * ctx * heads * head_dim per token forward, < 1% of 2N at these lengths), the
                 AdamW step, and activation recomputation (with gradient checkpointing, see --train-only).
                 t_train_s is the trainer's whole train phase: batch build, reference forward, forward,
                 loss, backward, DeepSpeed step (it ends on a .item() that waits for the GPU).
  rollout MFU    2 * N * (G * prompt tokens + completion tokens) / t_rollout_s / (world_size * peak) (the HF engine
                 prefills each sample's prompt on its own, then decodes one token at a time: memory-bound).

`--train-only` times the policy update alone, at batch sizes where rollouts would take minutes: no
generation; every sequence is a real prompt plus exactly --max-new-tokens random token ids from the whole
vocabulary, with random advantages and rollout log-probs. It builds the model in memory, directly on the GPU
in bf16, hands it to `rlvr_core.grpo.policy.build_policy` (DeepSpeed, the ZeRO stage asked for) and calls
`update_policy(..., loss_fn=grpo_loss)` --steps times: per step the train time, train tokens/s, the MFU
above (and, with --gradient-checkpointing, also counting the recompute: 8N instead of 6N per token, labelled
mfu_with_recompute), and the step's peak GPU memory (allocated and reserved; counters reset per step).
The trainer's micro-batching and memory settings pass through when given (--micro-batch-size,
--max-tokens-per-micro-batch, --logprob-chunk-size, --gradient-checkpointing -> GRPOConfig fields), and
--offload-optimizer [on|auto] moves ZeRO's optimizer state and step to the CPU (a patch of the trainer's
DeepSpeed config, in this script only). benchmarks/gpu_check.py runs the whole GPU check (docs/gpu.md).

Peak bf16 dense FLOP/s: H100 SXM 989e12, H200 989e12 (H100 PCIe 756e12, A100 312e12), detected from
torch.cuda.get_device_name(); `--peak-tflops` overrides (needed on anything else, CPU included, for an MFU).
Step 1 includes CUDA/allocator warm-up: the summary line averages steps 2.. when there are several.

Under a launcher (`torchrun --nproc_per_node 8 benchmarks/bench_gpu_grpo.py ...` or `deepspeed --num_gpus 8
...`) every rank builds the same model (same seed) in its own folder and trains its P / world_size prompts;
steps.parquet holds the global numbers, so rank 0 alone reports and the MFU divides by world_size * peak.

The tokenizer: the project's byte-level BPE (rlvr_core/tiny/tokenizer.py) trained in-process on the
synthetic task's text, then padded to the model's vocabulary with synthetic BPE entries (every 2-byte
string, then 3-byte ones; their merges rank after the trained ones) so that every id a random-weight model
samples decodes to real bytes, as with Qwen's own 151k vocabulary. (Without that, `decode` of an id
beyond the vocabulary silently yields '' with tokenizers 0.23, and most completions would be empty
text.) The reward is a cheap registered test verifier, `_bench_parity` (1 when the completion text has an
even number of characters, like `_test_parity` in tests/grpo/test_trainer.py), so random-weight groups
still have reward variance and a gradient.

Run (repository root):

    python benchmarks/bench_gpu_grpo.py --shape qwen2.5-0.5b --steps 4 --out /tmp/gpu_grpo.json  # on a GPU
    python benchmarks/bench_gpu_grpo.py --shape tiny --allow-cpu --steps 2 --peak-tflops 1           # smoke
    python benchmarks/bench_gpu_grpo.py --shape qwen2.5-0.5b --train-only -P 64 -G 8 --max-new-tokens 512 \
        --steps 3 --micro-batch-size 16                                                            # update only
    python benchmarks/bench_gpu_grpo.py --shape tiny --allow-cpu --train-only --steps 2 --peak-tflops 1  # seconds
    python benchmarks/bench_gpu_grpo.py --shape qwen2.5-0.5b --allow-cpu --steps 1 \
        --prompts-per-step 2 --group-size 2 --max-new-tokens 8                                      # CPU, slow

docs/gpu.md has the command for a lent GPU machine, what it prints, and how the same config would run
with vLLM on 8 GPUs and on several nodes.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a file from anywhere: the project's package is importable
    sys.path.insert(0, str(ROOT))

VERIFIER = "_bench_parity"
TEMPLATE = "qa"
SEED = 0

# Architecture shapes (the public config.json values of each model); vocab at the real size.
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen2.5-0.5b": ("qwen2", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                   num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True,
                                   rope_theta=1e6, vocab_size=151936, max_position_embeddings=32768,
                                   rms_norm_eps=1e-6, use_sliding_window=False)),
    "qwen3-0.6b": ("qwen3", dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                 num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                                 tie_word_embeddings=True, rope_theta=1e6, vocab_size=151936,
                                 max_position_embeddings=40960, rms_norm_eps=1e-6)),
    # Qwen/Qwen2.5-1.5B and Qwen/Qwen2.5-7B config.json (the base models' max_position_embeddings, 131072;
    # the Instruct ones say 32768, which changes nothing here). 1.5B ties its embeddings, 7B does not, and
    # 7B's embedding is padded to 152064 rows (its tokenizer has ~151.7k entries).
    "qwen2.5-1.5b": ("qwen2", dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                   num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True,
                                   rope_theta=1e6, vocab_size=151936, max_position_embeddings=131072,
                                   rms_norm_eps=1e-6, use_sliding_window=False)),
    "qwen2.5-7b": ("qwen2", dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                 num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False,
                                 rope_theta=1e6, vocab_size=152064, max_position_embeddings=131072,
                                 rms_norm_eps=1e-6, use_sliding_window=False)),
    # Small enough for a CPU smoke test; the same code path (Qwen2, tied, padded BPE vocabulary).
    "tiny": ("qwen2", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                           num_key_value_heads=1, tie_word_embeddings=True, rope_theta=1e6, vocab_size=2048,
                           max_position_embeddings=1024, rms_norm_eps=1e-6, use_sliding_window=False)),
}

# Peak dense bf16 tensor-core FLOP/s (vendor datasheets, without sparsity), matched on the device name.
PEAK_BF16 = [("H200", 989e12), ("H100 PCIE", 756e12), ("H100 NVL", 835e12), ("H100", 989e12),
             ("A100", 312e12)]

FORMULA = ("MFU = (6*epochs_per_step + 2*[beta>0]) * N * train_tokens / t_train_s / (world_size * peak_flops); "
           "train_tokens = prompt + completion tokens of the P*G trained sequences (no padding), "
           "N = distinct parameters (tied embeddings once)")
ROLLOUT_FORMULA = ("rollout_mfu = 2 * N * (G * prompt_tokens + completion_tokens) / t_rollout_s "
                   "/ (world_size * peak_flops)")


# ------------------------------------------------------------------------------------------------- setup
def peak_flops(device_name: str | None, override_tflops: float | None) -> tuple[float | None, str]:
    if override_tflops is not None:
        return override_tflops * 1e12, "--peak-tflops"
    if device_name:
        up = device_name.upper()
        for key, peak in PEAK_BF16:
            if key in up:
                return peak, f"table ({key})"
    return None, "unknown device: pass --peak-tflops"


def register_verifier() -> None:
    from rlvr_core.verifiers.base import Outcome, Status, _REGISTRY, register_verifier as reg

    class _BenchParity:
        name, version = VERIFIER, "1"
        can_hang = False  # a length check

        def warm_up(self) -> None:
            pass

        def verify(self, response: str, gold) -> Outcome:
            ok = len(response) % 2 == 0
            return Outcome(Status.CORRECT if ok else Status.INCORRECT, float(ok), str(len(response)),
                           self.name, self.version)

    if VERIFIER not in _REGISTRY:
        reg(VERIFIER)(_BenchParity)


def padded_tokenizer(texts: list[str], vocab_size: int, trained_vocab: int = 1024):
    """The project's byte-level BPE trained on `texts` (at most `trained_vocab` entries), padded to exactly
    `vocab_size` entries with synthetic BPE tokens: every 2-byte symbol string not already there, then
    3-byte ones, each with its merge appended after the trained merges (lowest priority). Every id in
    [0, vocab_size) then decodes to real bytes."""
    from tokenizers import Tokenizer, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from rlvr_core.tiny.tokenizer import BOS, EOS, PAD, train_tokenizer

    trained = train_tokenizer(texts, vocab_size=min(trained_vocab, vocab_size))
    state = json.loads(trained.backend_tokenizer.to_str())
    vocab: dict[str, int] = state["model"]["vocab"]
    merges: list = state["model"]["merges"]
    as_pair = not merges or isinstance(merges[0], list)  # tokenizers >= 0.20 stores [a, b], older "a b"
    next_id = max(vocab.values()) + 1
    if next_id != len(trained):
        raise RuntimeError(f"unexpected tokenizer layout: {len(trained)} tokens, next id {next_id}")
    need = vocab_size - next_id
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())

    def candidates():
        for a in alphabet:
            for b in alphabet:
                yield a, b
        for a in alphabet:
            for b in alphabet:
                for c in alphabet:
                    yield a + b, c

    for left, right in candidates():
        if need <= 0:
            break
        s = left + right
        if s in vocab:
            continue
        vocab[s] = next_id
        merges.append([left, right] if as_pair else f"{left} {right}")
        next_id += 1
        need -= 1
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(state)), eos_token=EOS,
                                  pad_token=PAD, bos_token=BOS, unk_token=None, padding_side="left",
                                  clean_up_tokenization_spaces=False, model_max_length=4096)
    if len(tok) != vocab_size:
        raise RuntimeError(f"padded tokenizer has {len(tok)} tokens, wanted {vocab_size}")
    return tok


def build_tokenizer(shape: str, rows: list[dict]):
    """The padded tokenizer of `shape` (see `padded_tokenizer`), checked to decode high ids to text."""
    vocab = SHAPES[shape][1]["vocab_size"]
    tok = padded_tokenizer([f"Question: {r['question']}\nAnswer: {r['answer']}" for r in rows], vocab)
    probe = [vocab - 1, len(tok) // 2, 300]
    if not tok.decode(probe, skip_special_tokens=True):
        raise RuntimeError(f"ids {probe} decode to nothing: the padded vocabulary is broken")
    return tok


def build_model(shape: str, tok, device: str):
    """Random-weight model of `shape` (seed SEED), built directly on `device` in bf16: a 7B model's float32
    init on the CPU takes minutes and 30 GB; on the GPU in bf16 it takes seconds and 15 GB. Returns (model,
    facts)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    family, arch = SHAPES[shape]
    config_cls, model_cls = (Qwen2Config, Qwen2ForCausalLM) if family == "qwen2" else (Qwen3Config, Qwen3ForCausalLM)
    cfg = config_cls(**arch, attention_dropout=0.0, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                     bos_token_id=tok.bos_token_id)
    t1 = time.perf_counter()
    torch.manual_seed(SEED)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # parameters are created (and randomly initialised) in bf16
    try:
        with torch.device(device):
            model = model_cls(cfg)
    finally:
        torch.set_default_dtype(prev)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                               bos_token_id=tok.bos_token_id)
    n_params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    facts = {"arch": model_cls.__name__, "n_params": n_params, "tied_embeddings": tied,
             "vocab_size": arch["vocab_size"], "tokenizer_len": len(tok), "config": arch,
             "dtype": str(next(model.parameters()).dtype), "build_s": round(time.perf_counter() - t1, 2)}
    return model, facts


def build_model_dir(shape: str, rows: list[dict], out: Path, device: str) -> dict[str, Any]:
    """Tokenizer + random-weight model of `shape` saved in `out` (from_pretrained-loadable). Returns facts.

    Saved in bf16 (half the bytes); the trainer loads it with from_pretrained in float32 on the CPU and
    DeepSpeed casts it to bf16 on the device, so a 7B model passes through 30 GB of host memory here (the
    --train-only mode skips this round trip, see `train_only`)."""
    import torch

    t0 = time.perf_counter()
    tok = build_tokenizer(shape, rows)
    t_tok = time.perf_counter() - t0
    model, facts = build_model(shape, tok, device)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    facts.update(tokenizer_s=round(t_tok, 2), build_s=round(time.perf_counter() - t0 - t_tok, 2))
    del model
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return facts


# ------------------------------------------------------------------------------- trainer settings passed on
# GRPOConfig field -> its flag here; a field is set only when its flag is given (else the config's default).
PASS_THROUGH = {"micro_batch_size": "--micro-batch-size", "max_tokens_per_micro_batch": "--max-tokens-per-micro-batch",
                "logprob_chunk_size": "--logprob-chunk-size", "gradient_checkpointing": "--gradient-checkpointing",
                "pack_sequences": "--pack-sequences"}


def config_extras(a: argparse.Namespace) -> dict[str, Any]:
    """The grpo.memory settings the command line sets."""
    return {f: getattr(a, f) for f in PASS_THROUGH if getattr(a, f) not in (None, False)}


# bytes per parameter of the trained state: bf16 weights (2) + bf16 gradients (2) + fp32 master weights (4)
# + AdamW's two fp32 moments (8). One rank holds all of it (ZeRO shards it only across ranks).
STATE_BYTES = {"device": 16, "device_offloaded": 4, "host_offloaded": 14}


def offload_plan(mode: str, n_params: int, world: int, gpu_bytes: int | None) -> bool:
    """Whether to offload the optimizer (`--offload-optimizer off|on|auto`; auto: when the trained state,
    16 bytes per parameter over `world` ranks, would take more than 85% of the GPU)."""
    if mode == "auto":
        return bool(gpu_bytes) and STATE_BYTES["device"] * n_params / world > 0.85 * gpu_bytes
    return mode == "on"


def patch_ds_config(offload: bool) -> None:
    """Bench-only: with `offload`, the trainer's DeepSpeed config (rlvr_core.grpo.policy.ds_config, looked up
    when the engine is built) gets `offload_optimizer: {device: cpu, pin_memory: false}`, and AdamW becomes
    DeepSpeed's CPU Adam (its default under offload; the trainer's `torch_adam` would run torch's AdamW on
    the CPU, several times slower; CPU Adam is a C++ op JIT-compiled on first use, ~1 min). Unpinned: pinning
    ~100 GB of host buffers for a 7B model takes long and leaves the host little room; a long run would
    want pinned memory for faster copies."""
    if not offload:
        return
    from rlvr_core.grpo import policy as update  # build_policy, ds_config, load_policy_model

    base = update.ds_config

    def with_offload(cfg, batch_size: int, world_size: int = 1) -> dict[str, Any]:
        conf = base(cfg, batch_size, world_size)
        conf["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
        conf["optimizer"]["params"].pop("torch_adam", None)
        return conf

    update.ds_config = with_offload


def check_memory(n_params: int, world: int, offload: bool, cuda: bool) -> dict[str, Any]:
    """Estimated trained state per rank (STATE_BYTES) against the GPU's and the host's memory; SystemExit(3)
    before any work when it cannot fit (a host out of memory can take the whole machine down)."""
    import torch

    gpu = torch.cuda.get_device_properties(0).total_memory if cuda else None
    dev = (STATE_BYTES["device_offloaded"] if offload else STATE_BYTES["device"]) * n_params / world
    host = STATE_BYTES["host_offloaded"] * n_params / world if offload else 0
    avail = None
    try:
        avail = int(next(ln for ln in open("/proc/meminfo") if ln.startswith("MemAvailable")).split()[1]) * 1024
    except (OSError, StopIteration, ValueError):
        pass
    est = {"state_gib_device": dev / 2**30, "state_gib_host": host / 2**30, "offload_optimizer": offload,
           "gpu_total_gib": gpu / 2**30 if gpu else None, "host_available_gib": avail / 2**30 if avail else None}
    if cuda and gpu and dev > 0.95 * gpu:
        raise SystemExit(f"the trained state needs ~{dev / 2**30:.0f} GiB on the GPU ({gpu / 2**30:.0f} GiB): "
                         "use --offload-optimizer, more ranks, or a larger GPU")
    if offload and avail and host > 0.9 * avail:
        raise SystemExit(f"optimizer offload needs ~{host / 2**30:.0f} GiB of host memory, {avail / 2**30:.0f} GiB "
                         "is available")
    return est


# ---------------------------------------------------------------------------------------- --train-only
def train_only_inputs(tok, rows: list[dict], *, step: int, P: int, G: int, T: int, rank: int, world: int,
                      device) -> tuple[Any, int]:
    """This rank's TrainInputs for `step` without a rollout: the step's P prompts in data order (this rank's
    contiguous P/world), each with G completions of exactly T random token ids from the whole vocabulary
    (seeded by step and rank), random advantages (standard normal) and rollout log-probs near a random-weight
    model's (-ln V + 0.1 * normal, so the PPO ratio stays near 1 and most tokens get a gradient). Returns
    (inputs, prompt tokens of all P prompts)."""
    import torch

    from rlvr_core.data.templates import get_template
    from rlvr_core.grpo.losses import mask_from_lengths
    from rlvr_core.grpo.update import TrainInputs, build_batch

    template = get_template(TEMPLATE)
    enc = [tok(template.render(rows[(step * P + i) % len(rows)]["question"]))["input_ids"] for i in range(P)]
    k = P // world
    mine = enc[rank * k:(rank + 1) * k]
    g = torch.Generator().manual_seed(SEED * 1_000_003 + step * 1009 + rank)
    V = len(tok)
    comp = torch.randint(0, V, (k * G, T), generator=g)
    batch = build_batch([p for p in mine for _ in range(G)], comp.tolist(), tok.pad_token_id)
    batch = {key: v.to(device) for key, v in batch.items()}
    adv = torch.randn(k * G, generator=g).to(device)
    old = (-math.log(V) + 0.1 * torch.randn(k * G, T, generator=g)).to(device)
    inputs = TrainInputs(batch, adv, old, mask_from_lengths(batch["lengths"], T), P * G)
    return inputs, sum(len(e) for e in enc)


def build_train_only_policy(model, cfg, *, batch_size: int, world: int):
    """`rlvr_core.grpo.policy.build_policy` on the in-memory `model` (its `load_policy_model`, which reads a
    folder with from_pretrained in float32, is swapped for this model while it runs). DeepSpeed then holds
    what it holds in train_grpo: bf16 weights on the device, fp32 master weights and AdamW moments. No
    sampling here, so a ZeRO-3 sampling replica, if the trainer made one, is dropped."""
    from rlvr_core.grpo import policy as update  # build_policy, ds_config, load_policy_model
    from rlvr_core.grpo.trainer import _ensure_launch_env

    added = _ensure_launch_env()
    original = update.load_policy_model
    update.load_policy_model = lambda *_a, **_k: model
    try:
        policy = update.build_policy("<in-memory>", cfg, SEED, batch_size=batch_size, world=world, added_env=added)
    finally:
        update.load_policy_model = original
    if getattr(policy, "replica", None) is not None:
        policy.replica = None
        gc.collect()
    return policy


def train_only_steps(policy, cfg, tok, rows: list[dict], n_params: int, *, steps: int, T: int, rank: int,
                     world: int, peak: float | None, ckpt: bool) -> list[dict]:
    """`steps` calls of update_policy (loss_fn=grpo_loss) on train_only_inputs, each timed from a device
    sync to a device sync, with the peak GPU memory of that step alone (peak counters reset per step).

    guard_tol is huge: G-logprob-temp compares the trainer's log-probs with the rollout's at step 0, and
    the rollout log-probs here are made up, so the guard would stop the run on a mismatch it is meant to
    find in a real rollout."""
    import torch

    from rlvr_core.grpo.losses import grpo_loss
    from rlvr_core.grpo.update import update_policy

    cuda = policy.device.type == "cuda"
    P, G, E = cfg.prompts_per_step, cfg.group_size, cfg.epochs_per_step
    factor = 6 * E + (2 if cfg.beta > 0 else 0)
    factor_recompute = 8 * E + (2 if cfg.beta > 0 else 0)
    recs = []
    for step in range(steps):
        inputs, ptok = train_only_inputs(tok, rows, step=step, P=P, G=G, T=T, rank=rank, world=world,
                                         device=policy.device)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        upd = update_policy(policy, cfg, inputs, loss_fn=grpo_loss, step=step, norm_len=None, guard_tol=1e30)
        if cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        train_tokens = G * ptok + P * G * T
        if upd.n_tokens != P * G * T:
            raise RuntimeError(f"trainer trained {upd.n_tokens} completion tokens, expected {P * G * T}")
        flops = factor * n_params * train_tokens
        rec = {"step": step + 1, "t_train_s": dt, "prompt_tokens": ptok, "completion_tokens": P * G * T,
               "train_tokens": train_tokens, "train_tokens_per_s": train_tokens / dt, "train_flops": flops,
               "train_tflops_per_s": flops / dt / 1e12, "mfu": flops / dt / peak if peak else None,
               "loss": upd.loss_last, "grad_norm": upd.grad_norm,
               "max_memory_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
               "max_memory_reserved_gib": torch.cuda.max_memory_reserved() / 2**30 if cuda else None}
        if ckpt:  # the hardware's view: the checkpointed forward runs twice (8N per token instead of 6N)
            rec["mfu_with_recompute"] = factor_recompute * n_params * train_tokens / dt / peak if peak else None
        recs.append(rec)
        if rank == 0:
            print(f"  [train-only] step {step + 1}/{steps}: {dt:.3f} s, {train_tokens / dt:,.0f} train tok/s, "
                  f"MFU {_pct(rec['mfu'])}" + (f", peak alloc {rec['max_memory_allocated_gib']:.1f} GiB, "
                                               f"reserved {rec['max_memory_reserved_gib']:.1f} GiB" if cuda else ""),
                  flush=True)
    return recs


def summarise_train_only(recs: list[dict]) -> dict[str, Any]:
    """Means over steps 2.. when there are several (step 1 carries the warm-up); peaks over all steps."""
    part = recs[1:] if len(recs) > 1 else recs
    t = sum(r["t_train_s"] for r in part)
    out = {"steps_averaged": [r["step"] for r in part], "mean_t_train_s": t / len(part),
           "train_tokens_per_s": sum(r["train_tokens"] for r in part) / t,
           "train_tflops_per_s": sum(r["train_flops"] for r in part) / t / 1e12}
    for k in ("mfu", "mfu_with_recompute"):
        if k in part[0]:
            out[k] = None if part[0][k] is None else sum(r[k] * r["t_train_s"] for r in part) / t
    for k in ("max_memory_allocated_gib", "max_memory_reserved_gib"):
        out[k] = None if recs[0][k] is None else max(r[k] for r in recs)
    return out


def print_train_only_report(res: dict[str, Any]) -> None:
    m, d, s, sm = res["model"], res["device"], res["settings"], res["summary"]
    print()
    print(f"GRPO policy update only (no rollouts), random weights: {res['shape']} ({m['arch']}, N = "
          f"{m['n_params']:,}, vocab {m['vocab_size']}, tied {m['tied_embeddings']}); device {d['name']}, peak "
          f"{d['peak_tflops'] or 'n/a'} TFLOP/s ({d['peak_source']}), world_size {res['world_size']}")
    print(f"settings: P={s['prompts_per_step']} G={s['group_size']} completion tokens={s['max_new_tokens']} "
          f"(fixed, random ids) zero_stage={s['zero_stage']} offload_optimizer={s['offload_optimizer']} "
          f"precision={s['precision']} beta={s['beta']} epochs={s['epochs_per_step']} trainer extras={s['extras']}")
    ck = "mfu_with_recompute" in sm
    print(f"{'step':>5} {'train_s':>9} {'train_tok':>9} {'tok/s':>10} {'TFLOP/s':>9} {'MFU':>7}"
          + (f" {'MFU(8N)':>8}" if ck else "") + f" {'alloc GiB':>9} {'reserved GiB':>12}")
    for r in res["steps"]:
        print(f"{r['step']:>5} {r['t_train_s']:>9.3f} {r['train_tokens']:>9} {r['train_tokens_per_s']:>10.0f} "
              f"{r['train_tflops_per_s']:>9.2f} {_pct(r['mfu']):>7}" + (f" {_pct(r['mfu_with_recompute']):>8}" if ck
                                                                       else "")
              + f" {r['max_memory_allocated_gib'] or 0:>9.2f} {r['max_memory_reserved_gib'] or 0:>12.2f}")
    print(f"mean {sm['steps_averaged']}: {sm['mean_t_train_s']:.3f} s, {sm['train_tokens_per_s']:,.0f} train tok/s, "
          f"MFU {_pct(sm.get('mfu'))}" + (f" (counting the recompute, 8N: {_pct(sm['mfu_with_recompute'])})" if ck
                                          else ""))
    print(res["formula"])
    print(f"wall: tokenizer {res['wall_s']['tokenizer']:.1f} s, model {res['wall_s']['model']:.1f} s, DeepSpeed "
          f"init {res['wall_s']['policy']:.1f} s, steps {res['wall_s']['steps']:.1f} s; result: {res['out']}")


# ------------------------------------------------------------------------------------------------ report
def step_records(steps: list[dict], prompt_tokens: list[int], n_params: int, *, G: int, E: int, beta: float,
                 peak: float | None) -> list[dict]:
    """Per step; `peak` is the whole job's (world_size * one device's peak), None when unknown."""
    out = []
    for r, ptok in zip(steps, prompt_tokens):
        n_drawn = r["samples_per_prompt_mean"] * r["dynamic/prompts_consumed"]
        gen = int(round(r["completion_len_mean"] * n_drawn))
        step_s = gen / r["tokens_per_s"] if r["tokens_per_s"] > 0 else float("nan")
        comp = int(r["n_tokens"])
        train_tokens = G * ptok + comp
        train_flops = (6 * E + (2 if beta > 0 else 0)) * n_params * train_tokens
        rollout_flops = 2 * n_params * (G * ptok + gen)
        rec = {
            "step": int(r["step"]), "t_rollout_s": r["t_rollout_s"], "t_reward_s": r["t_reward_s"],
            "t_train_s": r["t_train_s"], "step_s": step_s, "tokens_per_s": r["tokens_per_s"],
            "gen_tokens": gen, "rollout_tokens_per_s": gen / r["t_rollout_s"] if r["t_rollout_s"] > 0 else None,
            "prompt_tokens": ptok, "completion_tokens": comp, "train_tokens": train_tokens,
            "train_flops": train_flops, "train_tflops_per_s": train_flops / r["t_train_s"] / 1e12,
            "mfu": train_flops / r["t_train_s"] / peak if peak else None,
            "rollout_flops": rollout_flops,
            "rollout_mfu": rollout_flops / r["t_rollout_s"] / peak if peak and r["t_rollout_s"] > 0 else None,
            "reward_mean": r["reward_mean"], "reward_std": r["reward_std"],
            "completion_len_mean": r["completion_len_mean"], "logprob_abs_diff": r["logprob_abs_diff"],
        }
        out.append(rec)
    return out


def summarise(recs: list[dict], peak: float | None) -> dict[str, Any]:
    """Over steps 2.. when there are several (step 1 carries the warm-up), else step 1."""
    part = recs[1:] if len(recs) > 1 else recs
    tot = {k: sum(r[k] for r in part) for k in ("t_rollout_s", "t_reward_s", "t_train_s", "step_s", "gen_tokens",
                                                 "train_flops", "rollout_flops")}
    n = len(part)
    return {
        "steps_averaged": [r["step"] for r in part],
        **{f"mean_{k}": tot[k] / n for k in ("t_rollout_s", "t_reward_s", "t_train_s", "step_s")},
        "tokens_per_s": tot["gen_tokens"] / tot["step_s"],
        "rollout_tokens_per_s": tot["gen_tokens"] / tot["t_rollout_s"] if tot["t_rollout_s"] > 0 else None,
        "train_tflops_per_s": tot["train_flops"] / tot["t_train_s"] / 1e12,
        "mfu": tot["train_flops"] / tot["t_train_s"] / peak if peak else None,
        "rollout_mfu": tot["rollout_flops"] / tot["t_rollout_s"] / peak if peak and tot["t_rollout_s"] > 0 else None,
        "split_frac": {p: tot[f"t_{p}_s"] / tot["step_s"] for p in ("rollout", "reward", "train")},
    }


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.2f}%"


def print_report(res: dict[str, Any]) -> None:
    m, d, s = res["model"], res["device"], res["settings"]
    print()
    print(f"GRPO, random weights: {res['shape']} ({m['arch']}, N = {m['n_params']:,} parameters, vocab "
          f"{m['vocab_size']}, tied embeddings {m['tied_embeddings']})")
    mem = d.get("max_memory_allocated_gib")
    print(f"device: {d['name']}; peak bf16 dense {d['peak_tflops'] or 'n/a'} TFLOP/s ({d['peak_source']}); "
          f"world_size {res['world_size']}; torch {res['versions']['torch']}, deepspeed "
          f"{res['versions']['deepspeed']}, transformers {res['versions']['transformers']}"
          + (f"; peak GPU memory (rank 0) {mem:.1f} GiB" if mem is not None else ""))
    print(f"settings: P={s['prompts_per_step']} G={s['group_size']} max_new_tokens={s['max_new_tokens']} "
          f"zero_stage={s['zero_stage']} precision={s['precision']} engine={s['engine']} beta={s['beta']} "
          f"epochs_per_step={s['epochs_per_step']} steps={s['steps']} rollout_batch_size={s['rollout_batch_size']}")
    hdr = (f"{'step':>5} {'rollout_s':>10} {'reward_s':>9} {'train_s':>9} {'step_s':>9} {'gen_tok':>8} "
           f"{'rollout tok/s':>13} {'tok/s':>9} {'train_tok':>9} {'train TFLOP/s':>13} {'MFU':>7} {'roll.MFU':>8}")
    print(hdr)
    for r in res["steps"]:
        print(f"{r['step']:>5} {r['t_rollout_s']:>10.3f} {r['t_reward_s']:>9.3f} {r['t_train_s']:>9.3f} "
              f"{r['step_s']:>9.3f} {r['gen_tokens']:>8} {r['rollout_tokens_per_s'] or 0:>13.1f} "
              f"{r['tokens_per_s']:>9.1f} {r['train_tokens']:>9} {r['train_tflops_per_s']:>13.4f} "
              f"{_pct(r['mfu']):>7} {_pct(r['rollout_mfu']):>8}")
    sm = res["summary"]
    label = "mean" + (f" {sm['steps_averaged'][0]}-{sm['steps_averaged'][-1]}" if len(sm["steps_averaged"]) > 1
                      else f" {sm['steps_averaged'][0]}")
    print(f"{label:>5} {sm['mean_t_rollout_s']:>10.3f} {sm['mean_t_reward_s']:>9.3f} {sm['mean_t_train_s']:>9.3f} "
          f"{sm['mean_step_s']:>9.3f} {'':>8} {sm['rollout_tokens_per_s'] or 0:>13.1f} {sm['tokens_per_s']:>9.1f} "
          f"{'':>9} {sm['train_tflops_per_s']:>13.4f} {_pct(sm['mfu']):>7} {_pct(sm['rollout_mfu']):>8}")
    fr = sm["split_frac"]
    print(f"split: rollout {fr['rollout']:.1%}, reward {fr['reward']:.1%}, train {fr['train']:.1%} of the step; "
          f"tokens per step (P*G sequences): prompt {res['steps'][-1]['prompt_tokens'] * s['group_size']}, "
          f"completion {res['steps'][-1]['completion_tokens']}")
    print(res["formula"])
    print(res["rollout_formula"])
    print(f"wall: build {res['wall_s']['build']:.1f} s, train_grpo {res['wall_s']['train_grpo']:.1f} s "
          f"(incl. DeepSpeed init, checkpoint and final save); result: {res['out']}")


# -------------------------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    ap.add_argument("--train-only", action="store_true",
                    help="time the policy update alone: no rollouts, completions of exactly --max-new-tokens random "
                         "token ids, random advantages; build_policy + update_policy for --steps steps")
    ap.add_argument("--engine", choices=["hf", "vllm"], default="hf",
                    help="rollout engine, passed to train_grpo(engine=...): hf (transformers generate) or vllm "
                         "(a colocated in-process vLLM engine per rank)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--prompts-per-step", "-P", type=int, default=8)
    ap.add_argument("--group-size", "-G", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--zero-stage", type=int, choices=[0, 1, 2, 3], default=2)
    ap.add_argument("--offload-optimizer", nargs="?", const="on", default="off", choices=["off", "on", "auto"],
                    help="ZeRO optimizer offload to the CPU (fp32 master weights, AdamW moments and the step on "
                         "the host; needs --zero-stage >= 1). auto: only when the trained state (16 bytes per "
                         "parameter) would take more than 85%% of the GPU. Bench-only: patches the trainer's "
                         "DeepSpeed config")
    ap.add_argument("--beta", type=float, default=0.0, help="KL coefficient (> 0 adds the reference forward)")
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--rollout-batch-size", type=int, default=None, help="default P*G (one decode batch)")
    ap.add_argument("--micro-batch-size", dest="micro_batch_size", type=int, default=None,
                    help="grpo.memory.micro_batch_size: sequences per forward/backward per rank")
    ap.add_argument("--max-tokens-per-micro-batch", dest="max_tokens_per_micro_batch", type=int, default=None,
                    help="grpo.memory.max_tokens_per_micro_batch: token budget of a micro-batch")
    ap.add_argument("--logprob-chunk-size", dest="logprob_chunk_size", type=int, default=None,
                    help="grpo.memory.logprob_chunk_size: rows per chunk of the log-prob computation (0 = full)")
    ap.add_argument("--gradient-checkpointing", dest="gradient_checkpointing", action="store_true",
                    help="grpo.memory.gradient_checkpointing (the MFU is then also reported counting the recompute)")
    ap.add_argument("--pack-sequences", dest="pack_sequences", action="store_true",
                    help="grpo.memory.pack_sequences: several sequences per row, no padding between them")
    ap.add_argument("--peak-tflops", type=float, default=None, help="peak bf16 dense TFLOP/s (overrides detection)")
    ap.add_argument("--device-check", dest="device_check", action="store_true", default=True,
                    help="(default) refuse the real shapes without CUDA")
    ap.add_argument("--allow-cpu", dest="device_check", action="store_false",
                    help="run any shape on the CPU (slow; for checking that it builds and trains)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    ap.add_argument("--work", type=Path, default=None, help="working folder (default: a temporary one, removed)")
    ap.add_argument("--keep-work", action="store_true", help="keep the model, checkpoints and steps.parquet")
    ap.add_argument("--out", type=Path, default=None, help="result JSON (default: <tmp>/bench_gpu_grpo_<shape>.json)")
    return ap.parse_args(argv)


def _device_facts(cuda: bool, peak: float | None, peak_source: str, name: str) -> dict[str, Any]:
    import torch

    return {"name": name, "cuda": cuda, "peak_flops": peak, "peak_tflops": peak / 1e12 if peak else None,
            "peak_source": peak_source,
            "total_memory_gib": torch.cuda.get_device_properties(0).total_memory / 2**30 if cuda else None,
            "max_memory_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None}


def _versions() -> dict[str, Any]:
    import deepspeed
    import torch
    import transformers

    return {"torch": torch.__version__, "deepspeed": deepspeed.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "cuda": torch.version.cuda}


def _write(out_json: Path, result: dict[str, Any]) -> None:
    """Written to a temporary name and renamed: a reader never sees half a file (a run stopped mid-write)."""
    out_json.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_json.with_name(out_json.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(out_json)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and a.device_check and a.shape != "tiny":
        print(f"refusing to run --shape {a.shape} without CUDA (no GPU visible); pass --allow-cpu to run it on "
              "the CPU anyway (slow), or use --shape tiny", file=sys.stderr)
        return 2
    if a.offload_optimizer != "off" and a.zero_stage == 0:
        print("--offload-optimizer needs --zero-stage 1, 2 or 3", file=sys.stderr)
        return 2
    # The trainer defaults DeepSpeed to its CPU accelerator when nothing says otherwise; on a GPU say cuda.
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if cuda else "cpu")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if a.threads:
        torch.set_num_threads(a.threads)

    from rlvr_core.experiment.config import GRPOConfig
    from rlvr_core.data.synthetic import SyntheticSpec, make_synthetic_dataset

    extras = config_extras(a)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    device_name = (torch.cuda.get_device_name() if cuda else f"CPU ({platform.processor() or platform.machine()})")
    peak, peak_source = peak_flops(device_name if cuda else None, a.peak_tflops)
    register_verifier()
    rows = make_synthetic_dataset(SyntheticSpec(n_train=max(64, a.prompts_per_step * a.steps), n_test=8,
                                                seed=SEED))["train"]
    cfg = GRPOConfig(enabled=True, steps=a.steps, prompts_per_step=a.prompts_per_step, group_size=a.group_size,
                     temperature=1.0, top_p=1.0, lr=a.lr, warmup_steps=0, beta=a.beta, zero_stage=a.zero_stage,
                     precision="bf16", rollout_batch_size=a.rollout_batch_size or a.prompts_per_step * a.group_size,
                     checkpoint_every=10**6, rollout_samples_per_step=0, memory=extras)
    ctx = {"cuda": cuda, "rank": rank, "world": world, "rows": rows, "cfg": cfg, "extras": extras,
           "device_name": device_name, "peak": peak, "peak_source": peak_source,
           "out_json": a.out or Path(tempfile.gettempdir()) / f"bench_gpu_grpo_{a.shape}.json"}
    return run_train_only(a, ctx) if a.train_only else run_full(a, ctx)


def run_train_only(a: argparse.Namespace, ctx: dict[str, Any]) -> int:
    """--train-only: build the model in memory on the device, the policy, then time update_policy."""
    import torch

    cuda, rank, world, cfg = ctx["cuda"], ctx["rank"], ctx["world"], ctx["cfg"]
    t0 = time.perf_counter()
    tok = build_tokenizer(a.shape, ctx["rows"])
    t_tok = time.perf_counter() - t0
    model, facts = build_model(a.shape, tok, "cuda" if cuda else "cpu")
    t_model = time.perf_counter() - t0 - t_tok
    gpu = torch.cuda.get_device_properties(0).total_memory if cuda else None
    offload = offload_plan(a.offload_optimizer, facts["n_params"], world, gpu)
    memory = check_memory(facts["n_params"], world, offload, cuda)
    patch_ds_config(offload)
    if rank == 0:
        print(f"built {a.shape}: N = {facts['n_params']:,} ({facts['dtype']}, {t_model:.1f} s); trained state "
              f"~{memory['state_gib_device']:.1f} GiB on the device, ~{memory['state_gib_host']:.1f} GiB on the host "
              f"(offload_optimizer={offload})", flush=True)
    t1 = time.perf_counter()
    policy = build_train_only_policy(model, cfg, batch_size=a.prompts_per_step * a.group_size, world=world)
    del model
    t_policy = time.perf_counter() - t1
    job_peak = ctx["peak"] * world if ctx["peak"] else None
    ckpt = bool(ctx["extras"].get("gradient_checkpointing"))
    t2 = time.perf_counter()
    recs = train_only_steps(policy, cfg, tok, ctx["rows"], facts["n_params"], steps=a.steps, T=a.max_new_tokens,
                            rank=rank, world=world, peak=job_peak, ckpt=ckpt)
    t_steps = time.perf_counter() - t2
    if rank != 0:
        return 0
    result = {
        "mode": "train_only", "shape": a.shape, "world_size": world,
        "device": {**_device_facts(cuda, ctx["peak"], ctx["peak_source"], ctx["device_name"]), "memory_plan": memory},
        "versions": _versions(),
        "settings": {"prompts_per_step": a.prompts_per_step, "group_size": a.group_size,
                     "max_new_tokens": a.max_new_tokens, "zero_stage": a.zero_stage, "offload_optimizer": offload,
                     "precision": cfg.precision, "beta": cfg.beta, "epochs_per_step": cfg.epochs_per_step,
                     "steps": a.steps, "extras": ctx["extras"], "lr": cfg.lr, "seed": SEED,
                     "threads": torch.get_num_threads()},
        "model": facts,
        "formula": FORMULA + (" (headline); with gradient checkpointing mfu_with_recompute counts 8N instead of 6N"
                              if ckpt else ""),
        "flops_per_train_token": (6 * cfg.epochs_per_step + (2 if cfg.beta > 0 else 0)) * facts["n_params"],
        "steps": recs, "summary": summarise_train_only(recs),
        "wall_s": {"tokenizer": t_tok, "model": t_model, "policy": t_policy, "steps": t_steps},
        "out": str(ctx["out_json"]),
    }
    _write(ctx["out_json"], result)
    print_train_only_report(result)
    return 0


def run_full(a: argparse.Namespace, ctx: dict[str, Any]) -> int:
    """GRPO steps with rollouts through train_grpo; after every step the result JSON holds the steps so far
    (`"partial": true`), so a run stopped by a time limit still reports."""
    import torch
    import pyarrow.parquet as pq

    from rlvr_core.experiment.config import RewardConfig
    from rlvr_core.grpo.trainer import train_grpo

    cuda, rank, world, cfg, rows, out_json = (ctx[k] for k in ("cuda", "rank", "world", "cfg", "rows", "out_json"))
    P, G = a.prompts_per_step, a.group_size
    job_peak = ctx["peak"] * world if ctx["peak"] else None
    root = a.work or Path(tempfile.mkdtemp(prefix="bench_gpu_grpo_"))
    work = root / f"rank{rank}" if world > 1 else root  # every rank its own model and output folder
    work.mkdir(parents=True, exist_ok=True)
    try:
        t0 = time.perf_counter()
        model_dir = work / "model"
        facts = build_model_dir(a.shape, rows, model_dir, "cuda" if cuda else "cpu")
        t_build = time.perf_counter() - t0
        gpu = torch.cuda.get_device_properties(0).total_memory if cuda else None
        patch_ds_config(offload_plan(a.offload_optimizer, facts["n_params"], world, gpu))
        if rank == 0:
            print(f"built {a.shape}: {facts['arch']}, N = {facts['n_params']:,}, tokenizer {facts['tokenizer_len']} "
                  f"tokens ({facts['tokenizer_s']} s), model {facts['build_s']} s", flush=True)
        prompt_tokens = step_prompt_tokens(model_dir, rows, P, a.steps)
        base = {"mode": "full", "shape": a.shape, "engine": a.engine, "world_size": world,
                "settings": settings_of(a, cfg, ctx["extras"]), "model": facts, "formula": FORMULA,
                "rollout_formula": ROLLOUT_FORMULA, "out": str(out_json)}
        done: list[dict] = []

        def on_step(row: dict) -> None:  # rank 0: the steps so far, in case the run is stopped
            done.append(row)
            recs = step_records(done, prompt_tokens, facts["n_params"], G=G, E=cfg.epochs_per_step, beta=cfg.beta,
                                peak=job_peak)
            _write(out_json, {**base, "partial": True, "steps": recs, "summary": summarise(recs, job_peak)})

        if cuda:
            torch.cuda.reset_peak_memory_stats()
        t1 = time.perf_counter()
        res = train_grpo(model_dir, rows, [r["id"] for r in rows], work / "run", cfg, template_id=TEMPLATE,
                         reward=RewardConfig(verifier=VERIFIER), max_new_tokens=a.max_new_tokens, seed=SEED,
                         progress=lambda msg: print(f"  [trainer] {msg}", flush=True), engine=a.engine,
                         on_step=on_step)
        t_train = time.perf_counter() - t1
        if rank != 0:
            return 0
        steps = pq.read_table(res.steps_path).to_pylist()
        check_steps(steps, P)
        recs = step_records(steps, prompt_tokens, facts["n_params"], G=G, E=cfg.epochs_per_step, beta=cfg.beta,
                            peak=job_peak)
        result = {**base, "partial": False,
                  "device": _device_facts(cuda, ctx["peak"], ctx["peak_source"], ctx["device_name"]),
                  "versions": _versions(),
                  "tokens_per_step": {"sequences": P * G, "prompt": recs[-1]["prompt_tokens"] * G,
                                      "completion": recs[-1]["completion_tokens"], "train": recs[-1]["train_tokens"]},
                  "flops_per_train_token": (6 * cfg.epochs_per_step + (2 if cfg.beta > 0 else 0)) * facts["n_params"],
                  "steps": recs, "summary": summarise(recs, job_peak),
                  "wall_s": {"build": t_build, "train_grpo": t_train}}
        _write(out_json, result)
        print_report(result)
    finally:
        if not a.keep_work and a.work is None:  # a temporary folder of this rank's own
            shutil.rmtree(root, ignore_errors=True)
    return 0


def settings_of(a: argparse.Namespace, cfg, extras: dict[str, Any]) -> dict[str, Any]:
    import torch

    return {"prompts_per_step": a.prompts_per_step, "group_size": a.group_size, "max_new_tokens": a.max_new_tokens,
            "zero_stage": a.zero_stage, "offload_optimizer": a.offload_optimizer, "precision": cfg.precision,
            "engine": a.engine, "beta": cfg.beta, "epochs_per_step": cfg.epochs_per_step, "steps": a.steps,
            "rollout_batch_size": cfg.rollout_batch_size, "lr": cfg.lr, "temperature": cfg.temperature,
            "threads": torch.get_num_threads(), "template": TEMPLATE, "verifier": VERIFIER, "seed": SEED,
            "extras": extras}


def step_prompt_tokens(model_dir: Path, rows: list[dict], P: int, steps: int) -> list[int]:
    """Prompt tokens of each step's P prompts (data order, no dynamic sampling), tokenized as the trainer
    does (same tokenizer and call)."""
    from transformers import AutoTokenizer

    from rlvr_core.data.templates import get_template

    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    template = get_template(TEMPLATE)
    return [sum(len(tok(template.render(rows[(s * P + i) % len(rows)]["question"]))["input_ids"]) for i in range(P))
            for s in range(steps)]


def check_steps(steps: list[dict], P: int) -> None:
    missing = {"t_rollout_s", "t_reward_s", "t_train_s", "tokens_per_s", "n_tokens", "completion_len_mean",
               "samples_per_prompt_mean", "dynamic/prompts_consumed"} - set(steps[0])
    if missing:
        raise RuntimeError(f"steps.parquet lacks the columns {sorted(missing)}")
    for r in steps:
        if int(r["dynamic/prompts_consumed"]) != P:
            raise RuntimeError(f"step {r['step']} consumed {r['dynamic/prompts_consumed']} prompts, expected {P}")


if __name__ == "__main__":
    code = main()
    try:
        from rlvr_core.grpo.distributed import shutdown

        shutdown()
    except Exception:  # noqa: BLE001 - best effort: the process group may not exist
        pass
    sys.exit(code)
