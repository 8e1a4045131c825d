"""Teacher-forced token statistics: tokens/s and peak memory, ours (vocabulary-chunked) vs a naive peer.

    python benchmarks/bench_probe.py [--configs demo,qwen3] [--threads 2] [--repeats 3] [--max-batch-tokens 1024]
        [--demo-base DIR] [--device cpu|cuda] [--json out.json]

Both methods compute the same eight statistics per response token (KL both ways, symmetric KL, both
entropies, both log-probs of the actual token, Δlog p) for the same two models on the same sequences:

  * ours: `rlvr_core.probe.token_stats.teacher_forced_stats` (backbone hidden states of the response
    positions, lm_head applied one vocabulary chunk at a time with online log-sum-exp; default chunk 8192);
  * peer: the textbook way: each model's full forward (`model(...).logits`, (B, L, V)), `log_softmax`,
    `torch.nn.functional.kl_div(..., log_target=True)` both ways, entropies and gathers over the full vocabulary.

Configs:
  * demo: the demo's tiny Qwen2 (hidden 128, 4 layers, the tiny tokenizer's ~412 tokens). A = a fresh
    `build_tiny_model` (or `--demo-base DIR`, e.g. a warm-started base), B = A with every weight moved by
    0.01·N(0,1); responses: 200 synthetic worked solutions after their prompts.
  * qwen3: `Qwen3ForCausalLM` at random weights from a Qwen3-style config with the real 151,936-token
    vocabulary, hidden 256, 2 layers, 4 query / 2 KV heads, head_dim 64, MLP 768, tied embeddings;
    8 sequences of 64 prompt + 448 response random tokens (3,584 scored tokens).

Time: one process per config builds the models once and runs the two methods alternately (ours, peer,
ours, …) `--repeats` times after one warm-up each; the median per method is reported, so load that
changes during the run hits both alike. Peak memory: a fresh process per (config, method) (spawn) runs the
method once; the resident set size is sampled every 2 ms by a thread, minus the RSS just before the run
(models and inputs already built); CUDA: torch.cuda.max_memory_allocated minus the allocation before.
The two methods' results are compared (max |difference| over all eight statistics) to show they agree.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import threading
import time

METHODS = ("ours", "peer")


def _build(config: str, demo_base: str | None, device: str):
    import copy

    import torch

    from rlvr_core.probe.token_stats import ProbeSequence

    torch.manual_seed(0)
    if config == "demo":
        from rlvr_core.data.synthetic import SyntheticSpec, make_synthetic_dataset
        from rlvr_core.probe.inputs import sequences_from_rows
        from rlvr_core.data.templates import get_template

        rows = make_synthetic_dataset(SyntheticSpec())
        if demo_base:
            from rlvr_core.sampling.models import load_model

            a, tok = load_model(demo_base)
        else:
            from rlvr_core.tiny.model import build_tiny_model
            from rlvr_core.tiny.tokenizer import train_tokenizer

            t = get_template("qa")
            tok = train_tokenizer([t.render(r["question"]) + " " + r["answer"] for r in rows["train"]])
            a = build_tiny_model(tok, hidden_size=128, num_layers=4, heads=4).eval()
        seqs = sequences_from_rows(rows["test"], tok, "qa")
        pad = tok.pad_token_id
    elif config == "qwen3":
        from transformers import Qwen3Config, Qwen3ForCausalLM

        cfg = Qwen3Config(vocab_size=151_936, hidden_size=256, intermediate_size=768, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
                          tie_word_embeddings=True)
        a = Qwen3ForCausalLM(cfg).eval()
        g = torch.Generator().manual_seed(1)
        seqs = [ProbeSequence(f"s{i}", f"p{i}", torch.randint(0, 151_936, (64,), generator=g).tolist(),
                              torch.randint(0, 151_936, (448,), generator=g).tolist()) for i in range(8)]
        pad = 0
    else:
        raise ValueError(f"unknown config {config!r}")
    b = copy.deepcopy(a)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in b.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=g))
    return a.to(device).eval(), b.to(device).eval(), seqs, pad


def _peer(a, b, seqs, pad, max_batch_tokens):
    """The textbook computation: full logits of both models, full-vocabulary log_softmax, F.kl_div both ways."""
    import torch
    import torch.nn.functional as F

    from rlvr_core.probe.token_stats import _batches, _encode_batch

    out = []
    dev = next(a.parameters()).device
    with torch.inference_mode():
        for batch in _batches(seqs, max_batch_tokens):
            part = [seqs[i] for i in batch]
            ids, mask, pos, rows, cols, y = _encode_batch(part, pad, dev)
            la = torch.log_softmax(a(input_ids=ids, attention_mask=mask, position_ids=pos).logits[rows, cols].float(), -1)
            lb = torch.log_softmax(b(input_ids=ids, attention_mask=mask, position_ids=pos).logits[rows, cols].float(), -1)
            kl_ab = F.kl_div(lb, la, log_target=True, reduction="none").sum(-1)  # sum p_A (log p_A - log p_B)
            kl_ba = F.kl_div(la, lb, log_target=True, reduction="none").sum(-1)
            ent_a, ent_b = -(la.exp() * la).sum(-1), -(lb.exp() * lb).sum(-1)
            lpa, lpb = la.gather(1, y[:, None])[:, 0], lb.gather(1, y[:, None])[:, 0]
            out.append(torch.stack([lpa, lpb, lpb - lpa, kl_ab, kl_ba, 0.5 * (kl_ab + kl_ba), ent_a, ent_b], 1).cpu())
    return torch.cat(out), [i for batch in _batches(seqs, max_batch_tokens) for i in batch]


def _ours(a, b, seqs, pad, max_batch_tokens, vocab_chunk):
    """Ours: teacher_forced_stats; returns one (n_i, 8) tensor per sequence, in input order."""
    import torch

    from rlvr_core.probe.token_stats import STAT_FIELDS, teacher_forced_stats

    res = teacher_forced_stats(a, {"b": b}, seqs, pad_token_id=pad, max_batch_tokens=max_batch_tokens,
                               vocab_chunk=vocab_chunk)["b"]
    return [torch.stack([getattr(st, f).float() for f in STAT_FIELDS], 1) for st in res]


def _run(method, a, b, seqs, pad, max_batch_tokens, vocab_chunk):
    if method == "peer":
        return _peer(a, b, seqs, pad, max_batch_tokens)
    return _ours(a, b, seqs, pad, max_batch_tokens, vocab_chunk)


def _memory_child(config, method, threads, demo_base, device, max_batch_tokens, vocab_chunk, q):
    """Fresh process: build, then one run of one method with the RSS (or CUDA allocation) high-water mark."""
    import psutil
    import torch

    torch.set_num_threads(threads)
    a, b, seqs, pad = _build(config, demo_base, device)
    proc = psutil.Process()
    peak = [0]
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.002)

    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base_cuda = torch.cuda.memory_allocated()
    base = proc.memory_info().rss
    th = threading.Thread(target=watch, daemon=True)
    th.start()
    _run(method, a, b, seqs, pad, max_batch_tokens, vocab_chunk)
    stop.set()
    th.join()
    peak_mib = (peak[0] - base) / 2**20
    if cuda:
        peak_mib = (torch.cuda.max_memory_allocated() - base_cuda) / 2**20
    q.put(peak_mib)


def _timing_child(config, threads, repeats, demo_base, device, max_batch_tokens, vocab_chunk, q):
    """One process, both methods alternating (ours, peer, ours, …) after one warm-up each, so load that
    changes during the run hits both alike; also returns both methods' values for the agreement check."""
    import torch

    torch.set_num_threads(threads)
    a, b, seqs, pad = _build(config, demo_base, device)
    out = {m: _run(m, a, b, seqs, pad, max_batch_tokens, vocab_chunk) for m in METHODS}  # warm-up
    times = {m: [] for m in METHODS}
    for _ in range(repeats):
        for m in METHODS:
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            _run(m, a, b, seqs, pad, max_batch_tokens, vocab_chunk)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            times[m].append(time.perf_counter() - t0)
    peer, order = out["peer"]
    ours = torch.cat([out["ours"][i] for i in order])  # ours is in input order, the peer in batch order
    diff = float((ours.double() - peer.double()).abs().max())
    q.put({"tokens": sum(len(s.response_ids) for s in seqs), "vocab": int(a.get_output_embeddings().weight.shape[0]),
           "times": times, "max_abs_diff": diff})


