"""G-chat-template at run start: the pass-rate and GRPO stages check the experiment's template against the model's
real tokenizer before they sample, refusing what would sample garbage and logging what is only doubtful.

The model is a real tiny Qwen2 built from a config, with the project's locally trained byte-level tokenizer (which,
like a base model's, has no chat control tokens); nothing is downloaded."""

from __future__ import annotations

import shutil

import pytest

from rlvr_core.core import settings
from rlvr_core.data.templates import PromptTemplate, TemplateError, known_templates, register_template
from rlvr_core.experiment.config import parse_config
from rlvr_core.pipeline import stages

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

# Base templates the registry does not ship: one leaks chat tokens into the prompt, one has no stop sequence.
for _t in (PromptTemplate(id="_test_leaky", version="0", kind="base", pattern="<|im_start|>user\n{question}\nAnswer:",
                          stop=("\n",)),
           PromptTemplate(id="_test_nostop", version="0", kind="base", pattern="Question: {question}\nAnswer:")):
    if _t.id not in known_templates():
        register_template(_t)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """{"base": a tiny model folder (tokenizer without chat tokens), "chat": the same folder whose tokenizer was
    given a ChatML chat template: its <|im_start|>/<|im_end|> are not tokens of it}."""
    from rlvr_core.data.synthetic import SyntheticSpec, make_synthetic_dataset
    from rlvr_core.tiny.model import build_tiny_model
    from rlvr_core.tiny.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("template-models")
    rows = make_synthetic_dataset(SyntheticSpec(n_train=50, n_test=4))["train"]
    tok = train_tokenizer([f"Question: {r['question']}\nAnswer: {r['answer']}" for r in rows], vocab_size=300)
    build_tiny_model(tok, hidden_size=16, num_layers=1, heads=2).save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    shutil.copytree(root / "base", root / "chat")
    tok.chat_template = CHATML
    tok.save_pretrained(root / "chat")
    return {"base": root / "base", "chat": root / "chat"}


def _cfg(model_dir, **over):
    d = {"model": {"source": "hf", "path": str(model_dir)},
         "data": {"synthetic": {"n_train": 8, "n_test": 4}},
         "sampling": {"max_new_tokens": 4, "batch_size": 8},
         "passk": {"n_samples": 2, "ks": [1, 2], "max_prompts": 3, "drop_never_solved": False},
         "grpo": {"enabled": True, "steps": 1, "prompts_per_step": 2, "group_size": 2}}
    for section, values in over.items():
        d[section] = {**d.get(section, {}), **values}
    return parse_config(d)


def _sampled() -> list:
    """Every pass-rate sample file and GRPO folder under the cache: what a stage leaves once it sampled."""
    cache = settings.paths().cache
    return sorted(cache.rglob("samples.parquet")) + sorted((cache / "grpo").glob("*"))


def test_pass_rate_stage_refuses_chat_tokens_in_a_base_prompt_before_sampling(rlvr_home, models):
    cfg = _cfg(models["base"], prompt={"template": "_test_leaky"})
    data = stages.prepare_data(cfg)
    model = stages.prepare_base_model(cfg, data)
    with pytest.raises(TemplateError, match=r"_test_leaky@0 .*chat/special tokens \['<\|im_start\|>'\]"):
        stages.pass_rate_stage(cfg, data, model)
    assert _sampled() == []
    # The same model and stage sample once the template is acceptable; a doubtful one is logged and summarised.
    lines = []
    art = stages.pass_rate_stage(_cfg(models["base"], prompt={"template": "_test_nostop"}), data, model,
                                 progress=lambda stage, msg, **kw: lines.append((stage, msg)))
    (warning,) = art.summary["template_warnings"]
    assert "G-stop-seq" in warning and ("pass@k", f"warning: {warning}") in lines
    assert len(_sampled()) == 1 and art.summary["n_problems"] == 3
    assert stages.pass_rate_stage(_cfg(models["base"]), data, model).summary["template_warnings"] == []


def test_sampling_stages_refuse_a_chat_template_whose_tokens_the_tokenizer_lacks(rlvr_home, models):
    """A chat model config whose tokenizer's chat template writes control tokens the tokenizer does not have:
    both the pass-rate stage and the GRPO stage fail before sampling, naming the tokens."""
    good = _cfg(models["base"])
    data = stages.prepare_data(good)
    base = stages.prepare_base_model(good, data)
    curriculum = stages.curriculum_stage(good, data, stages.pass_rate_stage(good, data, base))
    assert curriculum.n_prompts == 3
    before = _sampled()

    chat = _cfg(models["chat"], model={"kind": "chat"}, prompt={"template": "chat_qa"})
    chat_model = stages.prepare_base_model(chat, data)
    missing = (r"chat_qa@1: the tokenizer's chat template writes \['<\|im_end\|>', '<\|im_start\|>'\], "
               "which are not tokens")
    with pytest.raises(TemplateError, match=missing):
        stages.pass_rate_stage(chat, data, chat_model)
    with pytest.raises(TemplateError, match=missing):
        stages.train_stage(chat, data, chat_model, curriculum)
    assert _sampled() == before  # no new samples, no training folder
