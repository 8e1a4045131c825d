"""Does the tool demo's warm start learn the two copies the calculator needs? Warm-start the base model of
configs/examples/tool-demo.yaml (products 3 x 2 digits, demonstrations calling the calculator at a share) in this
process and measure, greedily on 100 held-out problems:
  called             prompts whose greedy answer calls the calculator (the demo wants few: the base answers in its head)
  call_copied_forced after the prompt and " <calculator>", the call's operands copied: "347*28</calculator>"
  answer_copied      after the call and the calculator's answer (the ids the tools environment writes), "#### <answer>"

    python benchmarks/tool_warmstart_copying.py                               # the demo's recipe, 2 threads
    RLVR_CPU_CAPABILITY=native python benchmarks/tool_warmstart_copying.py    # the machine's own kernels
    python benchmarks/tool_warmstart_copying.py --set teacher_tool_share=0.3 --set steps=800 --n-train 6000

Prints one JSON line. Results: docs/environments.md, "Warm start".
"""

from __future__ import annotations

import argparse
import json
import time

import rlvr_core  # noqa: F401  (pins the kernels before torch's first one: rlvr_core.core.numerics)
import torch

from dataclasses import replace
from pathlib import Path

from rlvr_core.core.numerics import numerics
from rlvr_core.data.synthetic import ProductsSpec, make_products_dataset
from rlvr_core.data.templates import get_template
from rlvr_core.environments.boundary import TextBoundary
from rlvr_core.experiment.config import load_config
from rlvr_core.pipeline.base_model_stage import warm_start_spec
from rlvr_core.tiny.warmstart import train_tiny

RECIPE = Path(__file__).resolve().parents[1] / "configs" / "examples" / "tool-demo.yaml"


def _greedy(model, ids: list[int], n: int, tok) -> str:
    out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)
    return tok.decode(out[0, len(ids):], skip_special_tokens=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="a WarmStartSpec field")
    ap.add_argument("--n-train", type=int, default=2000, help="training problems (the recipe has 2,000)")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    fields = {k: json.loads(v) for k, v in (s.split("=", 1) for s in a.set)}
    cfg = load_config(RECIPE)  # the recipe's warm start, data, template and boundary, as `rlvr demo -c` builds them
    spec = replace(warm_start_spec(cfg), **fields)
    data = cfg.data.synthetic
    ds = make_products_dataset(ProductsSpec(n_train=a.n_train, n_test=data.n_test, seed=data.seed,
                                            digits=tuple(data.digits)))
    t0 = time.perf_counter()
    res = train_tiny(ds["train"], spec, template_id=cfg.prompt.template)
    model, tok, template = res.model, res.tokenizer, get_template(cfg.prompt.template)
    env = cfg.environment
    boundary = TextBoundary(tok, prefix=env.observation_prefix, suffix=env.observation_suffix)
    counts = {"called": 0, "call_copied_forced": 0, "answer_copied": 0}
    with torch.no_grad():
        for row in ds["test"][:100]:
            x, y = row["question"].removeprefix("What is ").removesuffix("?").split(" * ")
            prompt = tok(template.render(row["question"]), add_special_tokens=False)["input_ids"]
            counts["called"] += "<calculator>" in _greedy(model, prompt, 16, tok)
            forced = prompt + tok(" <calculator>", add_special_tokens=False)["input_ids"]
            counts["call_copied_forced"] += _greedy(model, forced, 12, tok).startswith(f"{x}*{y}</calculator>")
            context = (prompt + tok(f" <calculator>{x}*{y}</calculator>", add_special_tokens=False)["input_ids"]
                       + boundary.observation_ids(row["final_answer"]))
            counts["answer_copied"] += _greedy(model, context, 10, tok).strip().startswith(f"#### {row['final_answer']}")
    print(json.dumps({"spec": fields, "n_train": a.n_train, "of": 100, **counts,
                      "final_loss_avg20": round(res.meta["final_loss_avg20"], 3), "numerics": numerics(),
                      "wall_s": round(time.perf_counter() - t0)}))


if __name__ == "__main__":
    main()