def _in_process(target, *args):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(*args, q))
    p.start()
    res = q.get()
    p.join()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default="demo,qwen3")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--demo-base", default=None, help="a warm-started demo base model folder (default: a fresh one)")
    ap.add_argument("--max-batch-tokens", type=int, default=1024)
    ap.add_argument("--vocab-chunk", type=int, default=8192)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    common = (args.demo_base, args.device, args.max_batch_tokens, args.vocab_chunk)
    results = []
    for config in args.configs.split(","):
        t = _in_process(_timing_child, config, args.threads, args.repeats, *common)
        mem = {m: _in_process(_memory_child, config, m, args.threads, *common) for m in METHODS}
        for m in METHODS:
            sec = statistics.median(t["times"][m])
            results.append({"config": config, "method": m, "vocab": t["vocab"], "tokens": t["tokens"], "seconds": sec,
                            "tokens_per_s": t["tokens"] / sec, "times": t["times"][m], "peak_mib": mem[m],
                            "max_abs_diff": t["max_abs_diff"], "threads": args.threads, "device": args.device})
    print(f"threads {args.threads}, device {args.device}, max_batch_tokens {args.max_batch_tokens}, "
          f"vocab_chunk {args.vocab_chunk}, median of {args.repeats} alternating runs")
    print("| config | vocab | tokens | method | seconds | tokens/s | peak MiB | ours/peer tokens/s | peer/ours memory | max abs diff |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for config in args.configs.split(","):
        o = next(r for r in results if r["config"] == config and r["method"] == "ours")
        p = next(r for r in results if r["config"] == config and r["method"] == "peer")
        for r in (o, p):
            ratio = f"{o['tokens_per_s'] / p['tokens_per_s']:.2f}x" if r is o else ""
            mem = f"{p['peak_mib'] / max(o['peak_mib'], 1e-9):.1f}x" if r is o else ""
            print(f"| {config} | {r['vocab']} | {r['tokens']} | {r['method']} | {r['seconds']:.3f} | "
                  f"{r['tokens_per_s']:.0f} | {r['peak_mib']:.0f} | {ratio} | {mem} | {r['max_abs_diff']:.2e} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
