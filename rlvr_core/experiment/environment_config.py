"""The `environment:` section: what the policy talks to over its turns (docs/environments.md). The default,
`single_turn`, is the pipeline as it always was: one prompt, one completion, the same samples and numbers."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rlvr_core.core.registry import names
from rlvr_core.experiment.config_base import AddedLater

TOOL_NAMES = ("calculator", "python")


class EnvironmentConfig(AddedLater):
    # Dumped (config hash, training key) only away from their defaults: the tool demo's keys stay what they were.
    _ADDED_LATER = ("max_rerender_drift", "tool_error_reward", "turn_advantage")

    name: str = Field("single_turn", description="registered environment: single_turn (one completion, today's "
                      "path) or tools (a turn ending in a tool call gets the tool's answer as the next observation)")
    tools: list[str] = Field(default_factory=lambda: ["calculator"], description="tools environment: the tools "
                             "the policy may call: calculator (arithmetic), python (a program run in the sandbox)")
    markup: Literal["tag", "hermes"] = Field("tag", description="how a turn holds a call: tag "
                                             "(<calculator>12*34</calculator>, base templates) or hermes "
                                             "(<tool_call>{json}</tool_call>, Qwen-style chat templates)")
    observation_prefix: str = Field("\n= ", description="base templates: text before a tool's answer (start it "
                                    "with a newline or space so it does not merge with the sampled ids)")
    observation_suffix: str = Field("\n", description="base templates: text after a tool's answer")
    max_turns: int = Field(3, ge=1, description="model turns per trajectory; a trajectory still calling tools "
                           "then is cut (flagged, scored as on_cut says)")
    max_total_tokens: int = Field(256, ge=1, description="ids after the first prompt (model and observation); "
                                  "past it the trajectory is cut")
    deadline_s: float | None = Field(None, gt=0, description="wall-clock seconds per rollout call; live "
                                     "trajectories past it are cut (None: no deadline)")
    on_cut: Literal["score", "zero"] = Field("score", description="a trajectory a budget cut: score (its last "
                                             "turn verified as it stands) or zero (reward 0); flagged either way")
    tool_time_s: float = Field(5.0, gt=0, description="python tool: wall-clock limit per call")
    max_tool_error_share: float = Field(0.2, ge=0, le=1, description="G-tool-errors: a step whose share of tool "
                                        "calls that failed (malformed, error, timeout, unknown tool) is above this "
                                        "is flagged")
    max_cut_share: float = Field(0.2, ge=0, le=1, description="G-turn-budget: a step whose share of trajectories "
                                 "cut by a budget is above this is flagged")
    max_rerender_drift: float = Field(0.0, ge=0, le=1, description="G-rerender-drift: a step whose share of "
                                      "trajectories that decode and encode to other ids, every model turn being "
                                      "canonical on its own (the boundary's or template's drift), is above this is "
                                      "flagged; 0: any such trajectory")
    tool_error_reward: float | None = Field(None, description="tools environment: the per-turn reward of a turn "
                                            "whose tool call failed (e.g. -0.1); None: no per-turn rewards")
    turn_advantage: Literal["outcome", "to_go"] = Field(
        "outcome", description="GRPO's advantage on a trajectory's tokens: outcome (the group-normalised outcome "
        "reward on every model token) or to_go (each turn's return from it on, minus the other trajectories' mean "
        "whole return: a baseline that does not depend on when a trajectory stopped; docs/environments.md)")

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        known = names("environment")
        if v not in known:
            raise ValueError(f"unknown environment {v!r}; known: {', '.join(known)}")
        return v

    @field_validator("tools")
    @classmethod
    def _known_tools(cls, v: list[str]) -> list[str]:
        bad = [t for t in v if t not in TOOL_NAMES]
        if bad or not v:
            raise ValueError(f"tools must be a non-empty list of {', '.join(TOOL_NAMES)}; got {v}")
        return v

    @model_validator(mode="after")
    def _budget(self) -> "EnvironmentConfig":
        if self.name != "single_turn" and self.max_turns < 2:
            raise ValueError("a tools environment needs max_turns >= 2 (one turn calls, the next answers)")
        return self

    @property
    def multi_turn(self) -> bool:
        return self.name != "single_turn"

    def key_dump(self) -> dict[str, Any]:
        """What changes the trained weights (the training key's `environment`; absent for single_turn, so every
        config from before environments keeps its key)."""
        return self.model_dump(mode="json", exclude={"max_tool_error_share", "max_cut_share", "max_rerender_drift"})

