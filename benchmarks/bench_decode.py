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
  ms_per_step           (wall time of the decode loop after the prefill forward) / T, from plain runs (no
                        counting; the median of --repeats)
  ops_per_step          aten ops that launch kernels (not views, allocations or detach), counted by a
                        TorchDispatchMode in a second run, after the prefill, / T
  host_us_per_row_step  ours only, a third run under torch.profiler: per decode step, its time outside the
                        model's forward call and outside every aten op (Python bookkeeping, tokenizer calls,
                        numpy) / its rows; the median over steps (host_us_per_row_step_mean: all of it /
                        all row-steps); the profiler's own cost per op (~1 µs) lands here too: an upper bound
  graphed_ms_per_step   with --compile: the graphed step (sampling.hf_compile), whole call / T
`--impl reference` runs the loop as it was before issue 41 (tests/sampling/hf_reference.py) as our arm, and
`--with-reference` adds it as a further arm of the same run: the "before" numbers. On a CPU, glibc is told to
keep freed memory (`keep_freed_memory`). Run (CPU, 1 thread):

    python benchmarks/bench_decode.py --json                    # B = 512 (64 prompts x 8), T = 16
    python benchmarks/bench_decode.py --impl reference --json   # the loop before issue 41 as our arm
    python benchmarks/bench_decode.py --with-reference --repeats 3 --json   # before and after, one run
    python benchmarks/bench_decode.py --device cuda --hidden 896 --layers 24 --heads 14 --kv-heads 2 \\
        --intermediate 4864 --new-tokens 64 --compile --json   # GPU: the 0.5B shape, + the graphed step

With --json the last stdout line is a JSON object with ms_per_step, generate_ms_per_step,
host_us_per_row_step, ops_per_step, generate_ops_per_step (and the settings).
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import dataclasses
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
    """Counts kernel-launching aten ops, in all and (by name) outside forward calls once decoding started.
    Its Python per op (~60 µs here) slows the run: it only counts; time comes from the other runs."""

    def __init__(self):
        super().__init__()
        self.ops = 0
        self.names: collections.Counter = collections.Counter()
        self.in_forward = self.decoding = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not func.is_view and name not in NOT_KERNELS:
            self.ops += 1
            if self.decoding and not self.in_forward:
                self.names[name] += 1
        return func(*args, **(kwargs or {}))


