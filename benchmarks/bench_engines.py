"""Rollout engines side by side: `HFEngine` (rlvr_core/sampling/hf.py) vs `VLLMEngine` (rlvr_core/sampling/vllm.py).

Why: the vLLM issue asks for vLLM rollouts >= 2x the hf engine on the demo model and >= 3x on a 0.5B-parameter
model, and for the per-run and per-step costs a trainer pays for vLLM (engine start-up, weight push). This script
measures all of them in one run, with the ratios vllm / hf taken from that same run.

Models (built into `--work`, reused when already there):
  demo  the demo's base model, built as `rlvr demo` builds it (rlvr_core.pipeline.stages.prepare_base_model): the demo
        config's warm start (rlvr_core.tiny.warmstart, 180 steps) on the demo's synthetic train split: tokenizer
        trained on it, Qwen2 of hidden 128, 4 layers, 4 heads; ~1.1M parameters; float32 (the demo's dtype).
  0.5b  Qwen2.5-0.5B's shape (Qwen2Config hidden 896, intermediate 4864, 24 layers, 14 heads, 2 KV heads, tied
        embeddings, rope theta 1e6) at random weights (seed 0), vocab 151936 (`--big-vocab full`, so exactly
        494M parameters) with the demo's locally trained tokenizer (412 tokens; ids beyond it decode to nothing
        in both engines), or the vocab sized to the tokenizer (`--big-vocab tokenizer`, ~358M). bfloat16.
Prompts: the first P questions of the demo's synthetic train split rendered with template "qa"; SamplingParams
n=G, temperature 1.0, top-p 1, no top-k, the template's stop strings, max_new_tokens; per-request seeds from
rlvr_core.core.seeding.request_seed (the same in both engines; checked).

Arms. Every engine runs in its own child process (an in-process vLLM sets the process's thread count and a
torch.distributed group), one after the other; `--rounds N` repeats the sequence hf, vllm, vllm-compiled per model,
so arms alternate. Each child makes one warm-up call and then `--reps` measured calls.
  hf              HFEngine(model, tok, batch_size=P*G): the trainer's sampler.
  vllm            VLLMEngine(dir, tokenizer=tok, dtype=...): one seeded n=1 request per (prompt, sample), as the
                  trainer uses it (default_llm_kwargs: eager mode on CPU).
  vllm, before    the same engine with `skip_logprob_text = False` (vLLM decodes the text of every returned
                  log-prob's token): the engine as it was before the fix in vllm.py; same process, calls alternate.
  vllm raw n=G    one `llm.generate` request per prompt with n=G and the same kwargs (logprobs=0, stop strings,
                  detokenize, no log-prob text): vLLM derives the G child seeds itself, so this cannot carry our
                  per-sample seeds; it is the ceiling that one-request-per-sample is measured against.
  vllm compiled   VLLMEngine(..., enforce_eager=False): vLLM's torch.compile (inductor) path, in its own child.
                  Its compile cache is `--work`/vllm-cache, so round 0 compiles cold and later rounds hit the cache.
Per child it also measures start-up (hf: from_pretrained + HFEngine; vllm: `import vllm` and the LLM() build) and,
for vllm, the weight push: `VLLMEngine.load_weights(model.state_dict().items())` of the full state dict, `--reps`
times. With `--profile` (default on) the eager vllm child of the last round profiles one extra call with cProfile
and prints where the time goes (shares of profiled time: cProfile inflates Python-heavy parts).

tok/s = generated tokens (Sample.token_ids, eos included) / wall time of the `generate` call. Medians pool every
measured call of every round; "x hf" is the ratio of the medians.

Run (from the repository root):
    .venv/bin/python benchmarks/bench_engines.py --json /tmp/bench_engines.json          # both models, 2 rounds
    .venv/bin/python benchmarks/bench_engines.py --models demo --rounds 3
    .venv/bin/python benchmarks/bench_engines.py --smoke                                 # tiny shapes, ~2 min
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DIST_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
MODELS = ("demo", "0.5b")
QWEN25_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
                  vocab_size=151936)
SMOKE_BIG = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=2048, rope_theta=1000000.0, rms_norm_eps=1e-6,
                 vocab_size=4096)


# ------------------------------------------------------------------------------------------------ shared
def _demo_rows() -> list[dict]:
    """The demo's synthetic train split (configs/demo.yaml data.synthetic)."""
    from rlvr_core.experiment.config import demo_config
    from rlvr_core.data.synthetic import SyntheticSpec, make_synthetic_dataset

    s = demo_config().data.synthetic
    return make_synthetic_dataset(SyntheticSpec(n_train=s.n_train, n_test=s.n_test, seed=s.seed,
                                                difficulty=s.difficulty))["train"]


