"""Supervised warm start: turn a fresh tiny model into the demo's (weak but not hopeless) base model.

``warm_start(train_rows, out_dir, spec)`` trains a byte-level BPE tokenizer and a tiny Qwen2 from
scratch on ``template.render(question) + " " + answer + eos`` with the loss on the answer tokens only
(the prompt is masked with -100), then saves model, tokenizer and generation config with
``save_pretrained`` into ``out_dir`` plus ``out_dir/warmstart.json`` (spec, final loss, parameter
count, wall time). The prompt and the completion are tokenized separately and concatenated, exactly as
a sampler sees them (prompt ids, then generated ids). ``WarmStartSpec.teacher_*`` make the answers a weak
teacher's instead of the gold ones (``teacher_answer``): the demo's base learns a habit that RL then undoes.

``evaluate_base(model_dir, rows)`` is the measurement used in docs/tiny_model.md: greedy accuracy and
pass@k of the saved model on held-out rows (stop at eos or the template's stop sequences; correct when
the number after the last "####" equals ``final_answer``).

Run ``python -m rlvr_core.tiny.warmstart --out /tmp/tiny-base`` to reproduce the documented numbers.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from rlvr_core.data.synthetic import SyntheticSpec, make_synthetic_dataset
from rlvr_core.data.templates import get_template
from rlvr_core.tiny.model import build_tiny_model, count_params
from rlvr_core.tiny.spec import WarmStartSpec
from rlvr_core.tiny.tokenizer import train_tokenizer

__all__ = [
    "WarmStartSpec",
    "warm_start",
    "train_tiny",
    "save_tiny",
    "TinyTrainResult",
    "evaluate_base",
    "extract_final",
    "WARMSTART_FILE",
]

WARMSTART_FILE = "warmstart.json"


_STEP_RE = re.compile(r"^(\d+) ([-+*]) (\d+) = (\d+)$")


def teacher_answer(answer: str, rate: float, rng: random.Random, stops_early: float = 0.0) -> str:
    """The worked answer as the weak teacher writes it: each subtraction step becomes an addition with
    probability ``rate``; every line after it starts from the teacher's (wrong) running total. With
    probability ``stops_early`` the answer ends one step early (a problem of one step is left whole)."""
    if rate <= 0 and stops_early <= 0:
        return answer
    lines = answer.split("\n")
    steps = [_STEP_RE.match(line) for line in lines[:-1]]
    if not steps or not all(steps) or not lines[-1].startswith("####"):
        return answer  # not a synthetic worked answer: left as it is
    if stops_early > 0 and len(steps) > 1 and rng.random() < stops_early:
        steps = steps[:-1]
    cur, out = int(steps[0].group(1)), []
    for m in steps:
        op, n = m.group(2), int(m.group(3))
        if op == "-" and rate > 0 and rng.random() < rate:
            op = "+"
        new = cur + n if op == "+" else cur - n if op == "-" else cur * n
        out.append(f"{cur} {op} {n} = {new}")
        cur = new
    return "\n".join(out) + f"\n#### {cur}"


def _texts(rows: list[dict], template_id: str, spec: WarmStartSpec) -> list[tuple[str, list[tuple[str, bool]]]]:
    """(prompt, segments) per row: the completion as (text, trained) pieces (`_segments`)."""
    t = get_template(template_id)
    rng = random.Random(f"teacher-{spec.seed}")
    return [(t.render(r["question"]), _segments(r, " " + _demonstration(r, spec, rng))) for r in rows]


def _demonstration(row: dict, spec: WarmStartSpec, rng: random.Random) -> str:
    """The teacher's answer: a products row calls the calculator with probability `teacher_tool_share`, else
    answers at once; a word problem is worked as `teacher_answer` writes it."""
    if spec.teacher_tool_share and row["answer"].startswith("<calculator>"):
        return row["answer"] if rng.random() < spec.teacher_tool_share else f"#### {row['final_answer']}"
    return teacher_answer(row["answer"], spec.teacher_sub_as_add, rng, spec.teacher_stops_early)


_TOOL_TURN = re.compile(r"^(.*?</calculator>)(.*?)(####.*)$", re.DOTALL)
_HEAD_ANSWER = re.compile(r"^( ####\s*)(.*)$", re.DOTALL)


def _segments(row: dict, completion: str) -> list[tuple[str, bool]]:
    """The completion as (text, trained) pieces, each encoded alone. A products row (the tool demo) has two kinds
    of demonstration, and in each the model is trained on what it can learn to write:
    - with the calculator, three pieces as the tools environment builds the trajectory: the call (the model
      writes it), the tool's answer (the environment writes it: context, never a label, as GRPO's mask has it)
      and the final answer the model copies from it;
    - in the head, "#### " is trained (the decision to answer at once, and the form) but not the product's
      digits: a model this size cannot compute them, and learning to guess them drowns the copying the tool
      needs. Trained on both, whether the warm start learned to copy operands and answers at all turned on the
      kernels' rounding (docs/environments.md, "Warm start").
    A word problem's worked answer is one trained piece."""
    if not row["answer"].startswith("<calculator>"):
        return [(completion, True)]
    turn = _TOOL_TURN.match(completion)
    if turn is not None:
        return [(turn.group(1), True), (turn.group(2), False), (turn.group(3), True)]
    head = _HEAD_ANSWER.match(completion)
    return [(head.group(1), True), (head.group(2), False)] if head else [(completion, True)]