class ForwardHooks:
    """Forward hooks on the model: forward calls (the first is the prefill), row-steps (the rows of every
    forward: the prefill's are the first step's), when the prefill ended, the ops counted by then; with
    `profiled`, each forward inside a profiler range named rlvr.forward."""

    def __init__(self, model, counter: OpCounter | None = None, profiled: bool = False):
        self.counter, self.profiled, self.calls, self.rows, self.prefill_ops = counter, profiled, 0, 0, 0
        self.rows_per_call: list[int] = []
        self._ranges: list = []
        self._hooks = [model.register_forward_pre_hook(self._pre, with_kwargs=True),
                       model.register_forward_hook(self._post)]

    def _pre(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.rows += ids.shape[0]
        self.rows_per_call.append(ids.shape[0])
        if self.counter:
            self.counter.in_forward = True
        if self.profiled:
            self._ranges.append(torch.profiler.record_function("rlvr.forward").__enter__())

    def _post(self, module, args, out):
        if self.profiled:
            self._ranges.pop().__exit__(None, None, None)
        if self.calls == 0:
            self.prefill_end = time.perf_counter()
            self.prefill_ops = self.counter.ops if self.counter else 0
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
    sys.modules["hf_reference"] = mod                          # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod.HFEngine


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(run, model, device: str, steps: int) -> dict:
    """Plain run: ms per decode step (after the prefill), forward calls, set-up + prefill time."""
    hooks = ForwardHooks(model)
    try:
        sync(device)
        t0 = time.perf_counter()
        run()
        sync(device)
        t1 = time.perf_counter()
    finally:
        hooks.remove()
    return {"ms_per_step": 1e3 * (t1 - hooks.prefill_end) / steps, "forwards": hooks.calls,
            "setup_and_prefill_ms": 1e3 * (hooks.prefill_end - t0)}


def counted(run, model, steps: int) -> dict:
    """Run under the op counter: kernel-launching ops per decode step, and those outside the forward by name."""
    counter = OpCounter()
    hooks = ForwardHooks(model, counter)
    try:
        with counter:
            run()
    finally:
        hooks.remove()
    return {"ops_per_step": (counter.ops - hooks.prefill_ops) / steps,
            "ops_outside_forward": {k: round(v / steps, 2) for k, v in counter.names.most_common()}}


def host_time(run, model) -> dict:
    """Run under torch.profiler (CPU): per decode step, (its time - its forward call - the aten ops run
    outside the forward) / its rows, all from the profiler's clock; reported: the median over the steps (a
    step during which another process took the core would otherwise count that time as ours) and the mean.
    The profiler's own cost per op (~1 µs) counts as host: an upper bound."""
    from torch.profiler import ProfilerActivity, profile, record_function

    hooks = ForwardHooks(model, profiled=True)
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            with record_function("rlvr.run"):
                run()
    finally:
        hooks.remove()
    events = prof.events()
    (whole,) = [e for e in events if e.name == "rlvr.run"]
    forwards = sorted((e for e in events if e.name == "rlvr.forward"), key=lambda e: e.time_range.start)
    ops = [e for e in events
           if e.name.startswith("aten::") and e.cpu_parent is not None and e.cpu_parent.name == "rlvr.run"]
    per_step, total = [], 0.0
    for k, fw in enumerate(forwards):            # step k: from the end of forward k to the end of forward k + 1
        start = fw.time_range.end
        end = forwards[k + 1].time_range.end if k + 1 < len(forwards) else whole.time_range.end
        busy = forwards[k + 1].time_range.elapsed_us() if k + 1 < len(forwards) else 0.0
        busy += sum(e.time_range.elapsed_us() for e in ops if start <= e.time_range.start < end)
        total += end - start - busy
        per_step.append((end - start - busy) / hooks.rows_per_call[k])
    return {"host_us_per_row_step": sorted(per_step)[len(per_step) // 2],
            "host_us_per_row_step_mean": total / max(hooks.rows, 1)}


def median_timed(run, model, device: str, steps: int, repeats: int) -> dict:
    """`timed` `repeats` times; the run with the median ms per step."""
    runs = sorted((timed(run, model, device, steps) for _ in range(repeats)), key=lambda r: r["ms_per_step"])
    return runs[len(runs) // 2]


def ours(a, impl: str, model, tok, prompts, ids, params) -> dict:
    kw = {"compile": False} if impl == "engine" else {}        # the eager loop; the graphed one: graphed()
    engine = engine_class(impl)(model, tok, batch_size=a.prompts * a.n, device=a.device, eos_token_ids=[], **kw)
    engine.generate(prompts[:1], ids[:1], params)                # warm-up: builds the stop tables, caches
    engine_decode = engine._decode_batch                        # the decode loop alone, not tokenizing/decoding
    res = {}
    T = params.max_new_tokens
    for how in (lambda run: median_timed(run, model, a.device, T, a.repeats), lambda run: counted(run, model, T),
                lambda run: host_time(run, model)):
        def measured(rows, p, how=how):                         # one batch: B = batch_size
            def run():                                          # fresh rows each run (the loop fills them)
                engine_decode([dataclasses.replace(r, tokens=[], logprobs=[], finish_reason=None) for r in rows], p)
            res.update(how(run))
        engine._decode_batch = measured
        engine.generate(prompts, ids, params)
    return res


def graphed(a, model, tok, prompts, ids, params) -> dict:
    """The graphed decode step (`HFEngine(compile=True)`): wall time of the whole decode / T, prefill included
    (hooks on the model would be traced into the compiled graph, so none are set); two warm-up calls compile
    and record the graph."""
    from rlvr_core.sampling.hf import HFEngine

    engine = HFEngine(model, tok, batch_size=a.prompts * a.n, device=a.device, eos_token_ids=[], compile=True,
                      compile_backend=a.compile_backend)
    for _ in range(2):
        engine.generate(prompts, ids, params)
    times = []
    for _ in range(a.repeats):
        sync(a.device)
        t0 = time.perf_counter()
        engine.generate(prompts, ids, params)
        sync(a.device)
        times.append(time.perf_counter() - t0)
    return {"ms_per_step": 1e3 * sorted(times)[len(times) // 2] / params.max_new_tokens}


def generate_arm(a, model, tok, prompts, params) -> dict:
    enc = tok([p for p in prompts for _ in range(params.n)], return_tensors="pt", padding=True,
              padding_side="left").to(a.device)
    kw = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=params.max_new_tokens,
              min_new_tokens=0, stop_strings=list(params.stop), tokenizer=tok, pad_token_id=tok.pad_token_id,
              eos_token_id=None)
    with torch.inference_mode():
        model.generate(**{k: v[:1] for k, v in enc.items()}, **kw)   # warm-up: stop-string tables
        res = median_timed(lambda: model.generate(**enc, **kw), model, a.device, params.max_new_tokens, a.repeats)
        res.update(counted(lambda: model.generate(**enc, **kw), model, params.max_new_tokens))
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
    ap.add_argument("--with-reference", action="store_true",
                    help="also run the loop before issue 41 as an arm of the same run (before vs after)")
    ap.add_argument("--repeats", type=int, default=1, help="timed runs per arm; the median is reported")
    ap.add_argument("--compile", action="store_true", help="also the graphed decode step (sampling.hf_compile)")
    ap.add_argument("--compile-backend", default="inductor", help="its torch.compile backend")
    ap.add_argument("--json", action="store_true", help="last stdout line: the results as JSON")
    ap.add_argument("--return-freed-memory", action="store_true",
                    help="CPU: leave glibc's default (freed large blocks go back to the OS; see keep_freed_memory)")
    a = ap.parse_args()
    if a.device == "cpu" and not a.return_freed_memory:
        keep_freed_memory()
    torch.set_num_threads(a.threads)
    model, tok, prompts, ids, params = build(a)
    B = a.prompts * a.n
    mine = ours(a, a.impl, model, tok, prompts, ids, params)
    before = ours(a, "reference", model, tok, prompts, ids, params) if a.with_reference else None
    graph = graphed(a, model, tok, prompts, ids, params) if a.compile else None
    gen = generate_arm(a, model, tok, prompts, params)
    print(f"B = {B} rows ({a.prompts} prompts x {a.n}), T = {a.new_tokens} new tokens, vocab {a.vocab}, "
          f"Qwen2 h{a.hidden} x {a.layers} layers, {a.device}, {a.threads} thread(s), stops {list(params.stop)}, "
          f"median of {a.repeats} timed runs per arm; host: median over steps (mean in the JSON)")
    print("| arm | ms / step | ÷ generate | ops / step | host µs / row-step |\n|---|---|---|---|---|")
    for name, r in [(f"hf engine ({a.impl})", mine)] + ([("hf engine (reference)", before)] if before else []):
        print(f"| {name} | {r['ms_per_step']:.1f} | {r['ms_per_step'] / gen['ms_per_step']:.2f} | "
              f"{r['ops_per_step']:.1f} | {r['host_us_per_row_step']:.2f} |")
    if graph:
        print(f"| hf engine (graphed, whole call / T) | {graph['ms_per_step']:.1f} | "
              f"{graph['ms_per_step'] / gen['ms_per_step']:.2f} | | |")
    print(f"| model.generate | {gen['ms_per_step']:.1f} | 1.00 | {gen['ops_per_step']:.1f} | |")
    print("ops per step outside the model's forward: ours", mine["ops_outside_forward"])
    print("                                     generate", gen["ops_outside_forward"])
    print(f"engine / generate: time per step {mine['ms_per_step'] / gen['ms_per_step']:.2f}x, "
          f"ops per step {mine['ops_per_step'] - gen['ops_per_step']:+.1f}")
    if a.json:
        print(json.dumps({"ms_per_step": mine["ms_per_step"], "generate_ms_per_step": gen["ms_per_step"],
                          "host_us_per_row_step": mine["host_us_per_row_step"], "ops_per_step": mine["ops_per_step"],
                          "generate_ops_per_step": gen["ops_per_step"], "batch": B, "new_tokens": a.new_tokens,
                          "vocab": a.vocab, "impl": a.impl, "device": a.device, "threads": a.threads,
                          "forwards": mine["forwards"], "stops": list(params.stop), "repeats": a.repeats,
                          "host_us_per_row_step_mean": mine["host_us_per_row_step_mean"],
                          **({"reference": {k: before[k] for k in ("ms_per_step", "ops_per_step", "host_us_per_row_step",
                                                                    "host_us_per_row_step_mean")}} if before else {}),
                          **({"graphed_ms_per_step": graph["ms_per_step"]} if graph else {})}))


if __name__ == "__main__":
    main()