def _workload(a: argparse.Namespace) -> tuple[list[str], list[str], Any]:
    from rlvr_core.sampling import SamplingParams
    from rlvr_core.data.templates import get_template

    t = get_template("qa")
    rows = _demo_rows()[:a.P]
    params = SamplingParams(n=a.G, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=a.T, stop=t.stop, seed=0)
    return [t.render(r["question"]) for r in rows], [r["id"] for r in rows], params


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj).encode()).hexdigest()[:16]


def _call_record(out, dt: float, vocab_in_tokenizer: int, step: int) -> dict[str, Any]:
    samples = [s for g in out for s in g]
    toks = [t for s in samples for t in s.token_ids]
    return {"s": dt, "tokens": len(toks), "tok_per_s": len(toks) / dt, "step": step,
            "completion_len_mean": len(toks) / len(samples),
            "stop_share": sum(s.finish_reason == "stop" for s in samples) / len(samples),
            "ids_beyond_tokenizer": sum(t >= vocab_in_tokenizer for t in toks) / max(len(toks), 1),
            "seeds": _digest([(s.prompt_id, s.sample_index, s.seed) for s in samples])}


def _set_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(n)
    except RuntimeError:
        pass


# ------------------------------------------------------------------------------------------ model builds
def build_demo(a: argparse.Namespace, out: Path) -> dict[str, Any]:
    """The demo's base model: prepare_base_model's warm start with the demo config's spec and data."""
    _set_threads(a.threads)
    from rlvr_core.experiment.config import demo_config
    from rlvr_core.pipeline.stages import warm_start_spec
    from rlvr_core.tiny.model import count_params
    from rlvr_core.tiny.warmstart import WarmStartSpec, save_tiny, train_tiny

    cfg = demo_config()
    spec = warm_start_spec(cfg)
    if a.smoke:  # a few steps of the same recipe, narrower (head_dim 32: vLLM's CPU attention has no 16)
        spec = WarmStartSpec(steps=5, batch_size=16, hidden_size=64, num_layers=2, heads=2, warmup_steps=2)
    t0 = time.perf_counter()
    res = train_tiny(_demo_rows(), spec, template_id=cfg.prompt.template)
    save_tiny(res, out)
    return {"recipe": "demo warm start" + (" (smoke: 5 steps, hidden 64)" if a.smoke else ""),
            "warm_start_steps": spec.steps, "n_params": count_params(res.model), "vocab_size": len(res.tokenizer),
            "tokenizer_size": len(res.tokenizer), "build_s": time.perf_counter() - t0, "dtype": "float32"}


