"""G-no-signal's diagnosis: why a GRPO run trains on no signal, named from what the run measured.

A run learns nothing when every group of G completions gets the same reward (zero variance: the advantage is
0 everywhere, and dynamic sampling drops the group). Two places see it: the pass-rate table before training (the
base model solves none of the curriculum's prompts with the configured reward: `passrate_no_signal`) and the step
rows during training (`rlvr_core.experiment.guards` `NoSignalConfig`: steps that trained no token). Both name
the cause with `no_signal_cause`, checked in this order:

  1. verifier: most completions have no extractable answer (`status/no_answer`): the reward verifier and its mode
     do not read the model's answer format; a sample of the unextracted outputs shows it.
  2. rollout temperature: `grpo.temperature` is near greedy, or groups sample near-identical completions.
  3. pass-rate temperature: the pass-rate table was sampled near greedy (`sampling.temperature`), where a prompt
     is solved always or never, so the curriculum (always-solved dropped) kept prompts the base fails.
  4. difficulty: answers are read and scored, and the prompts are all too hard (or all solved).

Pure Python: no torch, no Prefect, no I/O.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

__all__ = ["NEAR_GREEDY", "NO_ANSWER_SHARE", "LOW_UNIQUE", "REPEATED_UNIQUE", "window_facts", "no_signal_cause", "passrate_no_signal", "examples"]

NEAR_GREEDY = 0.3       # a temperature at or under this samples (nearly) the greedy completion
NO_ANSWER_SHARE = 0.5   # at or above: the verifier, not the model, is why nothing is rewarded
LOW_UNIQUE = 0.5        # a group's share of distinct completions at or under this: sampling is near greedy
# At or under this, a step's groups repeat one completion (1/G: 0.125 at G = 8, 0.25 at G = 4): a collapsed policy or
# a fixed seed. Healthy demo steps, dropped groups included, measure 0.55-0.81 (a 12-step run at the demo's recipe).
REPEATED_UNIQUE = 0.3
STATUSES = ("correct", "incorrect", "no_answer", "error", "timeout")


def _f(v: Any) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def _mean(rows: Sequence[Mapping[str, Any]], key: str) -> float | None:
    vals = [x for x in (_f(r.get(key)) for r in rows) if x is not None]
    return sum(vals) / len(vals) if vals else None


def window_facts(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What the diagnosis reads from step rows: the completions' statuses summed, the mean zero-variance share,
    reward and distinct-completion share."""
    counts = {s: sum(int(_f(r.get(f"status/{s}")) or 0) for r in rows) for s in STATUSES}
    n = sum(counts.values())
    return {"n_completions": n, "no_answer_share": counts["no_answer"] / n if n else None,
            "zero_var_share": _mean(rows, "zero_var_group_share"), "reward_mean": _mean(rows, "reward_mean"),
            "unique_frac": _mean(rows, "unique_frac_mean")}


def examples(texts: Sequence[str], k: int = 2, width: int = 60) -> str:
    """Up to k outputs, each cut to `width` characters, as one quoted list."""
    cut = [t if len(t) <= width else t[:width] + "…" for t in (" ".join(t.split()) for t in texts[:k])]
    return ", ".join(repr(t) for t in cut)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def no_signal_cause(facts: Mapping[str, Any], *, verifier: str | None, mode: str | None, temperature: float | None,
                    passrate_temperature: float | None, sample: Sequence[str] = ()) -> tuple[str, str]:
    """(kind, one-line cause) of a run without learning signal; kind is verifier, temperature, passrate_temperature
    or difficulty (the module docstring gives the order). `sample`: unextracted outputs to quote."""
    na, z, r, u = facts.get("no_answer_share"), facts.get("zero_var_share"), facts.get("reward_mean"), facts.get(
        "unique_frac")
    zv = f"zero-variance groups {_pct(z)}"
    if na is not None and na >= NO_ANSWER_SHARE:
        text = (f"the reward verifier {verifier or '?'} (mode {mode or 'default'}) extracted no answer from "
                f"{_pct(na)} of {facts.get('n_completions')} completions; {zv}; change reward.verifier / reward.mode")
        return "verifier", text + (f"; unextracted outputs: {examples(sample)}" if sample else "")
    if (temperature is not None and temperature <= NEAR_GREEDY) or (temperature is None and u is not None
                                                                    and u <= LOW_UNIQUE):
        t = "?" if temperature is None else f"{temperature:g}"
        return "temperature", (f"near-greedy rollouts: grpo.temperature {t}, distinct completions per group "
                               f"{_pct(u)}; {zv}; raise grpo.temperature")
    if passrate_temperature is not None and passrate_temperature <= NEAR_GREEDY and passrate_temperature != temperature:
        temperature = 1.0 if temperature is None else temperature
        return "passrate_temperature", (
            f"the pass-rate table was sampled near greedy (sampling.temperature {passrate_temperature:g}): a prompt is "
            f"solved always or never there, so the curriculum kept prompts the base fails at grpo.temperature "
            f"{temperature:g}; {zv}, reward mean {_pct(r)}; set sampling.temperature to the rollouts' "
            f"{temperature:g}")
    hard = r is None or r < 0.5
    return "difficulty", (f"answers are read and scored, and the prompts are all {'too hard' if hard else 'solved'}: "
                          f"reward mean {_pct(r)}, {zv}; change the curriculum (passk.low / passk.high)")


def passrate_no_signal(kept: Sequence[Mapping[str, Any]], samples: Sequence[Mapping[str, Any]], *,
                       verifier: str, mode: str | None, temperature: float,
                       passrate_temperature: float) -> tuple[str, dict[str, Any]] | None:
    """(reason, evidence) when the pass-rate table shows the base model solves none of the curriculum's prompts
    (`kept`: its rows, with `c` correct of `n`); None otherwise. `samples`: the table's sampled completions
    (problem_id, status, response); those of kept prompts give the statuses and the quoted outputs."""
    if not kept or sum(int(r.get("c") or 0) for r in kept) > 0:
        return None
    ids = {r["problem_id"] for r in kept}
    mine = [s for s in samples if s.get("problem_id") in ids] or list(samples)
    counts = {s: sum(1 for x in mine if x.get("status") == s) for s in STATUSES}
    n = sum(counts.values())
    facts = {"n_completions": n, "no_answer_share": counts["no_answer"] / n if n else None,
             # The table's distinct share is the pass-rate temperature's, not the rollouts': left out.
             "zero_var_share": 1.0, "reward_mean": 0.0, "unique_frac": None}
    sample = [str(x.get("response", "")) for x in mine if x.get("status") == "no_answer"]
    # The table's own temperature sampled these; the rollouts sample at grpo.temperature.
    kind, cause = no_signal_cause(facts, verifier=verifier, mode=mode, temperature=temperature,
                                  passrate_temperature=passrate_temperature, sample=sample)
    if kind == "passrate_temperature":
        # A table sampled near greedy says nothing about what the rollouts at their own temperature will solve
        # (`--set sampling.temperature=0.05` on the demo: 1 correct sample in its 158 kept prompts, then +45 points
        # of training): the steps decide, through the detector's window.
        return None
    reason = (f"G-no-signal before training: the pass-rate table shows the base model solves none of the "
              f"{len(kept)} curriculum prompts with the configured reward ({sum(int(r.get('n') or 0) for r in kept)} "
              f"samples at sampling.temperature {passrate_temperature:g}); cause: {cause}")
    return reason, {**facts, "cause": kind, "n_prompts": len(kept), "examples": sample[:2]}
