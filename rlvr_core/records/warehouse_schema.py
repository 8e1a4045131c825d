"""The warehouse's schema: its numbered migrations (`MIGRATIONS`, applied in order by
`rlvr_core.records.warehouse.migrate`; a migration never edits an earlier one) and which run-folder file fills
which table (`RUN_FILES`, `PROBE_FILES`, `CHECKPOINT_MANIFEST`). docs/warehouse.md describes every table."""

from __future__ import annotations

PASSK_COLUMNS = tuple(f"pass_at_{k}" for k in (1, 2, 4, 8, 16, 32, 64, 128))

MIGRATIONS: list[tuple[int, str, str]] = [
    (1, "core tables: runs, params, pass-rate tables, eval samples and metrics, pass@k curves", f"""
    CREATE TABLE runs (
        run_id VARCHAR PRIMARY KEY,
        experiment VARCHAR NOT NULL,
        name VARCHAR,
        kind VARCHAR,              -- demo, pipeline, trial, eval, …
        status VARCHAR,
        started_at TIMESTAMP,
        finished_at TIMESTAMP,
        duration_s DOUBLE,
        config_hash VARCHAR,
        git_sha VARCHAR,
        git_dirty BOOLEAN,
        model_id VARCHAR,
        model_hash VARCHAR,
        tokenizer_hash VARCHAR,
        dataset_hash VARCHAR,
        prompt_template VARCHAR,
        artifact_uri VARCHAR,
        mlflow_run_id VARCHAR,
        prefect_flow_run_id VARCHAR
    );
    CREATE TABLE run_params (run_id VARCHAR NOT NULL, key VARCHAR NOT NULL, value VARCHAR);
    CREATE TABLE pass_rate_tables (
        run_id VARCHAR NOT NULL,
        table_id VARCHAR NOT NULL,  -- content hash of (data, model, template, sampling, verifier)
        problem_id VARCHAR NOT NULL,
        n INTEGER NOT NULL,
        c INTEGER NOT NULL,
        pass_rate DOUBLE,
        {", ".join(f"{c} DOUBLE" for c in PASSK_COLUMNS)},
        mean_length DOUBLE,
        truncation_share DOUBLE,
        n_correct INTEGER, n_incorrect INTEGER, n_no_answer INTEGER, n_error INTEGER, n_timeout INTEGER,
        model_hash VARCHAR,
        prompt_template VARCHAR,
        temperature DOUBLE,
        max_new_tokens INTEGER,
        verifier VARCHAR
    );
    CREATE TABLE eval_samples (
        run_id VARCHAR NOT NULL,
        eval_id VARCHAR NOT NULL,
        benchmark VARCHAR NOT NULL,
        benchmark_version VARCHAR,
        checkpoint VARCHAR,
        problem_id VARCHAR NOT NULL,
        sample_index INTEGER NOT NULL,
        greedy BOOLEAN,
        response VARCHAR,
        extracted VARCHAR,
        status VARCHAR,
        reward DOUBLE,
        finish_reason VARCHAR,
        length INTEGER,
        prompt_template VARCHAR,
        temperature DOUBLE,
        max_new_tokens INTEGER,
        dtype VARCHAR,
        verifier VARCHAR,
        verifier_version VARCHAR
    );
    CREATE TABLE eval_metrics (
        run_id VARCHAR NOT NULL,
        eval_id VARCHAR NOT NULL,
        benchmark VARCHAR NOT NULL,
        checkpoint VARCHAR,
        metric VARCHAR NOT NULL,
        value DOUBLE,
        n INTEGER,
        ci_low DOUBLE,
        ci_high DOUBLE,
        settings VARCHAR            -- JSON: template, decoding, max tokens, dtype, verifier version, …
    );
    CREATE TABLE passk_curves (
        run_id VARCHAR NOT NULL,
        source VARCHAR NOT NULL,    -- eval_id or pass-rate table id
        k INTEGER NOT NULL,
        value DOUBLE,
        n_problems INTEGER
    );
    """),
    (2, "curricula: the ordered prompts a run trains on", """
    CREATE TABLE curricula (
        run_id VARCHAR NOT NULL,
        curriculum_id VARCHAR NOT NULL,
        strategy VARCHAR,
        position INTEGER NOT NULL,
        problem_id VARCHAR NOT NULL,
        pass_rate DOUBLE,
        n INTEGER,
        c INTEGER
    );
    """),
    (3, "train_steps: per-step training metrics in long form", """
    CREATE TABLE train_steps (
        run_id VARCHAR NOT NULL,
        step INTEGER NOT NULL,
        metric VARCHAR NOT NULL,
        value DOUBLE
    );
    """),
    (4, "health_events (guard firings) and run_tags", """
    CREATE TABLE health_events (
        run_id VARCHAR NOT NULL,
        step INTEGER NOT NULL,
        guard_id VARCHAR NOT NULL,  -- BUGZOO id, e.g. G-collapse
        serious BOOLEAN,            -- true: the guard stopped the run; NULL when derived from step flags
        reason VARCHAR,
        evidence VARCHAR,           -- JSON object
        key VARCHAR,                -- episode key (eval name, "kl", …)
        source VARCHAR              -- 'firings' (train/health_events.parquet) or 'train_steps' (health/* flags)
    );
    CREATE TABLE run_tags (run_id VARCHAR NOT NULL, key VARCHAR NOT NULL, value VARCHAR);
    """),
    (5, "rollout_samples: training completions sampled per GRPO step", """
    CREATE TABLE rollout_samples (
        run_id VARCHAR NOT NULL,
        step INTEGER NOT NULL,
        position INTEGER,           -- curriculum position of the prompt
        prompt_id VARCHAR NOT NULL,
        sample_index INTEGER,
        prompt VARCHAR,
        completion VARCHAR,
        reward DOUBLE,
        status VARCHAR,
        length INTEGER,
        finish_reason VARCHAR,
        overlong_penalty DOUBLE,
        advantage DOUBLE
    );
    """),
    (6, "checkpoints: exported checkpoints (one row per export_manifest.json)", """
    CREATE TABLE checkpoints (
        run_id VARCHAR NOT NULL,
        checkpoint VARCHAR NOT NULL,  -- folder name under checkpoints/ (final, step100, …)
        step INTEGER,
        tag VARCHAR,
        dtype VARCHAR,
        zero_stage INTEGER,
        uri VARCHAR,                  -- where the exported folder lives (path or s3://)
        manifest_sha256 VARCHAR,
        n_parameters BIGINT,
        n_files INTEGER,
        total_bytes BIGINT,
        created_at TIMESTAMP,
        model_class VARCHAR
    );
    """),
    (7, "probe tables (rlvr_core/probe/tables.py): per-token statistics of checkpoints against a reference, and their summaries", """
    CREATE TABLE probe_tokens (
        run_id VARCHAR NOT NULL,
        probe_id VARCHAR NOT NULL,
        checkpoint_a VARCHAR,       -- the reference
        checkpoint_b VARCHAR,       -- the checkpoint compared with it
        step_b BIGINT,
        sequence_id VARCHAR,
        problem_id VARCHAR,
        sample_index INTEGER,
        source VARCHAR,
        position INTEGER,
        token_id INTEGER,
        token_text VARCHAR,
        category VARCHAR,
        logp_a DOUBLE, logp_b DOUBLE, dlogp DOUBLE,
        kl_ab DOUBLE, kl_ba DOUBLE, kl_sym DOUBLE,
        entropy_a DOUBLE, entropy_b DOUBLE,
        is_spike BOOLEAN
    );
    CREATE TABLE probe_problems (
        run_id VARCHAR NOT NULL,
        probe_id VARCHAR NOT NULL,
        checkpoint VARCHAR, step BIGINT, sequence_id VARCHAR, problem_id VARCHAR, source VARCHAR,
        n_tokens INTEGER, mean_kl DOUBLE, max_kl DOUBLE, n_spikes INTEGER, mean_spike_value DOUBLE,
        mean_entropy_a DOUBLE, mean_entropy_b DOUBLE, mean_dlogp DOUBLE, sum_logp_a DOUBLE, sum_logp_b DOUBLE
    );
    CREATE TABLE probe_checkpoints (
        run_id VARCHAR NOT NULL,
        probe_id VARCHAR NOT NULL,
        checkpoint VARCHAR, step BIGINT,
        metric VARCHAR,             -- the per-token value the KL columns summarise (kl_ba, kl_sym, …)
        n_sequences INTEGER, n_tokens BIGINT, mean_kl DOUBLE, std_kl DOUBLE, median_kl DOUBLE, min_kl DOUBLE,
        max_kl DOUBLE, token_mean_kl DOUBLE, mean_spikes DOUBLE, total_spikes BIGINT, mean_spike_value DOUBLE,
        mean_entropy_a DOUBLE, mean_entropy_b DOUBLE, mean_dlogp DOUBLE
    );
    CREATE TABLE probe_categories (
        run_id VARCHAR NOT NULL,
        probe_id VARCHAR NOT NULL,
        checkpoint VARCHAR, step BIGINT, category VARCHAR, n_tokens BIGINT, mean_kl DOUBLE, n_spikes BIGINT,
        spike_rate DOUBLE, spike_share DOUBLE, mean_dlogp DOUBLE
    );
    CREATE TABLE probe_turning_points (
        run_id VARCHAR NOT NULL,
        probe_id VARCHAR NOT NULL,
        series VARCHAR, step BIGINT, value DOUBLE,
        kind VARCHAR                -- peak, trough, inflection
    );
    """),
    (8, "ingest_log: what each run's last ingest read (content fingerprint) and wrote", """
    CREATE TABLE ingest_log (
        run_id VARCHAR PRIMARY KEY,
        run_prefix VARCHAR NOT NULL,
        fingerprint VARCHAR NOT NULL,  -- sha256 over (file name, sha256 of its bytes) of every file read
        files VARCHAR,                 -- JSON list of the files read
        row_counts VARCHAR,            -- JSON {table: rows}
        ingested_at TIMESTAMP
    );
    """),
    (9, "evaluator columns: what rlvr_core/eval/evaluate.py writes beyond migration 1's eval tables", """
    -- eval_samples: how each completion was produced and scored (eval.metrics._SAMPLE_SCHEMA)
    ALTER TABLE eval_samples ADD COLUMN benchmark_hash VARCHAR;
    ALTER TABLE eval_samples ADD COLUMN top_p DOUBLE;
    ALTER TABLE eval_samples ADD COLUMN engine VARCHAR;           -- hf, vllm
    ALTER TABLE eval_samples ADD COLUMN seed BIGINT;              -- the request's own seed (rlvr_core.core.seeding)
    ALTER TABLE eval_samples ADD COLUMN verifier_mode VARCHAR;
    ALTER TABLE eval_samples ADD COLUMN scoring VARCHAR;          -- headline scoring label, e.g. gsm8k:flexible
    ALTER TABLE eval_samples ADD COLUMN continued_after_answer BOOLEAN;  -- G-stop-seq
    ALTER TABLE eval_samples ADD COLUMN instructions_followed INTEGER;   -- ifeval
    ALTER TABLE eval_samples ADD COLUMN instructions_total INTEGER;
    ALTER TABLE eval_samples ADD COLUMN side_by_side VARCHAR;     -- JSON {scoring: {status, extracted, reward, …}}
    ALTER TABLE eval_samples ADD COLUMN meta VARCHAR;             -- JSON: the problem's metadata (level, type, …)
    -- eval_metrics: which scoring and breakdown group a row is about (eval.metrics._METRIC_SCHEMA)
    ALTER TABLE eval_metrics ADD COLUMN benchmark_version VARCHAR;
    ALTER TABLE eval_metrics ADD COLUMN scoring VARCHAR;          -- NULL for properties of the completions
    ALTER TABLE eval_metrics ADD COLUMN breakdown_field VARCHAR;  -- NULL on whole-benchmark rows
    ALTER TABLE eval_metrics ADD COLUMN breakdown_value VARCHAR;
    -- passk_curves: the evaluation a curve belongs to, as columns rather than parsed out of `source`
    ALTER TABLE passk_curves ADD COLUMN eval_id VARCHAR;
    ALTER TABLE passk_curves ADD COLUMN benchmark VARCHAR;
    ALTER TABLE passk_curves ADD COLUMN checkpoint VARCHAR;
    ALTER TABLE passk_curves ADD COLUMN scoring VARCHAR;
    """),
    (10, "health_events as episodes: per-step flags and evaluation flags beside the run-level firings", """
    -- A run of consecutive flagged steps is one event: `step` its first step, `last_step` its last, `n_steps`
    -- how many (a run-level firing or an evaluation flag: last_step = step, n_steps = 1). `source` gains
    -- 'step_flags' (per-step health/* flags as episodes) and 'eval' (an evaluation over a limit; step 0 = base).
    ALTER TABLE health_events ADD COLUMN last_step INTEGER;
    ALTER TABLE health_events ADD COLUMN n_steps INTEGER;
    """),
    (11, "rollout_segments: a multi-turn rollout's trajectory, one row per segment (rlvr_core/environments)", """
    -- The trajectories of the completions in rollout_samples (same run_id, step, prompt_id, sample_index), as the
    -- trainer saw them: segment 0 is the first prompt's ids, then the model's turns (with the engine's log-probs)
    -- and the environment's observations (no log-probs; the loss mask is 0 on them). Token-in/token-out: the ids
    -- are what was sampled and trained, never text encoded again; rlvr_core.environments.trajectory.from_rows
    -- reads a trajectory back from its rows.
    CREATE TABLE rollout_segments (
        run_id VARCHAR NOT NULL,
        step INTEGER NOT NULL,
        prompt_id VARCHAR NOT NULL,
        sample_index INTEGER NOT NULL,
        segment INTEGER NOT NULL,   -- 0 = the first prompt, then 1.. in order
        role VARCHAR NOT NULL,      -- prompt, model or env
        turn INTEGER,               -- the model turn a segment belongs to (-1 for the prompt)
        token_ids BIGINT[],
        logprobs DOUBLE[],          -- model segments only
        weight_version INTEGER,     -- the policy version that sampled a model segment
        reward DOUBLE,              -- the trajectory's outcome reward (on every row of it)
        "end" VARCHAR,              -- why it ended: done, max_turns, max_total_tokens, deadline, length
        tool_calls INTEGER,
        tool_errors INTEGER,
        text VARCHAR                -- the final turn, decoded (what the verifier scored)
    );
    """),
]