def build_big(a: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Qwen2.5-0.5B's shape at random weights with the demo's tokenizer recipe (trained here)."""
    _set_threads(a.threads)
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from rlvr_core.data.templates import get_template
    from rlvr_core.tiny.model import count_params
    from rlvr_core.tiny.tokenizer import train_tokenizer

    t0 = time.perf_counter()
    t = get_template("qa")
    tok = train_tokenizer((t.render(r["question"]) + " " + r["answer"] for r in _demo_rows()), vocab_size=512)
    shape = dict(SMOKE_BIG if a.smoke else QWEN25_05B)
    if a.big_vocab == "tokenizer":
        shape["vocab_size"] = len(tok)
    cfg = Qwen2Config(**shape, tie_word_embeddings=True, use_sliding_window=False, attention_dropout=0.0,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(cfg)
    model = model.to(getattr(torch, a.big_dtype))
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                               bos_token_id=tok.bos_token_id)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return {"recipe": "Qwen2.5-0.5B shape, random weights (seed 0)" if not a.smoke else "smoke: small Qwen2",
            "shape": shape, "n_params": count_params(model), "vocab_size": shape["vocab_size"],
            "tokenizer_size": len(tok), "build_s": time.perf_counter() - t0, "dtype": a.big_dtype}


# ------------------------------------------------------------------------------------------------ children
def run_hf(a: argparse.Namespace) -> dict[str, Any]:
    _set_threads(a.threads)
    import torch

    t0 = time.perf_counter()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlvr_core.sampling.hf import HFEngine

    tok = AutoTokenizer.from_pretrained(a.model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(a.model_dir, local_files_only=True, dtype=getattr(torch, a.dtype))
    eng = HFEngine(model, tok, batch_size=a.P * a.G)
    startup = time.perf_counter() - t0
    prompts, ids, params = _workload(a)
    eng.generate(prompts, ids, params, step=10**6)  # warm-up
    calls = []
    for r in range(a.reps):
        step = a.round * a.reps + r
        t1 = time.perf_counter()
        out = eng.generate(prompts, ids, params, step=step)
        calls.append({"arm": "hf", **_call_record(out, time.perf_counter() - t1, len(tok), step)})
    return {"engine": "hf", "startup": {"load_s": startup}, "calls": calls,
            "prompt_tokens": _digest([tok(p)["input_ids"] for p in prompts]),
            "checks": {"torch_threads": torch.get_num_threads(), "param_dtype": str(next(model.parameters()).dtype),
                       "tokenizer_class": type(tok).__name__}}


def _raw_n_g(eng, prompts: list[str], ids: list[str], params, step: int) -> int:
    """One request per prompt with n=G and the engine's own kwargs (vLLM derives the child seeds): tokens made."""
    import vllm

    from rlvr_core.sampling.vllm import _NO_LOGPROB_TEXT, to_vllm_sampling_kwargs
    from rlvr_core.core.seeding import request_seed

    reqs, sps = [], []
    for p, pid in zip(prompts, ids):
        kw = to_vllm_sampling_kwargs(params, request_seed(params.seed, pid, step, 0), eng.eos_token_ids)
        kw["n"] = params.n
        reqs.append({"prompt_token_ids": eng.tokenizer(p, add_special_tokens=eng.add_special_tokens)["input_ids"]})
        sps.append(vllm.SamplingParams(**kw, extra_args={_NO_LOGPROB_TEXT: True}))
    outs = eng.llm.generate(reqs, sampling_params=sps, use_tqdm=False)
    return sum(len(c.token_ids) for o in outs for c in o.outputs)


PROFILE_BUCKETS = [  # (label, file suffix, function): cumulative time of these functions
    ("vllm.LLM.generate (all of vLLM)", "vllm/entrypoints/llm.py", "generate"),
    ("  model forward", "vllm/v1/worker/gpu_model_runner.py", "_model_forward"),
    ("  execute_model (forward + input prep)", "vllm/v1/worker/gpu_model_runner.py", "execute_model"),
    ("  sampler (gumbel, raw log-probs)", "vllm/v1/worker/gpu_model_runner.py", "sample_tokens"),
    ("  scheduler.schedule", "vllm/v1/core/sched/scheduler.py", "schedule"),
    ("  scheduler.update_from_output", "vllm/v1/core/sched/scheduler.py", "update_from_output"),
    ("  output processing (detokenize, stop strings, log-probs)", "vllm/v1/engine/output_processor.py",
     "process_outputs"),
    ("    of which log-prob containers", "vllm/v1/engine/logprobs.py", "update_from_output"),
    ("    of which incremental detokenizer", "vllm/v1/engine/detokenizer.py", "update"),
    ("  adding the requests", "vllm/entrypoints/common/offline.py", "_add_completion_requests"),
    ("our _to_sample (stop-token count, decode)", "rlvr_core/sampling/vllm.py", "_to_sample"),
]


def _profile(eng, prompts, ids, params, step: int) -> dict[str, Any]:
    import cProfile
    import pstats

    pr = cProfile.Profile()
    pr.enable()
    eng.generate(prompts, ids, params, step=step)
    pr.disable()
    st = pstats.Stats(pr).stats  # (file, line, func) -> (cc, nc, tt, ct, callers)
    total = sum(v[3] for k, v in st.items() if k[0].endswith("rlvr_core/sampling/vllm.py") and k[2] == "generate")
    out = {"total_s": total, "buckets": []}
    for label, f, fn in PROFILE_BUCKETS:
        ct = sum(v[3] for k, v in st.items() if k[0].endswith(f) and k[2] == fn)
        out["buckets"].append({"what": label, "s": ct, "share": ct / total if total else 0.0})
    return out


def run_vllm(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    t_start = time.perf_counter()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a.model_dir, local_files_only=True)
    t0 = time.perf_counter()
    import vllm  # noqa: F401

    import_s = time.perf_counter() - t0
    from rlvr_core.sampling.vllm import VLLMEngine

    extra = {"enforce_eager": False} if a.compiled else {}
    t0 = time.perf_counter()
    eng = VLLMEngine(a.model_dir, tokenizer=tok, dtype=a.dtype, **extra)
    build_s = time.perf_counter() - t0
    child_to_engine_s = time.perf_counter() - t_start
    prompts, ids, params = _workload(a)
    t0 = time.perf_counter()
    eng.generate(prompts, ids, params, step=10**6)  # warm-up (compiled: the first shapes)
    first_call_s = time.perf_counter() - t0
    name = "vllm-compiled" if a.compiled else "vllm"
    arms = [name] if a.compiled else ["vllm", "vllm-before", "vllm-raw-nG"]
    calls = []
    for r in range(a.reps):
        step = a.round * a.reps + r
        for arm in arms:
            eng.skip_logprob_text = arm != "vllm-before"
            t1 = time.perf_counter()
            if arm == "vllm-raw-nG":
                n = _raw_n_g(eng, prompts, ids, params, step)
                dt = time.perf_counter() - t1
                calls.append({"arm": arm, "s": dt, "tokens": n, "tok_per_s": n / dt, "step": step,
                              "completion_len_mean": n / (len(prompts) * params.n)})
            else:
                out = eng.generate(prompts, ids, params, step=step)
                calls.append({"arm": arm, **_call_record(out, time.perf_counter() - t1, len(tok), step)})
    eng.skip_logprob_text = True

    model = AutoModelForCausalLM.from_pretrained(a.model_dir, local_files_only=True, dtype=getattr(torch, a.dtype))
    state = model.state_dict()
    pushes = []
    for _ in range(a.reps):
        t1 = time.perf_counter()
        eng.load_weights(state.items())
        pushes.append(time.perf_counter() - t1)
    profile = _profile(eng, prompts, ids, params, step=10**6 + 1) if a.profile else None
    return {"engine": name, "startup": {"import_vllm_s": import_s, "llm_build_s": build_s,
                                        "first_call_s": first_call_s, "child_to_engine_s": child_to_engine_s},
            "calls": calls, "push_s": pushes, "push_bytes": sum(t.numel() * t.element_size() for t in state.values()),
            "profile": profile, "prompt_tokens": _digest([tok(p)["input_ids"] for p in prompts]),
            "checks": {"torch_threads": torch.get_num_threads(), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
                       "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND"),
                       "logprob_text_skipped": bool(eng._logprob_text_skippable), "llm_kwargs": extra,
                       "vllm": vllm.__version__, "tokenizer_class": type(tok).__name__}}


