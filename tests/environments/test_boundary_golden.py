"""Golden tests of the boundary adapter against the real chat templates (../shared/data/chat_templates/, skipped with
the path where absent): a tool loop assembled token-in/token-out (the prompt, the sampled turn and its end-of-turn
token, the adapter's observation piece, the final turn) must be exactly what the template renders for the whole
conversation, as text for every family and as ids for the Qwen family (its real BPE, from vocab.json and
merges.txt). Templates that rewrite history drift by design; the test pins which and how (docs/environments.md).
A boundary that agrees with the full rendering adds no re-render drift (G-rerender-drift).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rlvr_core.environments.boundary import BoundaryError, ChatBoundary
from rlvr_core.tiny.tokenizer import train_tokenizer

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = Path(os.environ.get("RLVR_DATA_DIR", ROOT.parent / "shared" / "data")) / "chat_templates"
pytestmark = [pytest.mark.shared_data,
              pytest.mark.skipif(not TEMPLATES.is_dir(), reason=f"no chat templates at {TEMPLATES}")]

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*34"}}\n</tool_call>'
OBSERVATION = "408"
FINAL = "12 * 34 = 408.\n#### 408"


def _contents(family: str) -> tuple[str, str]:
    """The two assistant turns; a thinking model (Qwen3) writes its reasoning, which the template keeps inside a
    tool loop (and renders as an empty <think></think> on a last turn that has none)."""
    if family == "qwen3":
        return ("<think>\nMultiply with the tool.\n</think>\n\n" + CALL,
                "<think>\nThe tool said 408.\n</think>\n\n" + FINAL)
    return CALL, FINAL


def _template(family: str) -> str:
    folder = TEMPLATES / family
    if (folder / "chat_template.jinja").exists():
        return (folder / "chat_template.jinja").read_text()
    return json.loads((folder / "tokenizer_config.json").read_text())["chat_template"]


def _text_tokenizer(family: str, eos: str, bos: str = "<|begin_of_text|>"):
    """Any tokenizer renders a template as text; this one carries the family's eos and bos text."""
    tok = train_tokenizer(["hello world 0123456789"], vocab_size=300)
    tok.add_special_tokens({"eos_token": eos, "bos_token": bos})
    tok.chat_template = _template(family)
    return tok


def _qwen_tokenizer(family: str):
    """The Qwen2.5/Qwen3 BPE (transformers' Qwen2Tokenizer over the real vocab and merges) with the family's added
    tokens at their real ids."""
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    bpe = TEMPLATES / "qwen2.5-qwen3-bpe"
    vocab = json.loads((bpe / "vocab.json").read_text())
    merges = [tuple(line.split()) for line in (bpe / "merges.txt").read_text().splitlines()[1:] if line]
    tok = Qwen2Tokenizer(vocab=vocab, merges=merges, unk_token=None, eos_token=None, pad_token=None)
    config = json.loads((TEMPLATES / "qwen3" / "tokenizer_config.json").read_text())
    added = sorted(config["added_tokens_decoder"].items(), key=lambda kv: int(kv[0]))
    tok.add_tokens([AddedToken(v["content"], special=v["special"], normalized=v["normalized"], lstrip=v["lstrip"],
                               rstrip=v["rstrip"]) for _, v in added])
    for number, v in added:
        assert tok.convert_tokens_to_ids(v["content"]) == int(number), v["content"]
    tok.add_special_tokens({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})
    tok.chat_template = _template(family)
    return tok


def _assembled_text(tok, boundary: ChatBoundary, call: str, final: str) -> tuple[str, str]:
    """(what token-in/token-out feeds the model, the template's full rendering of the same conversation)."""
    user = [{"role": "user", "content": "What is 12 * 34?"}]
    prompt = tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    stored = prompt + call + boundary.end_of_turn + boundary.observation_text(OBSERVATION) + final + boundary.end_of_turn
    whole = user + [{"role": "assistant", "content": call}, {"role": "tool", "content": OBSERVATION},
                    {"role": "assistant", "content": final}]
    return stored, tok.apply_chat_template(whole, tokenize=False, add_generation_prompt=False)


FAMILIES = [  # family, end-of-turn text, bos text
    ("qwen2.5-instruct", "<|im_end|>", "<|endoftext|>"),
    ("qwen3", "<|im_end|>", "<|endoftext|>"),
    ("llama-3.1-3.3-instruct", "<|eot_id|>", "<|begin_of_text|>"),
    ("llama-3.2-instruct", "<|eot_id|>", "<|begin_of_text|>"),
]


@pytest.mark.parametrize("family,eos,bos", FAMILIES)
def test_the_assembled_conversation_is_the_templates_own_rendering(family, eos, bos):
    tok = _text_tokenizer(family, eos, bos)
    boundary = ChatBoundary(tok, end_of_turn=eos)
    stored, full = _assembled_text(tok, boundary, *_contents(family))
    assert full.startswith(stored), (stored, full)
    assert full[len(stored):] == boundary.separator  # only the separator after the last sampled end of turn


@pytest.mark.parametrize("family", ["qwen2.5-instruct", "qwen3"])
def test_the_assembled_ids_are_the_templates_own_ids(family):
    tok = _qwen_tokenizer(family)
    boundary = ChatBoundary(tok)
    user = [{"role": "user", "content": "What is 12 * 34?"}]
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    call, final = _contents(family)
    stored = (enc(tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True)) + enc(call) + [eot]
              + boundary.observation_ids(OBSERVATION) + enc(final) + [eot])
    _, full_text = _assembled_text(tok, boundary, call, final)
    full = enc(full_text)
    assert full[:len(stored)] == stored
    assert full[len(stored):] == enc(boundary.separator)
    assert boundary.observation_ids(OBSERVATION)[0] == enc("\n")[0]  # the separator Qwen writes after <|im_end|>


def test_a_template_that_strips_past_reasoning_drifts_by_design():
    """DeepSeek-R1-Distill renders earlier assistant turns without their reasoning; the trajectory keeps what the
    model saw (the policy in docs/environments.md), so the full rendering differs exactly by that reasoning."""
    eos = "<｜end▁of▁sentence｜>"
    tok = _text_tokenizer("deepseek-r1-distill-qwen", eos, "<｜begin▁of▁sentence｜>")
    try:
        boundary = ChatBoundary(tok, end_of_turn=eos)
    except BoundaryError as exc:  # the family's way of closing a turn, named in the message
        pytest.fail(f"no boundary for DeepSeek-R1-Distill: {exc}")
    thought = "<think>\nMultiply with the tool.\n</think>\n\n"
    stored, full = _assembled_text(tok, boundary, thought + "The product is needed.", FINAL)
    assert not full.startswith(stored)
    assert thought in stored and thought not in full
