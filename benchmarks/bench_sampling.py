"""Throughput of the batched `hf` sampling engine vs one-request-at-a-time `model.generate`.

Why: the issue's bar is "batched hf generation tokens/s on the demo model vs a one-prompt-at-a-time
generate loop in the same run (expect several x)". Both sides sample the same requests (same prompts,
n samples each, temperature 1, the template's stop strings, same max_new_tokens) from the same model;
tokens/s counts generated tokens (up to eos / stop / max_new_tokens, no padding).

Baselines:
  generate/request  one `model.generate` call per (prompt, sample): batch 1
  generate/prompt   one `model.generate` call per prompt with num_return_sequences=n

The model has the demo's shape (rlvr_core.tiny: Qwen2, hidden 128, 4 layers, 4 heads, 512-token BPE) with
random weights: speed does not depend on weight values. Run:

    python benchmarks/bench_sampling.py                      # CPU, 1 thread
    python benchmarks/bench_sampling.py --device cuda --prompts 64 --n 8
"""

from __future__ import annotations

import argparse
import time

import torch

from rlvr_core.data.synthetic import SyntheticSpec, make_synthetic_dataset
from rlvr_core.data.templates import get_template
from rlvr_core.sampling import SamplingParams, get_engine
from rlvr_core.tiny.model import build_tiny_model
from rlvr_core.tiny.tokenizer import train_tokenizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=4, help="samples per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--batch-sizes", default="16,64")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    template = get_template("qa")
    rows = make_synthetic_dataset(SyntheticSpec(n_train=200, n_test=args.prompts, seed=0))
    tok = train_tokenizer([template.render(r["question"]) + " " + r["answer"] for r in rows["train"]], vocab_size=512)
    model = build_tiny_model(tok, hidden_size=args.hidden, num_layers=args.layers, heads=4).to(args.device).eval()
    test = rows["test"][: args.prompts]
    prompts, ids = [template.render(r["question"]) for r in test], [r["id"] for r in test]
    params = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.max_new_tokens, stop=template.stop, seed=0)

    def sync():
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    results = []

    def engine_run(bs: int):
        engine = get_engine("hf", model=model, tokenizer=tok, batch_size=bs, device=args.device)
        engine.generate(prompts[:2], ids[:2], SamplingParams(n=2, max_new_tokens=4))  # warm-up
        sync()
        t0 = time.perf_counter()
        groups = engine.generate(prompts, ids, params)
        sync()
        dt = time.perf_counter() - t0
        results.append((f"hf engine, batch_size={bs}", sum(len(s.token_ids) for g in groups for s in g), dt))

    def generate_run(per_prompt: bool):
        gen_kw = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=args.max_new_tokens,
                      stop_strings=list(template.stop), tokenizer=tok, pad_token_id=tok.pad_token_id)
        enc = [tok(p, return_tensors="pt")["input_ids"].to(args.device) for p in prompts]
        with torch.inference_mode():
            model.generate(enc[0], attention_mask=torch.ones_like(enc[0]), **{**gen_kw, "max_new_tokens": 4})
            sync()
            tokens, t0 = 0, time.perf_counter()
            for x in enc:
                calls = [(x, args.n)] if per_prompt else [(x, 1)] * args.n
                for inp, k in calls:
                    out = model.generate(inp, attention_mask=torch.ones_like(inp), num_return_sequences=k, **gen_kw)
                    new = out[:, inp.shape[1]:]
                    for row in new.tolist():  # count up to and including eos; the rest is padding
                        eos_at = [j for j, t in enumerate(row) if t == tok.eos_token_id]
                        tokens += (eos_at[0] + 1) if eos_at else len(row)
            sync()
            dt = time.perf_counter() - t0
        results.append(("generate, one prompt per call (n per call)" if per_prompt
                        else "generate, one request per call", tokens, dt))

    generate_run(per_prompt=False)
    generate_run(per_prompt=True)
    for bs in [int(b) for b in args.batch_sizes.split(",")]:
        engine_run(bs)

    base = results[0][1] / results[0][2]
    print(f"device={args.device} threads={args.threads} model=Qwen2 h{args.hidden}x{args.layers} "
          f"vocab={len(tok)} prompts={args.prompts} n={args.n} max_new_tokens={args.max_new_tokens}")
    print(f"| {'method':<44} | {'tokens':>7} | {'seconds':>8} | {'tokens/s':>9} | {'vs request loop':>15} |")
    print(f"|{'-' * 46}|{'-' * 9}|{'-' * 10}|{'-' * 11}|{'-' * 17}|")
    for name, tokens, dt in results:
        print(f"| {name:<44} | {tokens:>7} | {dt:>8.2f} | {tokens / dt:>9.0f} | {tokens / dt / base:>14.1f}x |")


if __name__ == "__main__":
    main()