# ------------------------------------------------------------------------------------------------ parent
def _spawn(a: argparse.Namespace, args: list[str], out: Path, log: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in DIST_VARS}
    env.update(OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads), TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_CACHE_ROOT=str(a.work / "vllm-cache"),
               VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_OMP_THREADS_BIND="nobind")
    cmd = [sys.executable, __file__, *args, "--child-out", str(out)]
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    with open(log, "w") as err:
        proc = subprocess.run(cmd, env=env, stdout=err, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"child failed ({' '.join(args)}); the end of {log}:\n{log.read_text()[-4000:]}")
    res = json.loads(out.read_text())
    res["loadavg_1m"] = [load0, os.getloadavg()[0]]
    res["child_wall_s"] = time.perf_counter() - t0
    return res


def _model_dir(a: argparse.Namespace, model: str) -> tuple[Path, dict[str, Any]]:
    d = a.work / ("demo" if model == "demo" else f"qwen2.5-0.5b-shape-{a.big_vocab}-{a.big_dtype}") \
        / ("smoke" if a.smoke else "full")
    meta = d / "bench_model.json"
    if not meta.is_file():
        d.mkdir(parents=True, exist_ok=True)
        print(f"building the {model} model in {d} ...", flush=True)
        info = _spawn(a, ["--child", f"build-{model}", "--model-dir", str(d), *a.common], d / "build.json",
                      d / "build.log")
        meta.write_text(json.dumps(info, indent=2))
    return d, json.loads(meta.read_text())


