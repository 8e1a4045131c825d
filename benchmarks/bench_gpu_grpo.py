"""GRPO steps of a real architecture at random weights on one GPU: rollout tokens/s, step-time split, MFU.

Why: every GRPO number so far comes from the demo's ~1M-parameter model on 2 CPU cores. This script is the
GPU path ready to run on a lent machine (one H100/H200, CUDA, no network, no hub): it builds a model of a
real shape (Qwen2.5-0.5B, or Qwen3-0.6B with `--shape qwen3-0.6b`) with random weights and the real
vocabulary size (151936, so N and the FLOPs are the real ones) and a tokenizer, both locally, then runs
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
                 AdamW step, and activation recomputation (the trainer uses none).
                 t_train_s is the trainer's whole train phase: batch build, reference forward, forward,
                 loss, backward, DeepSpeed step (it ends on a .item() that waits for the GPU).
  rollout MFU    2 * N * (G * prompt tokens + completion tokens) / t_rollout_s / (world_size * peak) (the HF engine
                 prefills each sample's prompt on its own, then decodes one token at a time: memory-bound).

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
    python benchmarks/bench_gpu_grpo.py --shape qwen2.5-0.5b --allow-cpu --steps 1 \
        --prompts-per-step 2 --group-size 2 --max-new-tokens 8                                      # CPU, slow

docs/gpu.md has the command for a lent GPU machine, what it prints, and how the same config would run
with vLLM on 8 GPUs and on several nodes.
"""

from __future__ import annotations

import argparse
import gc
import json
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


