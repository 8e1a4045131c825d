"""Tools a policy calls, and the markup it calls them with.

A tool takes a plain string argument and returns `ToolResult(text, error)`: the observation the model reads next
turn. A malformed call, a tool that raises, times out or is unknown is answered with an observation saying so
(`error` set), never an exception: the rollout goes on, and `checks` counts the errors per step.

Markups (how a model turn holds a call):
- `tag`: `<calculator>12*34</calculator>`, the tool's name as the tag; the closing tag is a stop string of the
  turn, so the engine ends the turn on it (base-model templates, the demo's).
- `hermes`: `<tool_call>{"name": "calculator", "arguments": {"expression": "12*34"}}</tool_call>` (Qwen2.5/Qwen3 and
  other Hermes-style chat templates); the argument is the call's only string argument.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from dataclasses import dataclass
from typing import Callable

from rlvr_core.sandbox.process import Limits
from rlvr_core.sandbox.run import run_program

MARKUPS = ("tag", "hermes")
_MAX_OBSERVATION = 2000  # characters of a tool's answer the model reads


@dataclass(frozen=True)
class ToolCall:
    name: str
    argument: str


@dataclass(frozen=True)
class ToolResult:
    text: str
    error: str | None = None  # "malformed", "unknown_tool", "timeout", "error"


# ------------------------------------------------------------------------------------------------- calculator
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > 64 or abs(left) > 10**6):
            raise ValueError("exponent too large")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    raise ValueError("only numbers, + - * / // % ** and parentheses")


def calculator(expression: str) -> ToolResult:
    """Arithmetic on numbers (no names, no calls): the exact integer when the result is whole."""
    if len(expression) > 200:
        return ToolResult("error: expression longer than 200 characters", "malformed")
    try:
        value = _evaluate(ast.parse(expression.strip(), mode="eval").body)
    except ZeroDivisionError:
        return ToolResult("error: division by zero", "error")
    except (SyntaxError, ValueError, TypeError, OverflowError) as exc:
        return ToolResult(f"error: {exc}", "malformed")
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        value = int(value)
    return ToolResult(str(value))


# ------------------------------------------------------------------------------------------------- python
def python_tool(code: str, *, time_s: float = 5.0, memory_mb: int = 512, isolation: str = "os") -> ToolResult:
    """Run `code` in the sandbox (rlvr_core/sandbox): its stdout is the observation, or its error's last line."""
    result = run_program(code, limits=Limits(time_s=time_s, memory_mb=memory_mb), isolation=isolation,
                         output_bytes=_MAX_OBSERVATION)
    if result["timed_out"]:
        return ToolResult(f"error: timed out after {time_s:g} s", "timeout")
    if not result["completed"]:
        last = (result["stderr"].strip().splitlines() or [f"exit status {result['returncode']}"])[-1]
        return ToolResult(f"error: {last}"[:_MAX_OBSERVATION], "error")
    return ToolResult(result["stdout"][:_MAX_OBSERVATION])


TOOLS: dict[str, Callable[..., ToolResult]] = {"calculator": calculator, "python": python_tool}


# ------------------------------------------------------------------------------------------------- markup
def stop_strings(markup: str, tools: list[str]) -> tuple[str, ...]:
    """The strings that end a turn holding a call (the engine stops on them; they stay in the sampled ids)."""
    if markup == "tag":
        return tuple(f"</{name}>" for name in tools)
    if markup == "hermes":
        return ("</tool_call>",)
    raise ValueError(f"unknown tool-call markup {markup!r}; known: {', '.join(MARKUPS)}")


def parse_call(markup: str, text: str, tools: list[str]) -> ToolCall | ToolResult | None:
    """The call a model turn ends with; a ToolResult (the error observation) when it is malformed; None when the
    turn holds no call (a final answer)."""
    if markup == "tag":
        for name in tools:
            if text.rstrip().endswith(f"</{name}>"):
                found = re.search(rf"<{name}>(.*)</{name}>\s*$", text, flags=re.DOTALL)
                if found is None:
                    return ToolResult(f"error: </{name}> without <{name}>", "malformed")
                return ToolCall(name, found.group(1))
        return None
    if not text.rstrip().endswith("</tool_call>"):
        return None
    found = re.search(r"<tool_call>(.*)</tool_call>\s*$", text, flags=re.DOTALL)
    if found is None:
        return ToolResult("error: </tool_call> without <tool_call>", "malformed")
    try:
        call = json.loads(found.group(1))
        name, arguments = call["name"], call.get("arguments", {})
        values = list(arguments.values()) if isinstance(arguments, dict) else [arguments]
        if not isinstance(name, str) or len(values) != 1 or not isinstance(values[0], str):
            raise ValueError
    except (ValueError, KeyError, TypeError, AttributeError):
        return ToolResult('error: a call is {"name": <tool>, "arguments": {<one string argument>}}', "malformed")
    return ToolCall(name, values[0])


def run_call(call: ToolCall, tools: list[str], options: dict | None = None) -> ToolResult:
    """Answer a parsed call; an unknown tool or an exception of the tool is an error observation."""
    if call.name not in tools or call.name not in TOOLS:
        return ToolResult(f"error: unknown tool {call.name!r}; tools: {', '.join(tools)}", "unknown_tool")
    try:
        return TOOLS[call.name](call.argument, **(options or {}).get(call.name, {}))
    except Exception as exc:  # a tool's failure is the model's observation, not the rollout's end
        return ToolResult(f"error: {type(exc).__name__}: {exc}"[:_MAX_OBSERVATION], "error")
