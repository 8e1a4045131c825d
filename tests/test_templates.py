"""Templates: the registered base formats, few-shot variants, chat rendering and the model-kind check."""

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from rlvr_core.data.templates import (QA_FEWSHOT_EXAMPLES, PromptTemplate, TemplateError, check_template_for_model,
                                      few_shot, get_template, known_templates, require_template_for_model)

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def tokenizer(chat: bool, chat_tokens: bool = True) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer; chat: with the ChatML template; chat_tokens: <|im_start|> and <|im_end|> are
    tokens of it (without them, a base model's tokenizer given a chat template)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    extra = ["<|im_start|>", "<|im_end|>"] if chat_tokens else []
    specials = ["<|endoftext|>", "<|pad|>", *extra]
    tok.train_from_iterator(["Question: one two three. Answer: 3"] * 10,
                            trainers.BpeTrainer(vocab_size=300, special_tokens=specials, show_progress=False,
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|pad|>",
                                   additional_special_tokens=extra,
                                   chat_template=CHATML if chat else None, padding_side="left")


def test_registered_base_templates_unchanged():
    qa, minerva = get_template("qa"), get_template("minerva")
    assert qa.render("What is 2+3?") == "Question: What is 2+3?\nAnswer:"
    assert qa.key == "qa@1" and qa.stop == ("\nQuestion:", "\n\n\n") and qa.kind == "base"
    assert minerva.render("Find $x$.") == "Problem:\nFind $x$.\n\nSolution:"
    assert minerva.stop == ("\nProblem:", "Problem:")
    assert {"qa", "minerva", "qa_fewshot", "chat_math", "chat_qa"} <= set(known_templates())


def test_few_shot_variant():
    t = get_template("qa_fewshot")
    prompt = t.render("What is 2+3?")
    assert prompt.endswith("\n\nQuestion: What is 2+3?\nAnswer:")
    assert prompt.startswith("Question: " + QA_FEWSHOT_EXAMPLES[0][0] + "\nAnswer: " + QA_FEWSHOT_EXAMPLES[0][1])
    for q, a in QA_FEWSHOT_EXAMPLES:
        assert f"Question: {q}\nAnswer: {a}\n\n" in prompt
        assert a.rsplit("#### ", 1)[1].isdigit()  # examples show the format the answer extractor reads
    assert t.stop == get_template("qa").stop and t.kind == "base" and t.key == "qa_fewshot@1"


def test_few_shot_escapes_braces_and_checks_inputs():
    t = few_shot(get_template("minerva"), [("Compute $\\frac{1}{2}+\\frac{1}{2}$.", "$\\boxed{1}$")],
                 id="minerva_1shot_test", version="0")
    assert t.render("Find {x}.") == ("Problem:\nCompute $\\frac{1}{2}+\\frac{1}{2}$.\n\nSolution: $\\boxed{1}$"
                                     "\n\nProblem:\nFind {x}.\n\nSolution:")
    with pytest.raises(ValueError):
        few_shot(get_template("qa"), [], id="x", version="0")
    with pytest.raises(ValueError):
        few_shot(get_template("chat_math"), [("q", "a")], id="x", version="0")


def test_chat_template_renders_through_the_tokenizer():
    tok = tokenizer(chat=True)
    t = get_template("chat_qa")
    expected = ("<|im_start|>user\nWhat is 2+3?\nSolve the problem step by step. End with a line of the form "
                "'#### N'.<|im_end|>\n<|im_start|>assistant\n")
    assert t.render("What is 2+3?", tokenizer=tok) == expected
    with_system = PromptTemplate(id="sys_test", version="0", kind="chat", pattern="{question}", system="Be brief.")
    assert with_system.render("Hi", tokenizer=tok) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert get_template("chat_math").render("1+1?", tokenizer=tok).count("\\boxed{}") == 1
    with pytest.raises(ValueError, match="tokenizer"):
        t.render("What is 2+3?")
    with pytest.raises(ValueError, match="no chat template"):
        t.render("What is 2+3?", tokenizer=tokenizer(chat=False))
    with pytest.raises(ValueError):
        get_template("qa").messages("q")


def test_check_template_for_model():
    qa, chat = get_template("qa"), get_template("chat_qa")
    assert check_template_for_model(qa, "base") == []
    assert check_template_for_model(qa, "base", tokenizer(chat=False)) == []
    w = check_template_for_model(chat, "base")
    assert len(w) == 1 and "G-chat-template" in w[0]
    assert check_template_for_model(chat, "chat", tokenizer(chat=True)) == []
    assert any("no chat_template" in x for x in check_template_for_model(chat, "chat", tokenizer(chat=False)))
    assert any("chat model" in x for x in check_template_for_model(qa, "chat"))
    leaky = PromptTemplate(id="leaky", version="0", kind="base", pattern="<|im_start|>user\n{question}", stop=("\n",))
    assert any("<|im_start|>" in x for x in check_template_for_model(leaky, "base"))
    custom = PromptTemplate(id="custom", version="0", kind="base", pattern="<|pad|> {question}", stop=("\n",))
    assert check_template_for_model(custom, "base") == []  # not a known chat marker ...
    assert any("<|pad|>" in x for x in check_template_for_model(custom, "base", tokenizer(chat=False)))  # ... but special
    nostop = PromptTemplate(id="nostop", version="0", kind="base", pattern="Q: {question}\nA:")
    assert any("G-stop-seq" in x for x in check_template_for_model(nostop, "base"))
    with pytest.raises(ValueError):
        check_template_for_model(qa, "instruct")  # type: ignore[arg-type]


def test_require_template_refuses_what_samples_garbage_and_returns_warnings():
    qa, chat = get_template("qa"), get_template("chat_qa")
    assert require_template_for_model(chat, "chat", tokenizer(chat=True)) == []
    # A chat template whose control tokens the tokenizer lacks: each would be split into byte pieces.
    bare = tokenizer(chat=True, chat_tokens=False)
    assert len(bare.encode("<|im_start|>", add_special_tokens=False)) > 1  # the planted condition holds
    with pytest.raises(TemplateError, match=r"<\|im_end\|>.*<\|im_start\|>.*not tokens of this tokenizer"):
        require_template_for_model(chat, "chat", bare)
    with pytest.raises(TemplateError, match="no chat_template"):
        require_template_for_model(chat, "chat", tokenizer(chat=False))
    # A kind mismatch is an error unless it is declared deliberate; then it is a warning.
    with pytest.raises(TemplateError, match="G-chat-template"):
        require_template_for_model(chat, "base", tokenizer(chat=True))
    with pytest.raises(TemplateError, match="chat model"):
        require_template_for_model(qa, "chat", tokenizer(chat=True))
    (w,) = require_template_for_model(qa, "chat", tokenizer(chat=True), allow_kind_mismatch=True)
    assert "chat model" in w
    # Chat tokens inside a base prompt are an error; a base template without stops only a warning.
    leaky = PromptTemplate(id="leaky", version="0", kind="base", pattern="<|im_start|>user\n{question}", stop=("\n",))
    with pytest.raises(TemplateError, match="im_start"):
        require_template_for_model(leaky, "base", tokenizer(chat=False))
    nostop = PromptTemplate(id="nostop", version="0", kind="base", pattern="Q: {question}\nA:")
    (w,) = require_template_for_model(nostop, "base", tokenizer(chat=False))
    assert "G-stop-seq" in w