def build_model_dir(shape: str, rows: list[dict], out: Path, device: str) -> dict[str, Any]:
    """Tokenizer + random-weight model of `shape` saved in `out` (from_pretrained-loadable). Returns facts."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    family, arch = SHAPES[shape]
    t0 = time.perf_counter()
    texts = [f"Question: {r['question']}\nAnswer: {r['answer']}" for r in rows]
    tok = padded_tokenizer(texts, arch["vocab_size"])
    t_tok = time.perf_counter() - t0
    probe = [arch["vocab_size"] - 1, len(tok) // 2, 300]
    decoded = tok.decode(probe, skip_special_tokens=True)
    if not decoded:
        raise RuntimeError(f"ids {probe} decode to nothing: the padded vocabulary is broken")
    config_cls, model_cls = (Qwen2Config, Qwen2ForCausalLM) if family == "qwen2" else (Qwen3Config, Qwen3ForCausalLM)
    cfg = config_cls(**arch, attention_dropout=0.0, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                     bos_token_id=tok.bos_token_id)
    t1 = time.perf_counter()
    torch.manual_seed(SEED)
    with torch.device(device):  # random init on the GPU when there is one (seconds instead of tens)
        model = model_cls(cfg)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                               bos_token_id=tok.bos_token_id)
    n_params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    # The trainer loads fp32 and DeepSpeed casts to bf16; random bf16 weights are as good and half the size.
    model.to(torch.bfloat16).save_pretrained(out)
    tok.save_pretrained(out)
    facts = {"arch": model_cls.__name__, "n_params": n_params, "tied_embeddings": tied,
             "vocab_size": arch["vocab_size"], "tokenizer_len": len(tok), "config": arch,
             "build_s": round(time.perf_counter() - t1, 2), "tokenizer_s": round(t_tok, 2),
             "decode_probe": {"ids": probe, "text_len": len(decoded)}}
    del model
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return facts


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
    ap.add_argument("--engine", choices=["hf", "vllm"], default="hf",
                    help="rollout engine, passed to train_grpo(engine=...): hf (transformers generate) or vllm "
                         "(a colocated in-process vLLM engine per rank)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--prompts-per-step", "-P", type=int, default=8)
    ap.add_argument("--group-size", "-G", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--zero-stage", type=int, choices=[0, 1, 2, 3], default=2)
    ap.add_argument("--beta", type=float, default=0.0, help="KL coefficient (> 0 adds the reference forward)")
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--rollout-batch-size", type=int, default=None, help="default P*G (one decode batch)")
    # Memory of the update (docs/grpo_training.md, "Memory of the update"): the GRPOConfig fields of that name.
    ap.add_argument("--micro-batch-size", type=int, default=None, help="grpo.micro_batch_size (default: whole batch)")
    ap.add_argument("--max-tokens-per-micro-batch", type=int, default=None, help="grpo.max_tokens_per_micro_batch")
    ap.add_argument("--logprob-chunk-size", type=int, default=None,
                    help="grpo.logprob_chunk_size (default: the config's; 0 = full-vocabulary log_softmax)")
    ap.add_argument("--gradient-checkpointing", action="store_true", help="grpo.gradient_checkpointing")
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


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and a.device_check and a.shape != "tiny":
        print(f"refusing to run --shape {a.shape} without CUDA (no GPU visible); pass --allow-cpu to run it on "
              "the CPU anyway (slow), or use --shape tiny", file=sys.stderr)
        return 2
    # The trainer defaults DeepSpeed to its CPU accelerator when nothing says otherwise; on a GPU say cuda.
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if cuda else "cpu")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if a.threads:
        torch.set_num_threads(a.threads)

    import deepspeed
    import pyarrow.parquet as pq
    import transformers

    from rlvr_core.experiment.config import GRPOConfig, RewardConfig
    from rlvr_core.data.synthetic import SyntheticSpec, make_synthetic_dataset
    from rlvr_core.grpo.trainer import train_grpo
    from rlvr_core.data.templates import get_template

    P, G = a.prompts_per_step, a.group_size
    kwargs: dict[str, Any] = {"engine": a.engine}

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    device_name = (torch.cuda.get_device_name() if cuda else f"CPU ({platform.processor() or platform.machine()})")
    peak, peak_source = peak_flops(device_name if cuda else None, a.peak_tflops)
    job_peak = peak * world if peak else None
    register_verifier()
    n_train = max(64, P * a.steps)
    rows = make_synthetic_dataset(SyntheticSpec(n_train=n_train, n_test=8, seed=SEED))["train"]

    root = a.work or Path(tempfile.mkdtemp(prefix="bench_gpu_grpo_"))
    work = root
    if world > 1:  # every rank its own model and output folder (rank 0's holds steps.parquet)
        work = work / f"rank{rank}"
    work.mkdir(parents=True, exist_ok=True)
    out_json = a.out or Path(tempfile.gettempdir()) / f"bench_gpu_grpo_{a.shape}.json"
    try:
        t0 = time.perf_counter()
        model_dir = work / "model"
        facts = build_model_dir(a.shape, rows, model_dir, "cuda" if cuda else "cpu")
        t_build = time.perf_counter() - t0
        if rank == 0:
            print(f"built {a.shape}: {facts['arch']}, N = {facts['n_params']:,}, tokenizer {facts['tokenizer_len']} "
                  f"tokens ({facts['tokenizer_s']} s), model {facts['build_s']} s", flush=True)

        cfg = GRPOConfig(enabled=True, steps=a.steps, prompts_per_step=P, group_size=G, temperature=1.0, top_p=1.0,
                         lr=a.lr, warmup_steps=0, beta=a.beta, zero_stage=a.zero_stage, precision="bf16",
                         rollout_batch_size=a.rollout_batch_size or P * G, checkpoint_every=10**6,
                         rollout_samples_per_step=0, micro_batch_size=a.micro_batch_size,
                         max_tokens_per_micro_batch=a.max_tokens_per_micro_batch,
                         gradient_checkpointing=a.gradient_checkpointing,
                         **({} if a.logprob_chunk_size is None else {"logprob_chunk_size": a.logprob_chunk_size}))
        ids = [r["id"] for r in rows]
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        t1 = time.perf_counter()
        res = train_grpo(model_dir, rows, ids, work / "run", cfg, template_id=TEMPLATE,
                         reward=RewardConfig(verifier=VERIFIER),
                         max_new_tokens=a.max_new_tokens, seed=SEED,
                         progress=lambda msg: print(f"  [trainer] {msg}", flush=True), **kwargs)
        t_train = time.perf_counter() - t1
        if rank != 0:
            return 0
        steps = pq.read_table(res.steps_path).to_pylist()
        missing = {"t_rollout_s", "t_reward_s", "t_train_s", "tokens_per_s", "n_tokens", "completion_len_mean",
                   "samples_per_prompt_mean", "dynamic/prompts_consumed"} - set(steps[0])
        if missing:
            raise RuntimeError(f"steps.parquet lacks the columns {sorted(missing)}")

        # Prompt tokens of each step's P prompts, tokenized as the trainer does (same tokenizer and call).
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        template = get_template(TEMPLATE)
        plen = {r["id"]: len(tok(template.render(r["question"]))["input_ids"]) for r in rows}
        prompt_tokens = []
        for r in steps:
            if int(r["dynamic/prompts_consumed"]) != P:
                raise RuntimeError(f"step {r['step']} consumed {r['dynamic/prompts_consumed']} prompts, expected {P}")
            first = (int(r["step"]) - 1) * P
            prompt_tokens.append(sum(plen[rows[(first + i) % len(rows)]["id"]] for i in range(P)))

        recs = step_records(steps, prompt_tokens, facts["n_params"], G=G, E=cfg.epochs_per_step, beta=cfg.beta,
                            peak=job_peak)
        result = {
            "shape": a.shape, "engine": a.engine,
            "update_memory": {k: getattr(cfg, k) for k in ("micro_batch_size", "max_tokens_per_micro_batch",
                                                           "logprob_chunk_size", "gradient_checkpointing")},
            "world_size": world,
            "device": {"name": device_name, "cuda": cuda, "peak_flops": peak,
                       "peak_tflops": peak / 1e12 if peak else None, "peak_source": peak_source,
                       "max_memory_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None},
            "versions": {"torch": torch.__version__, "deepspeed": deepspeed.__version__,
                         "transformers": transformers.__version__, "python": platform.python_version(),
                         "cuda": torch.version.cuda},
            "settings": {"prompts_per_step": P, "group_size": G, "max_new_tokens": a.max_new_tokens,
                         "zero_stage": a.zero_stage, "precision": cfg.precision, "engine": a.engine,
                         "beta": cfg.beta, "epochs_per_step": cfg.epochs_per_step, "steps": a.steps,
                         "rollout_batch_size": cfg.rollout_batch_size, "lr": cfg.lr, "temperature": cfg.temperature,
                         "threads": torch.get_num_threads(), "template": TEMPLATE, "verifier": VERIFIER,
                         "seed": SEED},
            "model": facts,
            "tokens_per_step": {"sequences": P * G, "prompt": recs[-1]["prompt_tokens"] * G,
                                "completion": recs[-1]["completion_tokens"], "train": recs[-1]["train_tokens"]},
            "formula": FORMULA, "rollout_formula": ROLLOUT_FORMULA,
            "flops_per_train_token": (6 * cfg.epochs_per_step + (2 if cfg.beta > 0 else 0)) * facts["n_params"],
            "steps": recs, "summary": summarise(recs, job_peak),
            "wall_s": {"build": t_build, "train_grpo": t_train},
            "out": str(out_json),
        }
        out_json.parent.mkdir(parents=True, exist_ok=True)
        out_json.write_text(json.dumps(result, indent=2) + "\n")
        print_report(result)
    finally:
        if not a.keep_work and a.work is None:  # a temporary folder of this rank's own
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    code = main()
    try:
        from rlvr_core.grpo.distributed import shutdown

        shutdown()
    except Exception:  # noqa: BLE001 - best effort: the process group may not exist
        pass
    sys.exit(code)
