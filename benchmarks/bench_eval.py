"""Evaluation throughput of the demo model: the evaluator vs a plain `model.generate` + verify loop.

Why: issue 6 asks how fast `rlvr eval` is (samples/s, generated tokens/s) on the synthetic benchmark and on
GSM8K prompts, and how the time splits between generation and verification. Each workload is run by

  evaluator (workers=2)  `rlvr_core.eval.evaluate.evaluate_spec`: our batched decode loop (hf engine, per-request
                         seeds), then every completion verified by each scoring (headline + side by side) in
                         verifier pools of 2 worker processes with a hard timeout (the default of `rlvr eval`)
  evaluator (workers=0)  the same, verifiers in-process (no timeout protection, no process start-up)
  peer                   plain transformers: one `model.generate` call per problem (greedy, then
                         num_return_sequences=n sampled with do_sample), stop strings via `stop_strings`,
                         then a plain in-process loop of `verifier.verify` for each scoring

All three generate the same requests (same problems, greedy + n samples, same max_new_tokens, temperature,
top_p and stop strings) from the same model and verify the same scorings; the completions differ (different
random streams), so tokens/s counts what each actually generated (up to eos / stop / the cap, no padding).
Times exclude model loading; the evaluator's verification time includes starting its pools.

Workloads:
  synthetic  configs/benchmarks/synthetic.yaml (greedy + 8 samples at T=1, 48 tokens, gsm8k flexible and
             strict), its first --problems problems
  gsm8k      GSM8K test questions (../shared/data), zero-shot `qa` prompt, greedy, --gsm8k-tokens tokens, gsm8k
             strict and flexible. Zero-shot because gsm8k.yaml's 5-shot prompt is longer than the demo model's
             512 positions; the tiny model does not solve GSM8K, this measures speed only.

The model is the demo's base model (`rlvr demo`'s warm start, from the stage cache under $RLVR_HOME, built
on first use). Run:

    OMP_NUM_THREADS=1 python benchmarks/bench_eval.py                  # CPU, 1 torch thread
    python benchmarks/bench_eval.py --problems 64 --gsm8k-problems 32
"""

from __future__ import annotations

import argparse
import time

# torch is imported inside the functions, not here: the verifier pool's forkserver preloads this script's
# module, and with torch loaded there its workers verify ~50x slower (docs/benchmarks/eval.md).
from rlvr_core.eval.evaluate import RunSettings, evaluate_spec
from rlvr_core.experiment.benchmarks import (build_verifier, effective_stop, gold_for, load_benchmark,
                                             load_benchmark_problems, parse_benchmark, prompt_template, scorings)


def demo_model():
    from rlvr_core.pipeline import stages
    from rlvr_core.experiment.config import demo_config
    from rlvr_core.sampling.models import load_model

    cfg = demo_config()
    data = stages.prepare_data(cfg)
    base = stages.prepare_base_model(cfg, data)
    return load_model(base.path, cfg.model.dtype)


def specs(problems: int, gsm8k_problems: int, gsm8k_tokens: int):
    synthetic = load_benchmark("synthetic").model_dump(mode="json")
    synthetic["data"]["max_problems"] = problems
    gsm8k = load_benchmark("gsm8k").model_dump(mode="json")
    gsm8k["name"] = "gsm8k_0shot"
    gsm8k["data"]["max_problems"] = gsm8k_problems
    gsm8k["prompt"] = {"template": "qa", "model_kind": "base"}
    gsm8k["generation"]["max_new_tokens"] = gsm8k_tokens
    return [parse_benchmark(synthetic, "synthetic (bench)"), parse_benchmark(gsm8k, "gsm8k zero-shot (bench)")]


def ours(model, tok, spec, workers: int) -> dict:
    from rlvr_core.sampling.hf import HFEngine

    engine = HFEngine(model, tok, batch_size=64)
    t: dict = {}
    t0 = time.perf_counter()
    evaluate_spec(engine, tok, spec, run=RunSettings(verifier_workers=workers), timings=t)
    t["total_s"] = time.perf_counter() - t0
    return t


def _n_generated(ids: list[int], eos: set[int], pad: int) -> int:
    """Tokens generate() actually produced for one row: up to and including the first eos, no padding."""
    n = 0
    for i in ids:
        n += 1
        if i in eos:
            break
        if i == pad:
            return n - 1
    return n


def peer(model, tok, spec) -> dict:
    """One model.generate call per problem (greedy, then n sampled), then a plain verify loop."""
    import torch

    from rlvr_core.sampling.base import find_stop

    g = spec.generation
    problems = load_benchmark_problems(spec)
    template = prompt_template(spec)
    stop = effective_stop(spec)
    eos = {tok.eos_token_id}
    texts: list[tuple[str, dict]] = []
    tokens = 0
    torch.manual_seed(g.seed)
    t0 = time.perf_counter()
    with torch.inference_mode():
        for p in problems:
            enc = tok(template.render(p["question"]), return_tensors="pt")
            runs = []
            if g.temperature == 0 or g.greedy:
                runs.append(dict(do_sample=False, num_return_sequences=1))
            if g.temperature > 0:
                runs.append(dict(do_sample=True, temperature=g.temperature, top_p=g.top_p, num_return_sequences=g.n))
            for kw in runs:
                out = model.generate(**enc, max_new_tokens=g.max_new_tokens, stop_strings=stop, tokenizer=tok,
                                     pad_token_id=tok.pad_token_id, **kw)
                for row in out[:, enc["input_ids"].shape[1]:].tolist():
                    n = _n_generated(row, eos, tok.pad_token_id)
                    tokens += n
                    text = tok.decode(row[:n], skip_special_tokens=True)
                    cut = find_stop(text, tuple(stop))
                    texts.append((text[:cut] if cut >= 0 else text, p))
    t_gen = time.perf_counter() - t0
    t1 = time.perf_counter()
    for v in scorings(spec):
        verifier = build_verifier(v)
        for text, p in texts:
            verifier.verify(text, gold_for(spec, p))
    t_ver = time.perf_counter() - t1
    return {"generate_s": t_gen, "verify_s": t_ver, "generated_tokens": tokens, "samples": len(texts),
            "total_s": t_gen + t_ver}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--problems", type=int, default=64, help="synthetic problems (each: 1 greedy + 8 samples)")
    ap.add_argument("--gsm8k-problems", type=int, default=32, help="GSM8K test problems (1 greedy completion each)")
    ap.add_argument("--gsm8k-tokens", type=int, default=128, help="max_new_tokens for the GSM8K prompts")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    model, tok = demo_model()

    header = ("| workload | runner | samples | gen tokens | samples/s | tokens/s | generate s | verify s | verify share "
              "| samples/s vs peer |")
    lines = [header, "|" + "---|" * 10]
    for spec in specs(args.problems, args.gsm8k_problems, args.gsm8k_tokens):
        rows = [("evaluator (workers=2)", ours(model, tok, spec, 2)), ("evaluator (workers=0)", ours(model, tok, spec, 0)),
                ("peer: generate + verify loop", peer(model, tok, spec))]
        peer_rate = rows[-1][1]["samples"] / rows[-1][1]["total_s"]
        for name, t in rows:
            rate = t["samples"] / t["total_s"]
            lines.append(f"| {spec.name} | {name} | {t['samples']} | {t['generated_tokens']} | {rate:.1f} | "
                         f"{t['generated_tokens'] / t['total_s']:.0f} | {t['generate_s']:.2f} | {t['verify_s']:.2f} | "
                         f"{t['verify_s'] / t['total_s']:.0%} | {rate / peer_rate:.2f}x |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
