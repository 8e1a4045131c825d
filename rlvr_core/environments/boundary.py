"""Boundary adapters: the ids that follow the model's sampled ids when an observation comes back, per template family.

The model's turn ends with the ids it sampled, the stop it actually sampled included (an end-of-turn token, or the
ids of a tool call's closing tag). What a full rendering of the conversation would put next, the adapter puts next:
for a chat template, whatever the template writes after the assistant's end-of-turn token (the turn separator, e.g.
Qwen's newline after `<|im_end|>`: dropping it at every tool boundary is verl #6501), the observation as the
template's tool message, and the next assistant header. The adapter encodes only that piece; the ids before it are
never decoded or re-encoded.

- `TextBoundary`: base-model templates (the demo's): the observation between a fixed prefix and suffix.
- `ChatBoundary`: a chat template (a tokenizer with `chat_template`): the piece is cut out of the template's own
  rendering of a two-message probe, so it is what the template writes, whatever the family.

Templates that rewrite history (DeepSeek-R1-Distill drops the reasoning of earlier assistant turns, Qwen3 that of
turns before the last user message) render a full conversation that differs from what the model saw while
sampling. Our policy: the trajectory keeps the ids the model actually saw (what it was conditioned on is what it is
trained on); `checks.rerender_drift` reports the difference per step, and docs/environments.md says which
templates drift by design.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

_SENTINEL = "\u2063rlvr-boundary-probe\u2063"
# The probe's assistant content: plain, or with a reasoning block for templates that render a last assistant turn
# differently from an earlier one unless it reasons (Qwen3 adds an empty <think></think> to a last turn only).
_PROBES = (_SENTINEL, "<think>\nprobe\n</think>\n\n" + _SENTINEL)


class BoundaryError(ValueError):
    """A template this adapter cannot cut a boundary piece out of; the message names the template."""


class Boundary(Protocol):
    def observation_ids(self, observation: str) -> list[int]:
        """The ids that follow the model's sampled ids: separator, observation, next-turn header."""
        ...


@dataclass(frozen=True)
class TextBoundary:
    """A base-model template: `prefix + observation + suffix`, encoded alone. Choose a prefix that starts a new
    token (a newline, a space after a closing tag) so the piece does not merge with the ids before it."""

    tokenizer: Any
    prefix: str = ""
    suffix: str = ""

    def observation_ids(self, observation: str) -> list[int]:
        return list(self.tokenizer(self.prefix + observation + self.suffix, add_special_tokens=False)["input_ids"])


class ChatBoundary:
    """A chat template's tool message, cut out of the template's own rendering (see the module docstring).

    `tool_role`: the role the template gives tool results (`tool` for Qwen, Llama 3.x, Mistral). `end_of_turn`:
    the text of the token that ends an assistant turn as sampled (the tokenizer's eos by default)."""

    def __init__(self, tokenizer: Any, *, tool_role: str = "tool", end_of_turn: str | None = None,
                 system: str | None = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise BoundaryError("ChatBoundary needs a tokenizer with a chat template")
        self.tokenizer, self.tool_role, self.system = tokenizer, tool_role, system
        self.end_of_turn = end_of_turn if end_of_turn is not None else tokenizer.eos_token
        if not self.end_of_turn:
            raise BoundaryError("the template's end-of-turn text is unknown: pass end_of_turn")
        self.probe = next((p for p in _PROBES if self._appends(p)), None)
        if self.probe is None:
            raise BoundaryError("the chat template rewrites the conversation when a tool message is added: a "
                                "boundary piece cannot be cut out of it")
        self.separator = self._separator()

    def _render(self, messages: list[dict], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)

    def _history(self, probe: str | None = None) -> list[dict]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + [{"role": "user", "content": "q"}, {"role": "assistant", "content": probe or self.probe}]

    def _appends(self, probe: str) -> bool:
        """Adding a tool message leaves the rendering of the conversation before it as it was."""
        before = self._render(self._history(probe), False)
        after = self._render(self._history(probe) + [{"role": self.tool_role, "content": "x"}], True)
        return after.startswith(before)

    def _separator(self) -> str:
        """What the template writes between the assistant's end-of-turn token and the next message."""
        text = self._render(self._history(), False)
        at = text.find(_SENTINEL)
        if at < 0:
            raise BoundaryError("the chat template does not render an assistant message's content")
        rest = text[at + len(_SENTINEL):]
        if not rest.startswith(self.end_of_turn):
            raise BoundaryError(f"the chat template ends an assistant turn with {rest[:40]!r}, not the end-of-turn "
                                f"text {self.end_of_turn!r}")
        return rest[len(self.end_of_turn):]

    def observation_text(self, observation: str) -> str:
        before = self._render(self._history(), False)
        after = self._render(self._history() + [{"role": self.tool_role, "content": observation}], True)
        if not after.startswith(before):
            raise BoundaryError("the chat template rewrites the conversation for this observation: a boundary piece "
                                "cannot be cut out of it")
        return self.separator + after[len(before):]

    def observation_ids(self, observation: str) -> list[int]:
        return list(self.tokenizer(self.observation_text(observation), add_special_tokens=False)["input_ids"])