def _encode(tok, pairs: list[tuple[str, list[tuple[str, bool]]]]) -> list[tuple[list[int], list[int], list[bool]]]:
    """(prompt ids, completion ids + eos, trained flag per completion id)."""
    prompts = tok([p for p, _ in pairs], add_special_tokens=False)["input_ids"]
    out = []
    for p, (_, segments) in zip(prompts, pairs):
        ids, trained = [], []
        for text, learn in segments:
            piece = tok(text, add_special_tokens=False)["input_ids"]
            ids += piece
            trained += [learn] * len(piece)
        out.append((p, ids + [tok.eos_token_id], trained + [True]))
    return out


def _batch(examples: list[tuple[list[int], list[int], list[bool]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded batch; labels are -100 on prompt, pad and untrained positions (`_segments`)."""
    n = max(len(p) + len(c) for p, c, _ in examples)
    ids = torch.full((len(examples), n), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), n), -100, dtype=torch.long)
    mask = torch.zeros((len(examples), n), dtype=torch.long)
    for i, (p, c, trained) in enumerate(examples):
        seq = p + c
        ids[i, : len(seq)] = torch.tensor(seq)
        labels[i, len(p) : len(seq)] = torch.tensor([t if learn else -100 for t, learn in zip(c, trained)])
        mask[i, : len(seq)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _lr_at(step: int, spec: WarmStartSpec) -> float:
    if step < spec.warmup_steps:
        return spec.lr * (step + 1) / spec.warmup_steps
    frac = (step - spec.warmup_steps) / max(1, spec.steps - spec.warmup_steps)
    return spec.lr * (spec.min_lr_ratio + (1 - spec.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


@dataclass
class TinyTrainResult:
    model: Any  # Qwen2ForCausalLM, in eval mode
    tokenizer: Any  # PreTrainedTokenizerFast
    meta: dict[str, Any]  # what goes into warmstart.json


def train_tiny(
    train_rows: list[dict],
    spec: WarmStartSpec,
    *,
    template_id: str = "qa",
    progress: Callable[[int, int, float], None] | None = None,
) -> TinyTrainResult:
    """Train tokenizer + tiny model from scratch on the rows, in memory (``warm_start`` = this + save)."""
    if not train_rows:
        raise ValueError("warm_start needs at least one training row")
    if spec.steps < 1 or spec.batch_size < 1:
        raise ValueError(f"steps and batch_size must be >= 1, got {spec.steps}, {spec.batch_size}")
    t0 = time.perf_counter()
    old_threads = torch.get_num_threads()
    if spec.num_threads:
        torch.set_num_threads(spec.num_threads)
    try:
        pairs = _texts(train_rows, template_id, spec)
        tok = train_tokenizer((p + "".join(t for t, _ in c) for p, c in pairs), vocab_size=spec.vocab_size)
        examples = _encode(tok, pairs)
        model = build_tiny_model(
            tok,
            hidden_size=spec.hidden_size,
            num_layers=spec.num_layers,
            heads=spec.heads,
            intermediate_size=spec.intermediate_size,
            seed=spec.seed,
        )
        n_params = count_params(model)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=spec.weight_decay, betas=(0.9, 0.98))
        rng = random.Random(spec.seed)
        order: list[int] = []
        losses: list[float] = []
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(spec.seed)
            for step in range(spec.steps):
                idx = []
                while len(idx) < spec.batch_size:
                    if not order:
                        order = list(range(len(examples)))
                        rng.shuffle(order)
                    idx.append(order.pop())
                batch = _batch([examples[i] for i in idx], tok.pad_token_id)
                for g in opt.param_groups:
                    g["lr"] = _lr_at(step, spec)
                loss = model(**batch).loss
                opt.zero_grad(set_to_none=True)
                loss.backward()
                if spec.grad_clip:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip)
                opt.step()
                losses.append(float(loss.detach()))
                if progress is not None and ((step + 1) % spec.progress_every == 0 or step + 1 == spec.steps):
                    progress(step + 1, spec.steps, losses[-1])
        model.eval()
        tail = losses[-min(20, len(losses)) :]
        meta = {
            "spec": asdict(spec),
            "template_id": template_id,
            "template": get_template(template_id).key,
            "n_train_rows": len(train_rows),
            "first_loss": losses[0],
            "final_loss": losses[-1],
            "final_loss_avg20": sum(tail) / len(tail),
            "n_params": n_params,
            "vocab_size": len(tok),
            "wall_time_s": round(time.perf_counter() - t0, 3),
            "torch_threads": torch.get_num_threads(),
            "torch_version": torch.__version__,
        }
        return TinyTrainResult(model=model, tokenizer=tok, meta=meta)
    finally:
        torch.set_num_threads(old_threads)


def save_tiny(result: TinyTrainResult, out_dir: Path) -> Path:
    """save_pretrained model (with generation_config) and tokenizer into out_dir, plus warmstart.json."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    result.model.save_pretrained(out_dir)
    result.tokenizer.save_pretrained(out_dir)
    (out_dir / WARMSTART_FILE).write_text(json.dumps(result.meta, indent=2) + "\n")
    return out_dir


def warm_start(
    train_rows: list[dict],
    out_dir: Path,
    spec: WarmStartSpec,
    *,
    template_id: str = "qa",
    progress: Callable[[int, int, float], None] | None = None,
) -> Path:
    """Train tokenizer + tiny model from scratch on the rows; save everything into ``out_dir``; return it.

    ``warmstart.json`` records the spec, first/final loss, parameter count and wall time (training,
    tokenizer training included; saving adds well under a second).
    """
    t0 = time.perf_counter()
    res = train_tiny(train_rows, spec, template_id=template_id, progress=progress)
    res.meta["wall_time_s"] = round(time.perf_counter() - t0, 3)
    return save_tiny(res, Path(out_dir))


_FINAL_RE = re.compile(r"####\s*(-?[\d,]+)")


def extract_final(completion: str) -> str | None:
    """The number after the last '####' (commas dropped), or None."""
    m = _FINAL_RE.findall(completion)
    return m[-1].replace(",", "") if m else None


def _truncate(text: str, stops: tuple[str, ...]) -> str:
    cut = len(text)
    for s in stops:
        i = text.find(s)
        if i != -1:
            cut = min(cut, i)
    return text[:cut]


@torch.no_grad()
def evaluate_base(
    model_dir: str | Path,
    rows: list[dict],
    *,
    template_id: str = "qa",
    k: int = 8,
    temperature: float = 1.0,
    max_new_tokens: int = 64,
    batch_size: int = 200,
    seed: int = 0,
) -> dict[str, float]:
    """Greedy accuracy and pass@k (k samples at ``temperature``) of a saved model on ``rows``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    t = get_template(template_id)
    prompts = [t.render(r["question"]) for r in rows]
    gold = [str(r["final_answer"]) for r in rows]

    def gen(do_sample: bool, n: int) -> list[list[str]]:
        outs: list[list[str]] = []
        for b in range(0, len(prompts), batch_size):
            enc = tok(prompts[b : b + batch_size], return_tensors="pt", padding=True, add_special_tokens=False)
            kw = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if do_sample else dict(do_sample=False)
            out = model.generate(**enc, max_new_tokens=max_new_tokens, num_return_sequences=n, **kw)
            texts = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            outs.extend(texts[i * n : (i + 1) * n] for i in range(len(texts) // n))
        return outs

    torch.manual_seed(seed)
    greedy = gen(False, 1)
    samples = gen(True, k)
    g_ok = [extract_final(_truncate(o[0], t.stop)) == g for o, g in zip(greedy, gold)]
    s_ok = [[extract_final(_truncate(x, t.stop)) == g for x in o] for o, g in zip(samples, gold)]
    return {
        "n": len(rows),
        "greedy_acc": sum(g_ok) / len(rows),
        f"pass@{k}": sum(any(s) for s in s_ok) / len(rows),
        "sample_acc": sum(sum(s) for s in s_ok) / (k * len(rows)),
        "format_rate_greedy": sum(extract_final(_truncate(o[0], t.stop)) is not None for o in greedy) / len(rows),
    }


def _main() -> None:
    ap = argparse.ArgumentParser(description="Warm-start the tiny base model and measure it on the test split.")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--difficulty", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--teacher-sub-as-add", type=float, default=0.0)
    ap.add_argument("--teacher-stops-early", type=float, default=0.0)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    ds = make_synthetic_dataset(SyntheticSpec(seed=a.seed, difficulty=a.difficulty))
    spec = WarmStartSpec(seed=a.seed, teacher_sub_as_add=a.teacher_sub_as_add, teacher_stops_early=a.teacher_stops_early,
                         **({} if a.steps is None else {"steps": a.steps}))
    warm_start(ds["train"], a.out, spec, progress=lambda s, n, l: print(f"step {s}/{n} loss {l:.4f}", flush=True)
               if s % 50 == 0 or s == n else None)  # fmt: skip
    meta = json.loads((a.out / WARMSTART_FILE).read_text())
    t1 = time.perf_counter()
    res = evaluate_base(a.out, ds["test"])
    res["eval_wall_s"] = round(time.perf_counter() - t1, 1)
    print(json.dumps({k: meta[k] for k in ("wall_time_s", "n_params", "first_loss", "final_loss_avg20")} | res))


if __name__ == "__main__":
    _main()
