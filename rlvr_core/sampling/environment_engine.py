"""A sampling engine whose completions are whole multi-turn trajectories, so every stage that samples (pass rates,
the GRPO rollouts, the held-out and periodic evaluations) runs an environment without knowing it.

`generate(prompts, ...)` encodes each rendered prompt exactly as the wrapped engine would, runs the turns
(rlvr_core/environments/loop.py) through the wrapped engine's `generate_ids`, and returns one `Sample` per
trajectory (`trajectories.as_sample`): `text` is the final turn (what the verifier scores), `token_ids` every id
after the first prompt with its `loss_mask`, `finish_reason` "length" when a budget cut it. The trajectories of
every call wait in `take()` for whoever records them (the trainer's step metrics and rollout segments, the
evaluator's columns).
"""

from __future__ import annotations

from typing import Any

from rlvr_core.core.registry import lookup
from rlvr_core.environments.boundary import ChatBoundary, TextBoundary
from rlvr_core.environments.checks import noncanonical_share, rerender_drift, step_health
from rlvr_core.environments.loop import Budgets, run_turns
from rlvr_core.environments.trajectory import Trajectory
from rlvr_core.sampling.base import Sample, SamplingParams, check_prompt_ids
from rlvr_core.sampling.trajectories import as_sample


class EnvironmentEngine:
    def __init__(self, engine: Any, env: Any, budgets: Budgets, *, max_tool_error_share: float = 0.2,
                 max_cut_share: float = 0.2, max_rerender_drift: float = 0.0,
                 turn_advantage: str = "outcome") -> None:
        if not hasattr(engine, "generate_ids"):
            raise ValueError(f"a multi-turn environment needs an engine that takes token ids (generate_ids); "
                             f"{type(engine).__name__} does not")
        self.engine, self.env, self.budgets = engine, env, budgets
        self.turn_advantage = turn_advantage  # read by the trainer (rlvr_core/grpo/update.py train_inputs)
        self.environment_settings: dict | None = None  # the `environment:` section, for evaluation settings
        self.limits = {"max_tool_error_share": max_tool_error_share, "max_cut_share": max_cut_share,
                       "max_rerender_drift": max_rerender_drift}
        self._taken: list[tuple[str, int, Trajectory]] = []

    def __getattr__(self, name: str) -> Any:
        """Everything else is the wrapped engine's (tokenizer, pad id, a rollout engine's `load_weights`, ...)."""
        if name == "engine":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.engine, name)

    def generate(self, prompts: list[str], prompt_ids: list[str], params: SamplingParams, *, step: int = 0,
                 epoch: int = 0, first_sample_index: int = 0) -> list[list[Sample]]:
        check_prompt_ids(prompts, prompt_ids)
        if not prompts:  # a lockstep rank with nothing to sample still makes the engine call
            return self.engine.generate_ids([], [], params, step=step, epoch=epoch,
                                            first_sample_index=first_sample_index)
        ids = [list(self.tokenizer(p, add_special_tokens=self.add_special_tokens)["input_ids"]) for p in prompts]
        trajs = run_turns(self.engine, self.env, ids, prompt_ids, params, self.budgets, step=step, epoch=epoch,
                          first_sample_index=first_sample_index)
        out = []
        for pid, group in zip(prompt_ids, trajs):
            out.append([as_sample(t, pid, first_sample_index + s, t.seed) for s, t in enumerate(group)])
            self._taken += [(pid, first_sample_index + s, t) for s, t in enumerate(group)]
        return out

    def take(self) -> list[tuple[str, int, Trajectory]]:
        """(prompt id, sample index, trajectory) of every completion since the last `take`."""
        taken, self._taken = self._taken, []
        return taken

    def health(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """The step's `env/...` metrics and its per-step flags (`health/G-tool-errors`, `health/G-turn-budget`,
        `health/G-rerender-drift`), which the trainer counts like every per-step flag (step_metrics.step_flags)."""
        out = step_health(trajectories, max_tool_error_share=self.limits["max_tool_error_share"],
                          max_cut_share=self.limits["max_cut_share"])
        drift = rerender_drift(self.tokenizer, trajectories)
        out["env/rerender_drift"] = drift
        out["env/noncanonical_share"] = noncanonical_share(self.tokenizer, trajectories)
        out["health/G-rerender-drift"] = float(drift > self.limits["max_rerender_drift"])
        return out

    def close(self) -> None:
        close = getattr(self.engine, "close", None)
        if close is not None:
            close()


def with_environment(environment: Any, engine: Any, template: Any) -> Any:
    """`engine` as it is for `single_turn`; else an EnvironmentEngine over it, built from the `environment:` section
    (rlvr_core/experiment/environment_config.py) and the prompt template (a chat template's tool message is cut
    out of the template's own rendering; a base template's observation sits between the configured prefix and
    suffix)."""
    if not environment.multi_turn:
        return engine
    tok = engine.tokenizer
    boundary = (ChatBoundary(tok) if template.kind == "chat" else
                TextBoundary(tok, prefix=environment.observation_prefix, suffix=environment.observation_suffix))
    env = lookup("environment", environment.name)(tok, template, boundary=boundary, tools=environment.tools,
                                                  markup=environment.markup,
                                                  tool_options={"python": {"time_s": environment.tool_time_s}},
                                                  add_special_tokens=engine.add_special_tokens,
                                                  **({"error_reward": environment.tool_error_reward}
                                                     if environment.tool_error_reward is not None else {}))
    budgets = Budgets(max_turns=environment.max_turns, max_total_tokens=environment.max_total_tokens,
                      deadline_s=environment.deadline_s, on_cut=environment.on_cut)
    wrapped = EnvironmentEngine(engine, env, budgets, max_tool_error_share=environment.max_tool_error_share,
                                max_cut_share=environment.max_cut_share,
                                max_rerender_drift=environment.max_rerender_drift,
                                turn_advantage=environment.turn_advantage)
    wrapped.environment_settings = environment.key_dump()  # stored with evaluation numbers (settings)
    return wrapped
