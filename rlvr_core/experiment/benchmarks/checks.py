"""The checks of a benchmark spec that pydantic cannot make field by field: cross-field rules (data, prompt,
generation, verifiers, metrics, breakdown), each verifier built with its options and mode, and the data files
present and loadable. Each returns (field path, why) pairs; lookup.py raises them as one ConfigError."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

from rlvr_core.core import hub
from rlvr_core.data.loaders import DataFormatError
from rlvr_core.data.templates import get_template
from rlvr_core.experiment.benchmarks.data import few_shot_file, read_split, uses_hub, data_file, few_shot_examples
from rlvr_core.experiment.benchmarks.scoring import ANSWER_VERIFIERS, built_verifier, build_verifier, scoring_label, scorings
from rlvr_core.experiment.benchmarks.spec import (BREAKDOWN_FIELDS, DATA_DIR_ENV, SYNTHETIC, BenchmarkSpec, VerifierSpec,
                                                  parse_metric)


def _verifier_problems(v: VerifierSpec, where: str) -> list[tuple[str, str]]:
    """Check a verifier spec by building it: options first, then the mode (so the error names the right field)."""
    bad = sorted({"mode", "format_reward"} & set(v.options))
    if bad:
        why = {"mode": "the mode goes in `mode`, not in options",
               "format_reward": "format shaping is for training rewards; evaluation scores are unshaped"}
        return [(f"{where}.options.{k}", why[k]) for k in bad]
    try:
        plain = built_verifier(v.name, json.dumps(dict(v.options), sort_keys=True, default=str))
    except Exception as e:  # noqa: BLE001 — whatever the constructor says is the reason
        return [(f"{where}.options", f"verifier {v.name!r} rejects these options: {type(e).__name__}: {e}")]
    has_modes = "mode" in inspect.signature(type(plain).__init__).parameters
    if not has_modes:
        if v.mode is not None:
            return [(f"{where}.mode", f"verifier {v.name!r} has no modes (got {v.mode!r})")]
        return []
    if v.mode is None:
        default = getattr(plain, "mode", None)
        return [(f"{where}.mode", f"verifier {v.name!r} has modes: name one explicitly"
                 + (f" (its default is {default!r})" if default else ""))]
    try:
        build_verifier(v)
    except Exception as e:  # noqa: BLE001
        return [(f"{where}.mode", f"{type(e).__name__}: {e}")]
    return []


def semantic_problems(spec: BenchmarkSpec) -> list[tuple[str, str]]:
    """Cross-field checks that need the registries; (field path, why) for each problem found."""
    return [problem for check in (_data_field_problems, _prompt_problems, _generation_problems, _verifiers_problems,
                                  _metrics_problems, _breakdown_problems) for problem in check(spec)]


def _data_field_problems(spec: BenchmarkSpec) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    d, fs = spec.data, spec.prompt.few_shot
    if d.source == SYNTHETIC:
        if d.synthetic is None:
            out.append(("data.synthetic", "source 'synthetic' needs the generator settings (n_train, n_test, seed, "
                        "difficulty)"))
        if d.path is not None:
            out.append(("data.path", "source 'synthetic' is generated; it has no path"))
        if d.split not in ("train", "test"):
            out.append(("data.split", f"synthetic splits are 'train' and 'test', got {d.split!r}"))
    elif d.synthetic is not None:
        out.append(("data.synthetic", f"only for source 'synthetic' (source is {d.source!r})"))
    if d.hub is not None:
        if d.source == SYNTHETIC:
            out.append(("data.hub", "source 'synthetic' is generated; it has no hub copy"))
        needed = [d.split] + ([fs.split] if fs.source == "split" and fs.split else [])
        for split in needed:
            if split not in d.hub.files:
                out.append(("data.hub.files", f"no file for split {split!r} (the benchmark reads it)"))
    if d.subset_seed is not None and d.max_problems is None:
        out.append(("data.subset_seed", "a seeded subset needs max_problems"))
    return out


def _prompt_problems(spec: BenchmarkSpec) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    d, p, fs = spec.data, spec.prompt, spec.prompt.few_shot
    template = get_template(p.template)
    if template.kind != p.model_kind:
        out.append(("prompt.template", f"template {template.key} is for {template.kind} models but model_kind is "
                    f"{p.model_kind!r} (G-chat-template)"))
    if fs.source == "none":
        if fs.num_shots:
            out.append(("prompt.few_shot.num_shots", "few_shot.source is 'none': num_shots must be 0"))
    elif fs.num_shots < 1:
        out.append(("prompt.few_shot.num_shots", f"few_shot.source {fs.source!r} needs num_shots >= 1"))
    if fs.source in ("split", "inline") and template.kind != "base":
        out.append(("prompt.few_shot.source", "worked examples are written in a base template's format; "
                    f"{template.key} is a chat template"))
    if fs.source == "inline" and len(fs.examples) != fs.num_shots:
        out.append(("prompt.few_shot.examples", f"{len(fs.examples)} examples listed but num_shots is {fs.num_shots}"))
    if fs.source != "inline" and fs.examples:
        out.append(("prompt.few_shot.examples", "examples are only for few_shot.source 'inline'"))
    if fs.source == "split":
        if not fs.split:
            out.append(("prompt.few_shot.split", "few_shot.source 'split' needs the split to draw shots from"))
        elif fs.split == d.split and (fs.path or None) == (d.path or None):
            out.append(("prompt.few_shot.split", f"shots drawn from the evaluated split {d.split!r} would leak "
                        "problems into their own prompts"))
    elif fs.split or fs.path:
        out.append(("prompt.few_shot.split", "split/path are only for few_shot.source 'split'"))
    return out


def _generation_problems(spec: BenchmarkSpec) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    g = spec.generation
    if g.temperature == 0:
        if g.n != 1:
            out.append(("generation.n", "temperature 0 is greedy: n identical completions; use n: 1"))
        if g.greedy:
            out.append(("generation.greedy", "temperature 0 is already greedy; set greedy: false"))
    if g.stop is not None and any(not s for s in g.stop):
        out.append(("generation.stop", "empty stop sequence"))
    return out


def _verifiers_problems(spec: BenchmarkSpec) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for i, v in enumerate(scorings(spec)):
        out += _verifier_problems(v, "verifier" if i == 0 else f"side_by_side.{i - 1}")
    labels = [scoring_label(v) + json.dumps(v.options, sort_keys=True, default=str) for v in scorings(spec)]
    for i, label in enumerate(labels[1:]):
        if label in labels[: i + 1]:
            out.append((f"side_by_side.{i}", "the same scoring twice"))
    return out


def _metrics_problems(spec: BenchmarkSpec) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    g = spec.generation
    has_greedy = g.temperature == 0 or g.greedy
    names = [v.name for v in scorings(spec)]
    seen: set[str] = set()
    for i, metric in enumerate(spec.metrics):
        where = f"metrics.{i}"
        try:
            kind, k = parse_metric(metric)
        except ValueError as e:
            out.append((where, str(e)))
            continue
        if metric in seen:
            out.append((where, f"{metric} listed twice"))
        seen.add(metric)
        if kind == "accuracy" and not has_greedy:
            out.append((where, "accuracy is scored on a greedy completion: set generation.greedy or temperature 0"))
        if k is not None and not 1 <= k <= g.n:
            out.append((where, f"bad k in {metric}: k must be between 1 and generation.n={g.n}"))
        if kind == "maj" and any(n not in ANSWER_VERIFIERS for n in names):
            out.append((where, f"maj@k votes on extracted answers; not defined for verifier(s) "
                        f"{sorted(set(names) - set(ANSWER_VERIFIERS))}"))
        if kind == "instruction_accuracy" and any(n != "ifeval" for n in names):
            out.append((where, "instruction_accuracy is an ifeval metric"))
    return out


def _breakdown_problems(spec: BenchmarkSpec) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    d = spec.data
    allowed = BREAKDOWN_FIELDS.get(d.source, ())
    for i, f in enumerate(spec.breakdown):
        if f not in allowed:
            out.append((f"breakdown.{i}", f"{d.source} problems have no meta field {f!r} to break down by; "
                        f"available: {', '.join(allowed) or 'none'}"))
    if len(set(spec.breakdown)) != len(spec.breakdown):
        out.append(("breakdown", "a field listed twice"))
    return out


def data_file_problems(spec: BenchmarkSpec, root: Path) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if spec.data.source != SYNTHETIC:
        f = data_file(spec, root)
        missing = f"missing data file {f} (data root: ${DATA_DIR_ENV} or ../shared/data)"
        if not f.is_file() and not uses_hub(spec, spec.data.split, f):
            out.append(("data.path", missing))
        elif not f.is_file() or spec.data.split in spec.data.rows_sha256:
            try:  # a hub copy is fetched here, and the rows hash checked, before any work
                read_split(spec, spec.data.split, f)
            except hub.HubMissing as e:
                out.append(("data.path", f"{missing}, and {e}"))
            except DataFormatError as e:
                out.append(("data.rows_sha256" if "rows_sha256" in str(e) else "data.path", str(e)))
    fs = spec.prompt.few_shot
    if fs.source == "split":
        f = few_shot_file(spec, root)
        if f is not None and f.resolve() == data_file(spec, root).resolve():
            out.append(("prompt.few_shot.split", f"shots drawn from the evaluated file {f} would leak problems "
                        "into their own prompts"))
        elif f is not None and not f.is_file() and not uses_hub(spec, fs.split or "", f):
            out.append(("prompt.few_shot.path" if fs.path else "prompt.few_shot.split", f"missing data file {f}"))
        else:
            try:
                few_shot_examples(spec, root)
            except hub.HubMissing as e:
                out.append(("prompt.few_shot.split", f"missing data file {f}, and {e}"))
            except (ValueError, DataFormatError) as e:
                out.append(("prompt.few_shot", str(e)))
    return out
