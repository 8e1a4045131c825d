"""The built-in environments, registered by name (`environment: {name: tools, ...}` in a config).

An environment turns a problem into the first prompt's ids (`reset`) and answers each model turn, given as the ids
the engine sampled (`step`): an observation's ids to append, or done. It never scores: the rollout loop verifies every finished trajectory's
final turn in one batch through the verifier pool, the same way the single-turn path does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlvr_core.core.registry import register
from rlvr_core.environments.boundary import Boundary
from rlvr_core.environments.tools import ToolCall, ToolResult, parse_call, run_call, stop_strings


@dataclass(frozen=True)
class StepResult:
    """One answer to a model turn: the observation's ids (empty when done), whether the trajectory is done, and
    the tool call it answered (its name, its error kind when it failed)."""

    observation_ids: list[int] = field(default_factory=list)
    done: bool = False
    tool: str | None = None
    tool_error: str | None = None
    reward: float | None = None      # the turn's own reward (e.g. a failed tool call's), None: none
    argument: str | None = None      # the call's argument, as the model wrote it (for people: traces)
    observation: str | None = None   # the tool's answer as text (its ids are observation_ids' middle)


def _prompt_ids(tokenizer: Any, template: Any, problem: dict, add_special_tokens: bool) -> list[int]:
    text = template.render(problem["question"], tokenizer=tokenizer)
    return list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])


@register("environment", "single_turn")
class SingleTurn:
    """Today's path as an environment: one prompt, one completion, done."""

    stop: tuple[str, ...] = ()

    def __init__(self, tokenizer: Any, template: Any, *, add_special_tokens: bool = True) -> None:
        self.tokenizer, self.template, self.add_special_tokens = tokenizer, template, add_special_tokens

    def reset(self, problem: dict) -> list[int]:
        return _prompt_ids(self.tokenizer, self.template, problem, self.add_special_tokens)

    def step(self, token_ids: list[int]) -> StepResult:
        return StepResult(done=True)


@register("environment", "tools")
class ToolEnvironment:
    """A turn that ends with a tool call gets the tool's answer as its observation; a turn without one is the final
    answer. `tools`: names from `rlvr_core.environments.tools.TOOLS`; `markup`: how a turn holds a call;
    `boundary`: how an observation follows the sampled ids (rlvr_core/environments/boundary.py);
    `tool_options`: per tool, keyword options (e.g. {"python": {"time_s": 2}}); `error_reward`: the reward of a turn
    whose call failed (malformed, unknown tool, error, timeout), None for no per-turn reward."""

    def __init__(self, tokenizer: Any, template: Any, *, boundary: Boundary, tools: list[str],
                 markup: str = "tag", tool_options: dict | None = None, add_special_tokens: bool = True,
                 error_reward: float | None = None) -> None:
        self.tokenizer, self.template, self.boundary = tokenizer, template, boundary
        self.error_reward = error_reward
        self.tools, self.markup, self.tool_options = list(tools), markup, dict(tool_options or {})
        self.add_special_tokens = add_special_tokens
        self.stop = stop_strings(markup, self.tools)

    def reset(self, problem: dict) -> list[int]:
        return _prompt_ids(self.tokenizer, self.template, problem, self.add_special_tokens)

    def step(self, token_ids: list[int]) -> StepResult:
        """The turn's sampled ids, decoded only to read the call (its closing tag, the stop, included)."""
        text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        call = parse_call(self.markup, text, self.tools)
        if call is None:
            return StepResult(done=True)
        result = call if isinstance(call, ToolResult) else run_call(call, self.tools, self.tool_options)
        name = call.name if isinstance(call, ToolCall) else None
        return StepResult(self.boundary.observation_ids(result.text), False, name or "malformed", result.error,
                          reward=self.error_reward if result.error is not None else None,
                          argument=call.argument if isinstance(call, ToolCall) else None, observation=result.text)