# The Parquet files of a run folder (relative to `<experiment>/<run_id>/`) and the table each fills.
# Columns are matched by name: columns a table does not know are ignored, columns a file lacks become
# NULL, and a file that lacks a NOT NULL column is refused with its name and the column's.
RUN_FILES = {
    "pass_rate_tables": "passk/pass_rate_table.parquet",
    "eval_samples": "evals/samples.parquet",
    "eval_metrics": "evals/metrics.parquet",
    "passk_curves": "passk_curves.parquet",
    "curricula": "curriculum/curriculum.parquet",
    "train_steps": "train/steps_long.parquet",
    "health_events": "train/health_events.parquet",
    "rollout_samples": "train/rollouts.parquet",
    "rollout_segments": "train/rollout_segments.parquet",
}
# Probe outputs (rlvr_core.probe: `publish` copies its folder to `<run>/probe/`) may sit anywhere under
# probe/ or probes/, one folder per probe or several probes in one (each row carries probe_id); a file
# without a probe_id column takes its folder's name.
PROBE_TABLES = ("probe_tokens", "probe_problems", "probe_checkpoints", "probe_categories", "probe_turning_points")
PROBE_FILES = {t: f"{t}.parquet" for t in PROBE_TABLES}
# One row of `checkpoints` per exported checkpoint: checkpoints/<name>/export_manifest.json (rlvr_core.artifacts.export).
CHECKPOINT_MANIFEST = "export_manifest.json"
# Every table keyed by run_id: what a re-ingest of a run deletes first.
RUN_TABLES = ("run_params", "run_tags", *RUN_FILES, "checkpoints", *PROBE_FILES)
