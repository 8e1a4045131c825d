"""The prompt a benchmark renders: its template (or a few-shot variant of it) and its stop sequences."""

from __future__ import annotations

from pathlib import Path

from rlvr_core.data.templates import PromptTemplate, few_shot, get_template
from rlvr_core.experiment.benchmarks.data import few_shot_examples
from rlvr_core.experiment.benchmarks.spec import BenchmarkSpec


def prompt_template(spec: BenchmarkSpec, root: str | Path | None = None) -> PromptTemplate:
    """The template a benchmark renders prompts with: the named one, or a few-shot variant of it.

    A few-shot variant's id is ``<name>/<template>/<k>shot`` and its version ``<template version>.<benchmark
    version>``: its examples are part of the benchmark, so a new benchmark version is a new template version.
    """
    base = get_template(spec.prompt.template)
    examples = few_shot_examples(spec, root)
    if not examples:
        return base
    return few_shot(base, examples, id=f"{spec.name}/{base.id}/{len(examples)}shot",
                    version=f"{base.version}.{spec.version}")


def effective_stop(spec: BenchmarkSpec) -> list[str]:
    """generation.stop, or the template's own stop sequences when it is not set."""
    g = spec.generation
    return list(g.stop) if g.stop is not None else list(get_template(spec.prompt.template).stop)