def _sizes(a: argparse.Namespace, model: str) -> dict[str, Any]:
    if model == "demo":
        return {"P": a.demo_p, "G": a.demo_g, "T": a.demo_tokens, "dtype": "float32"}
    return {"P": a.big_p, "G": a.big_g, "T": a.big_tokens, "dtype": a.big_dtype}


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


ARM_LABELS = {"hf": "hf (HFEngine, batch P*G)", "vllm": "vllm (VLLMEngine: seeded n=1 per sample)",
              "vllm-before": "vllm, before the fix (log-prob token text)",
              "vllm-raw-nG": "vllm raw n=G (1 request/prompt, vLLM's seeds)",
              "vllm-compiled": "vllm compiled (enforce_eager=False)"}


def summarise(runs: list[dict]) -> dict[str, Any]:
    """Per model and arm: medians over every measured call of every round, and start-up / push medians."""
    out: dict[str, Any] = {}
    for model in dict.fromkeys(r["model"] for r in runs):
        mr = [r for r in runs if r["model"] == model]
        arms: dict[str, Any] = {}
        for r in mr:
            for c in r["calls"]:
                arms.setdefault(c["arm"], {"calls": []})["calls"].append(c)
        for arm, d in arms.items():
            cs = d.pop("calls")
            d.update(n_calls=len(cs), tok_per_s=_med([c["tok_per_s"] for c in cs]), s=_med([c["s"] for c in cs]),
                     completion_len_mean=statistics.mean(c["completion_len_mean"] for c in cs))
            if "stop_share" in cs[0]:
                d["stop_share"] = statistics.mean(c["stop_share"] for c in cs)
                d["ids_beyond_tokenizer"] = statistics.mean(c["ids_beyond_tokenizer"] for c in cs)
        hf = arms.get("hf", {}).get("tok_per_s")
        for d in arms.values():
            d["x_hf"] = d["tok_per_s"] / hf if hf else None
        for r in mr:
            st = r["startup"]
            a = arms[r["engine"]]
            if r["engine"] == "hf":
                a.setdefault("startup_s", []).append(st["load_s"])
            else:
                a.setdefault("startup_s", []).append(st["import_vllm_s"] + st["llm_build_s"])
                a.setdefault("import_s", []).append(st["import_vllm_s"])
                a.setdefault("build_s", []).append(st["llm_build_s"])
                a.setdefault("push_s", []).extend(r["push_s"])
        # same prompts (token ids) and the same per-request seeds, call by call, in every engine
        seeds: dict[tuple, set] = {}
        for r in mr:
            for c in r["calls"]:
                if "seeds" in c:
                    seeds.setdefault((c["step"],), set()).add(c["seeds"])
        out[model] = {"arms": arms, "same_prompt_tokens": len({r["prompt_tokens"] for r in mr}) == 1,
                      "same_seeds_every_call": all(len(v) == 1 for v in seeds.values())}
    return out


