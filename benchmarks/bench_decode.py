"""The `hf` engine's decode loop against `model.generate` on the same batch, one run: ms per decode step, host
µs per row-step, kernel-launching ops per step (issue 41).

Why: a GRPO rollout on the `hf` engine is B rows x T tokens of this loop; TRL decodes with `model.generate`.
Both arms get the same left-padded batch (P prompts of the `qa` template x n samples = B rows, sampled at
temperature 1 with the template's stop strings, eos off so every row decodes T tokens) from the same model:
a Qwen2 of the real 151,936-token vocabulary (so the vocabulary-wide work per step is the real one) with few,
narrow layers (CPU: seconds per step at B = 512), random weights, and a local byte-level tokenizer padded to
the full vocabulary (benchmarks/bench_gpu_grpo.py `padded_tokenizer`: every id decodes to real bytes).
Nothing is downloaded.

Measured per arm:
  ms_per_step           (wall time of the decode loop - set-up before the prefill - the prefill forward) / T,
                        from a plain run (no counting)
  ops_per_step          aten ops that launch kernels (not views, allocations or detach), counted by a
                        TorchDispatchMode over the same call, minus the prefill forward's, / T
  host_us_per_row_step  ours only: time in the decode loop outside the model's forward calls and outside
                        every aten op (Python bookkeeping, tokenizer calls, numpy), / row-steps (sum over
                        steps of the rows decoded), from the counting run; the mode's own per-op cost lands
                        here too, so this is an upper bound
`--impl reference` runs the loop as it was before issue 41 (tests/sampling/hf_reference.py) as our arm:
the "before" numbers. Run (CPU, 1 thread):

    python benchmarks/bench_decode.py --json                    # B = 512 (64 prompts x 8), T = 16
    python benchmarks/bench_decode.py --impl reference --json   # the loop before issue 41
    python benchmarks/bench_decode.py --device cuda --hidden 896 --layers 24 --heads 14 --kv-heads 2 \\
        --intermediate 4864 --new-tokens 128 --json            # GPU: the 0.5B shape

With --json the last stdout line is a JSON object with ms_per_step, generate_ms_per_step,
host_us_per_row_step, ops_per_step, generate_ops_per_step (and the settings).
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import importlib.util
import json
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

NOT_KERNELS = {"empty", "empty_strided", "detach", "alias", "lift_fresh", "set_", "resize_", "sym_size",
               "sym_stride", "sym_numel", "sym_storage_offset", "is_same_size"}


class OpCounter(TorchDispatchMode):
    """Counts kernel-launching aten ops, and the time inside ops that run outside forward calls once
    decoding has started (after the prefill)."""

    def __init__(self):
        super().__init__()
        self.ops = 0
        self.names: collections.Counter = collections.Counter()     # ops outside forward calls, by name
        self.op_s_outside = 0.0
        self.in_forward = self.decoding = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        t0 = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        dt = time.perf_counter() - t0
        name = func.overloadpacket.__name__
        if not func.is_view and name not in NOT_KERNELS:
            self.ops += 1
            if self.decoding and not self.in_forward:
                self.names[name] += 1
        if self.decoding and not self.in_forward:
            self.op_s_outside += dt
        return out


class ForwardClock:
    """Forward hooks on the model: when the prefill (first call) ended, ops counted by then, time in the
    later forward calls, and row-steps (the rows of every forward after the prefill, plus the first step's)."""

    def __init__(self, model, counter: OpCounter | None = None):
        self.counter, self.calls, self.decode_forward_s, self.prefill_ops = counter, 0, 0.0, 0
        self.rows = 0
        self._hooks = [model.register_forward_pre_hook(self._pre, with_kwargs=True),
                       model.register_forward_hook(self._post)]

    def _pre(self, module, args, kwargs):
        if self.counter:
            self.counter.in_forward = True
            self._ops0 = self.counter.ops
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.rows += ids.shape[0]                              # the prefill's: the first step's rows
        self._t0 = time.perf_counter()

    def _post(self, module, args, out):
        now = time.perf_counter()
        if self.calls == 0:
            self.prefill_end = now
            self.prefill_ops = self.counter.ops if self.counter else 0
        else:
            self.decode_forward_s += now - self._t0
        self.calls += 1
        if self.counter:
            self.counter.in_forward = False
            self.counter.decoding = True

    def remove(self):
        for h in self._hooks:
            h.remove()


def build(a):
    """(model, tokenizer, prompts, prompt ids, params) of the benchmark."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from bench_gpu_grpo import padded_tokenizer
    from rlvr_core.data.synthetic import SyntheticSpec, make_synthetic_dataset
    from rlvr_core.data.templates import get_template
    from rlvr_core.sampling import SamplingParams

    template = get_template("qa")
    rows = make_synthetic_dataset(SyntheticSpec(n_train=200, n_test=a.prompts, seed=0))
    tok = padded_tokenizer([template.render(r["question"]) + " " + r["answer"] for r in rows["train"]], a.vocab)
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate or 2 * a.hidden,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                      max_position_embeddings=4096, eos_token_id=None, bos_token_id=None,
                      pad_token_id=tok.pad_token_id, tie_word_embeddings=True)
    dtype = torch.bfloat16 if a.device.startswith("cuda") else torch.float32
    model = Qwen2ForCausalLM(cfg).to(device=a.device, dtype=dtype).eval()
    test = rows["test"][: a.prompts]
    prompts, ids = [template.render(r["question"]) for r in test], [r["id"] for r in test]
    params = SamplingParams(n=a.n, temperature=1.0, max_new_tokens=a.new_tokens, stop=template.stop, seed=0)
    return model, tok, prompts, ids, params


def engine_class(impl: str):
    if impl == "engine":
        from rlvr_core.sampling.hf import HFEngine
        return HFEngine
    spec = importlib.util.spec_from_file_location("hf_reference", ROOT / "tests" / "sampling" / "hf_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.HFEngine


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure(run, model, device: str, steps: int, counted: bool) -> dict:
    """Run `run()` once under the forward clock (and the op counter when `counted`)."""
    counter = OpCounter() if counted else None
    clock = ForwardClock(model, counter)
    try:
        sync(device)
        t0 = time.perf_counter()
        if counter:
            with counter:
                run()
        else:
            run()
        sync(device)
        wall = time.perf_counter() - t0
    finally:
        clock.remove()
    decode_s = t0 + wall - clock.prefill_end                   # after the prefill: the T steps
    out = {"ms_per_step": 1e3 * decode_s / steps, "forwards": clock.calls,
           "setup_and_prefill_ms": 1e3 * (clock.prefill_end - t0)}
    if counter:
        out["ops_per_step"] = (counter.ops - clock.prefill_ops) / steps
        host_s = decode_s - clock.decode_forward_s - counter.op_s_outside
        out["host_us_per_row_step"] = 1e6 * host_s / max(clock.rows, 1)
        out["ops_outside_forward"] = {k: round(v / steps, 2) for k, v in counter.names.most_common()}
    return out


def ours(a, model, tok, prompts, ids, params) -> dict:
    engine = engine_class(a.impl)(model, tok, batch_size=a.prompts * a.n, device=a.device, eos_token_ids=[])
    engine.generate(prompts[:1], ids[:1], params)                # warm-up: builds the stop tables, caches
    engine_decode = engine._decode_batch                        # the decode loop alone, not tokenizing/decoding
    res = {}
    for counted in (False, True):                               # one batch: B = batch_size
        def timed(rows, p, counted=counted):
            got = measure(lambda: engine_decode(rows, p), model, a.device, p.max_new_tokens, counted)
            res.update(got if counted else {"ms_per_step": got["ms_per_step"]})
        engine._decode_batch = timed
        engine.generate(prompts, ids, params)
    return res


def generate_arm(a, model, tok, prompts, params) -> dict:
    enc = tok([p for p in prompts for _ in range(params.n)], return_tensors="pt", padding=True,
              padding_side="left").to(a.device)
    kw = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=params.max_new_tokens,
              min_new_tokens=0, stop_strings=list(params.stop), tokenizer=tok, pad_token_id=tok.pad_token_id,
              eos_token_id=None)
    with torch.inference_mode():
        model.generate(**{k: v[:1] for k, v in enc.items()}, **kw)   # warm-up: stop-string tables
        res = {"ms_per_step": measure(lambda: model.generate(**enc, **kw), model, a.device,
                                      params.max_new_tokens, False)["ms_per_step"]}
        counted = measure(lambda: model.generate(**enc, **kw), model, a.device, params.max_new_tokens, True)
    res["ops_per_step"], res["ops_outside_forward"] = counted["ops_per_step"], counted["ops_outside_forward"]
    return res


def keep_freed_memory() -> None:
    """glibc: serve every allocation from the heap and never give freed memory back (M_MMAP_MAX 0,
    M_TRIM_THRESHOLD max), as a GPU's caching allocator does. Otherwise every vocabulary-sized tensor freed
    on the host (the model's (B, 1, V) logits each step: 0.3 GB at B = 512) is unmapped and faulted in again,
    ~10 ms a time on this machine, and that time would land in 'host' though it is the allocator's."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-4, 0)             # M_MMAP_MAX
    libc.mallopt(-1, 2**31 - 1)     # M_TRIM_THRESHOLD


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=8, help="samples per prompt: B = prompts x n")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--intermediate", type=int, default=0, help="default 2 x hidden")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--impl", default="engine", choices=["engine", "reference"],
                    help="our arm: the engine, or the loop before issue 41 (tests/sampling/hf_reference.py)")
    ap.add_argument("--json", action="store_true", help="last stdout line: the results as JSON")
    ap.add_argument("--return-freed-memory", action="store_true",
                    help="CPU: leave glibc's default (freed large blocks go back to the OS; see keep_freed_memory)")
    a = ap.parse_args()
    if a.device == "cpu" and not a.return_freed_memory:
        keep_freed_memory()
    torch.set_num_threads(a.threads)
    model, tok, prompts, ids, params = build(a)
    B = a.prompts * a.n
    mine = ours(a, model, tok, prompts, ids, params)
    gen = generate_arm(a, model, tok, prompts, params)
    print(f"B = {B} rows ({a.prompts} prompts x {a.n}), T = {a.new_tokens} new tokens, vocab {a.vocab}, "
          f"Qwen2 h{a.hidden} x {a.layers} layers, {a.device}, {a.threads} thread(s), stops {list(params.stop)}")
    print("| arm | ms / step | ops / step | host µs / row-step |\n|---|---|---|---|")
    print(f"| hf engine ({a.impl}) | {mine['ms_per_step']:.1f} | {mine['ops_per_step']:.1f} | "
          f"{mine['host_us_per_row_step']:.2f} |")
    print(f"| model.generate | {gen['ms_per_step']:.1f} | {gen['ops_per_step']:.1f} | |")
    print("ops per step outside the model's forward: ours", mine["ops_outside_forward"])
    print("                                     generate", gen["ops_outside_forward"])
    print(f"engine / generate: time per step {mine['ms_per_step'] / gen['ms_per_step']:.2f}x, "
          f"ops per step {mine['ops_per_step'] - gen['ops_per_step']:+.1f}")
    if a.json:
        print(json.dumps({"ms_per_step": mine["ms_per_step"], "generate_ms_per_step": gen["ms_per_step"],
                          "host_us_per_row_step": mine["host_us_per_row_step"], "ops_per_step": mine["ops_per_step"],
                          "generate_ops_per_step": gen["ops_per_step"], "batch": B, "new_tokens": a.new_tokens,
                          "vocab": a.vocab, "impl": a.impl, "device": a.device, "threads": a.threads,
                          "forwards": mine["forwards"], "stops": list(params.stop)}))


if __name__ == "__main__":
    main()
