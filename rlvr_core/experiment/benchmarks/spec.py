"""Benchmark files' schema: the pydantic models a `configs/benchmarks/<name>.yaml` validates into, the
metric names, and where benchmark files live. The cross-field checks are in checks.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from rlvr_core.core import hub
from rlvr_core.data.loaders import known_datasets
from rlvr_core.data.templates import known_templates
from rlvr_core.experiment.config import SyntheticDataConfig
from rlvr_core.experiment.config_base import Strict, one_of
from rlvr_core.verifiers import known_verifiers

PROJECT_ROOT = Path(__file__).resolve().parents[3]
BENCHMARK_DIR = PROJECT_ROOT / "configs" / "benchmarks"
SUITE_DIR = BENCHMARK_DIR / "suites"
DATA_DIR_ENV = "RLVR_DATA_DIR"

SYNTHETIC = "synthetic"

# Fields of a problem's `meta` a result can be broken down by, per data source (what the loaders keep).
BREAKDOWN_FIELDS: dict[str, tuple[str, ...]] = {
    "math500": ("level", "subject"),
    "hendrycks_math": ("level", "subject"),
    "minerva_math": ("type",),
    "mmlu_stem": ("subject",),
    "svamp": ("type",),
    "asdiv": ("solution_type",),
    SYNTHETIC: ("difficulty", "n_steps"),
}


# ----------------------------------------------------------------------------------------------- schema
class HubDataSpec(Strict):
    repo: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$",
                      description="hub data set id (org/name), e.g. openai/gsm8k")
    config: str | None = Field(None, description="the `datasets` config name of these files (e.g. gsm8k's 'main'); "
                               "documents which config `files` are, it does not select anything")
    revision: str | None = Field(None, description="commit to read (40 hex digits); None = the commit `rlvr pull "
                                 "benchmark` fetched (the cache's default branch), recorded with every result")
    files: dict[str, str] = Field(min_length=1, description="split -> file glob in the repo holding that split's rows "
                                  "(jsonl or parquet; shards read in name order), e.g. test: main/test-*.parquet")

    @field_validator("revision")
    @classmethod
    def _commit(cls, v: str | None) -> str | None:
        if v is not None and not hub.COMMIT.match(v):
            raise ValueError(f"revision must be a full commit hash (40 hex digits), got {v!r}: a branch or tag "
                             "can move and change the numbers")
        return v


class DataSpec(Strict):
    source: str = Field(description="data set: one of rlvr_core.data.loaders.known_datasets(), or 'synthetic' "
                        "(the demo's generated task, settings in `synthetic`)")
    path: str | None = Field(None, description="file or folder of the set; None = <data root>/<source>/<split>.jsonl "
                             "(ifeval test: input_data.jsonl); relative = relative to the data root ($RLVR_DATA_DIR, "
                             "else ../shared/data next to the project); not allowed for 'synthetic'")
    split: str = Field("test", min_length=1, description="split evaluated; part of every problem id "
                       "(<source>/<split>/<key>); synthetic: 'test' or 'train'")
    max_problems: int | None = Field(None, ge=1, description="evaluate at most this many problems (None = all)")
    subset_seed: int | None = Field(None, description="with max_problems: draw that many problems with "
                                    "random.Random(subset_seed), kept in file order; None = the first max_problems")
    synthetic: SyntheticDataConfig | None = Field(None, description="generator settings (SyntheticSpec fields); "
                                                  "required when source is 'synthetic', forbidden otherwise")
    hub: HubDataSpec | None = Field(None, description="the set's public copy on the Hugging Face hub: read from the "
                                    "hub cache (downloaded unless HF_HUB_OFFLINE) when the data root has no file")
    rows_sha256: dict[str, str] = Field(default_factory=dict, description="split -> content hash of the split's rows "
                                        "as our loader maps them (rlvr_core.core.manifest.rows_sha256, before any "
                                        "subset); rows read from anywhere (data root, package, hub) must hash to it")

    @field_validator("source")
    @classmethod
    def _known_source(cls, v: str) -> str:
        return one_of(v, known_datasets() + [SYNTHETIC], "data set")


class FewShotExample(Strict):
    question: str = Field(min_length=1, description="the example's question, rendered with the benchmark's template")
    completion: str = Field(min_length=1, description="the worked answer written after the rendered question")


class FewShotSpec(Strict):
    source: Literal["none", "template", "split", "inline"] = Field(
        "none", description="where the shots come from: none (zero-shot); template (built into the template, e.g. "
        "qa_fewshot); split (rows of another split of the same data set, their `solution` as completion); "
        "inline (listed under `examples`)")
    num_shots: int = Field(0, ge=0, description="number of worked examples before the question (0 with source none)")
    split: str | None = Field(None, description="source split: the split the shots are drawn from (never the "
                              "evaluated one)")
    path: str | None = Field(None, description="source split: file of that split; None = the standard file "
                             "under the data root, as for data.path")
    select: Literal["first", "seeded"] = Field("first", description="source split: the first num_shots rows, "
                                               "or num_shots rows drawn with random.Random(seed)")
    seed: int = Field(0, description="source split with select seeded: the draw's seed")
    examples: list[FewShotExample] = Field(default_factory=list, description="source inline: the shots, in order")


class PromptSpec(Strict):
    template: str = Field(description="prompt template id (rlvr_core.data.templates); its version is part of the hash")
    model_kind: Literal["base", "chat"] = Field(description="the kind of model the benchmark is for; must match "
                                                "the template's kind (G-chat-template)")
    few_shot: FewShotSpec = Field(default_factory=FewShotSpec, description="worked examples before the question")

    @field_validator("template")
    @classmethod
    def _known_template(cls, v: str) -> str:
        return one_of(v, known_templates(), "template")


class GenerationSpec(Strict):
    temperature: float = Field(ge=0, description="temperature of the sampled completions; 0 = greedy (then n is 1)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus mass of the sampled completions (1 = off)")
    max_new_tokens: int = Field(ge=1, description="completion length cap; truncations are counted (G-truncation)")
    n: int = Field(1, ge=1, description="sampled completions per problem (the n of pass@k and maj@k)")
    greedy: bool = Field(False, description="also decode one greedy completion per problem (for `accuracy`) "
                         "when temperature > 0")
    stop: list[str] | None = Field(None, description="stop sequences; None = the template's own (G-stop-seq)")
    seed: int = Field(0, description="run seed; each request's seed is derived from it (G-fixed-seed)")


class VerifierSpec(Strict):
    name: str = Field(description="registered verifier (rlvr_core.verifiers): gsm8k, math, minerva, mcq, ifeval, code")
    mode: str | None = Field(None, description="the verifier's mode; required for verifiers that have modes "
                             "(gsm8k: flexible/strict, math: lenient/boxed, ifeval: strict/loose), forbidden otherwise")
    options: dict[str, Any] = Field(default_factory=dict, description="other constructor options, e.g. "
                                    "mcq letters: ABCD; format_reward is not allowed (evaluation is unshaped)")

    @field_validator("name")
    @classmethod
    def _known_verifier(cls, v: str) -> str:
        return one_of(v, known_verifiers(), "verifier")


class BenchmarkSpec(Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_]*$", description="benchmark name; equals the file's stem")
    version: str = Field(min_length=1, description="bump when anything that changes numbers changes (data, "
                         "subset, prompt, shots, decoding, stops, verifier, mode); stored with every result")
    description: str = Field("", description="what the benchmark measures (not part of the hash)")
    data: DataSpec = Field(description="which problems")
    prompt: PromptSpec = Field(description="how a problem becomes a prompt")
    generation: GenerationSpec = Field(description="decoding settings")
    verifier: VerifierSpec = Field(description="the scoring of the headline numbers")
    side_by_side: list[VerifierSpec] = Field(default_factory=list, description="more scorings of the same "
                                             "completions, reported next to the headline (e.g. strict vs flexible)")
    metrics: list[str] = Field(min_length=1, description="accuracy (greedy completion correct), pass@K (unbiased, "
                               "K <= n), maj@K (majority vote of the first K extracted answers), mean_reward, "
                               "instruction_accuracy (ifeval: share of instructions followed, over all instructions)")
    breakdown: list[str] = Field(default_factory=list, description="meta fields to report metrics per value of "
                                 "(see BREAKDOWN_FIELDS), e.g. level, subject")

    @field_validator("version", mode="before")
    @classmethod
    def _version_text(cls, v: Any) -> Any:
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else v


class SuiteSpec(Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_]*$", description="suite name; equals the file's stem")
    description: str = Field("", description="what the suite is for")
    benchmarks: list[str] = Field(min_length=1, description="benchmark names (files in configs/benchmarks/)")


# ------------------------------------------------------------------------------------------- metrics
_METRIC = re.compile(r"^(?:(?P<plain>accuracy|mean_reward|instruction_accuracy)|(?P<kind>pass|maj)@(?P<k>\d+))$")


def parse_metric(metric: str) -> tuple[str, int | None]:
    """'pass@8' -> ('pass', 8); 'accuracy' -> ('accuracy', None); ValueError for anything else."""
    m = _METRIC.match(metric)
    if not m:
        raise ValueError(f"unknown metric {metric!r}; known: accuracy, mean_reward, instruction_accuracy, "
                         "pass@K, maj@K")
    if m.group("plain"):
        return m.group("plain"), None
    return m.group("kind"), int(m.group("k"))