def table(summ: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = ["| model | arm | rollout tok/s | x hf | mean new tokens | start-up s | weight push s |",
             "|---|---|---|---|---|---|---|"]
    for model, m in summ.items():
        info = meta[model]
        sz = info["sizes"]
        label = (f"{model} ({info['n_params'] / 1e6:.1f}M, {sz['dtype']}, P={sz['P']} G={sz['G']} "
                 f"max {sz['T']} tok)")
        for arm in ("hf", "vllm", "vllm-before", "vllm-raw-nG", "vllm-compiled"):
            d = m["arms"].get(arm)
            if d is None:
                continue
            if arm == "hf":
                start = f"{_med(d['startup_s']):.1f} (load)"
            elif "startup_s" in d:
                b = d["build_s"]
                start = f"{_med(d['import_s']):.1f} + {b[0]:.1f}" + (f" (then {_med(b[1:]):.1f})" if len(b) > 1 else "")
            else:
                start = "(same engine)"
            push = f"{_med(d['push_s']):.3f}" if d.get("push_s") else ""
            lines.append(f"| {label} | {ARM_LABELS[arm]} | {d['tok_per_s']:.1f} | {d['x_hf']:.2f} | "
                         f"{d['completion_len_mean']:.1f} | {start} | {push} |")
            label = ""
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="demo,0.5b", help=f"comma-separated, from {MODELS}")
    ap.add_argument("--rounds", type=int, default=2, help="repeat hf, vllm, vllm-compiled this many times")
    ap.add_argument("--reps", type=int, default=3, help="measured generate calls per arm per child (+1 warm-up)")
    ap.add_argument("--threads", type=int, default=2, help="torch / OpenMP threads in every child")
    ap.add_argument("--demo-p", type=int, default=16)
    ap.add_argument("--demo-g", type=int, default=8)
    ap.add_argument("--demo-tokens", type=int, default=48)
    ap.add_argument("--big-p", type=int, default=4)
    ap.add_argument("--big-g", type=int, default=4)
    ap.add_argument("--big-tokens", type=int, default=32)
    ap.add_argument("--big-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--big-vocab", default="full", choices=["full", "tokenizer"],
                    help="0.5B vocab: Qwen2.5's 151936 (ids beyond the tokenizer decode to nothing) or the tokenizer's")
    ap.add_argument("--no-compiled", action="store_true", help="skip the vllm enforce_eager=False child")
    ap.add_argument("--no-profile", action="store_true", help="skip the cProfile breakdown of one vllm call")
    ap.add_argument("--smoke", action="store_true", help="tiny models and sizes, 1 round, 1 rep, no compiled arm")
    ap.add_argument("--work", type=Path, default=None, help="models and scratch (default: a fresh temp dir)")
    ap.add_argument("--json", type=Path, default=None)
    # child-only
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--dtype", help=argparse.SUPPRESS)
    ap.add_argument("--P", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--G", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--T", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--compiled", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()

    if a.child:
        fn = {"build-demo": lambda: build_demo(a, Path(a.model_dir)),
              "build-0.5b": lambda: build_big(a, Path(a.model_dir)),
              "hf": lambda: run_hf(a), "vllm": lambda: run_vllm(a)}[a.child]
        a.child_out.write_text(json.dumps(fn(), default=str))
        return

    if a.smoke:
        a.rounds, a.reps, a.no_compiled = 1, 1, True
        a.demo_p, a.demo_g, a.demo_tokens, a.big_p, a.big_g, a.big_tokens = 2, 2, 8, 2, 2, 8
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    for m in models:
        if m not in MODELS:
            raise SystemExit(f"unknown model {m!r}: known {MODELS}")
    a.work = (a.work or Path(tempfile.mkdtemp(prefix="bench-engines-"))).resolve()
    a.work.mkdir(parents=True, exist_ok=True)
    a.common = ["--threads", str(a.threads), "--big-vocab", a.big_vocab, "--big-dtype", a.big_dtype,
                *(["--smoke"] if a.smoke else [])]
    t_start = time.perf_counter()
    load_before = os.getloadavg()
    meta: dict[str, Any] = {}
    for m in models:
        d, info = _model_dir(a, m)
        meta[m] = {**info, "dir": str(d), "sizes": _sizes(a, m)}
    engines = ["hf", "vllm"] + ([] if a.no_compiled else ["vllm-compiled"])
    runs: list[dict] = []
    for rnd in range(a.rounds):
        for m in models:
            sz = meta[m]["sizes"]
            for e in engines:
                args = ["--child", "hf" if e == "hf" else "vllm", "--model-dir", meta[m]["dir"], "--dtype", sz["dtype"],
                        "--P", str(sz["P"]), "--G", str(sz["G"]), "--T", str(sz["T"]), "--reps", str(a.reps),
                        "--round", str(rnd), *a.common]
                if e == "vllm-compiled":
                    args.append("--compiled")
                if e == "vllm" and rnd == a.rounds - 1 and not a.no_profile:
                    args.append("--profile")
                tag = f"round{rnd}-{m}-{e}"
                r = _spawn(a, args, a.work / f"{tag}.json", a.work / f"{tag}.log")
                r.update(model=m, round=rnd)
                runs.append(r)
                meds = {}
                for c in r["calls"]:
                    meds.setdefault(c["arm"], []).append(c["tok_per_s"])
                print(f"[{tag}] " + ", ".join(f"{k} {_med(v):.1f} tok/s" for k, v in meds.items())
                      + f"; child {r['child_wall_s']:.0f}s, loadavg {r['loadavg_1m'][0]:.2f}->{r['loadavg_1m'][1]:.2f}",
                      flush=True)
    load_after = os.getloadavg()
    summ = summarise(runs)

    print()
    print(f"threads={a.threads} rounds={a.rounds} reps={a.reps} (+1 warm-up per child); loadavg(1m/5m/15m) "
          f"before {'/'.join(f'{x:.2f}' for x in load_before)}, after {'/'.join(f'{x:.2f}' for x in load_after)}; "
          f"wall {time.perf_counter() - t_start:.0f}s; work {a.work}")
    for m, info in meta.items():
        print(f"{m}: {info['recipe']}; {info['n_params']:,} parameters, vocab {info['vocab_size']} "
              f"(tokenizer {info['tokenizer_size']}); same prompt token ids in every child: "
              f"{summ[m]['same_prompt_tokens']}; same per-request seeds in every engine, call by call: "
              f"{summ[m]['same_seeds_every_call']}")
        for arm, d in summ[m]["arms"].items():
            if "stop_share" in d:
                print(f"  {arm}: finished by eos/stop string {d['stop_share']:.3f}, sampled ids beyond the tokenizer "
                      f"{d['ids_beyond_tokenizer']:.3f}")
    checks = {(r["model"], r["engine"]): r["checks"] for r in runs}
    for (m, e), c in checks.items():
        print(f"  checks {m}/{e}: {c}")
    print(table(summ, meta))
    for r in runs:
        if r.get("profile"):
            p = r["profile"]
            print(f"\ncProfile of one vllm call, {r['model']} (profiled {p['total_s']:.2f}s; shares of that):")
            for b in p["buckets"]:
                print(f"  {b['what']:<62s} {b['s']:7.3f}s {100 * b['share']:5.1f}%")
    if a.json:
        a.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "models": meta,
                                      "summary": summ, "loadavg_before": load_before, "loadavg_after": load_after,
                                      "runs": runs}, indent=2, default=str))


if __name__ == "__main__":
    main()
