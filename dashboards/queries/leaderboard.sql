-- Runs leaderboard: for every run and every group of comparable evaluation settings, the run's best value
-- of one eval metric (over its checkpoints), the confidence interval and n behind it, its rank among the
-- runs evaluated the same way, and whether the run collapsed. Numbers are ranked only against numbers
-- produced with the same settings (benchmark, problems, samples, template, temperature, max tokens, …):
-- `rlvr compare`'s rule, every setting but COMPARE_EXEMPT's (batch_size, verifier_workers, numerics,
-- and the checkpoint's train_template / template_mismatch; rlvr_core/eval/evaluate.py). settings_group
-- names the group (a hash of those settings).
-- param metric: text = accuracy_greedy | eval metric to rank by (eval_metrics.metric)
-- param benchmark: text = NULL | only this benchmark (NULL: all)
-- param experiment: text = NULL | only runs of this experiment (NULL: all)
WITH scored AS (
    SELECT run_id, benchmark, checkpoint, value, ci_low, ci_high, n, settings,
           substr(md5(benchmark || ' ' || CAST(json_merge_patch(
               CASE WHEN settings IS NULL OR settings = '' THEN '{}' ELSE settings END,
               '{"batch_size": null, "verifier_workers": null, "numerics": null,
                 "train_template": null, "template_mismatch": null}') AS VARCHAR)), 1, 10) AS settings_group
    FROM eval_metrics
    WHERE metric = $metric AND ($benchmark IS NULL OR benchmark = $benchmark)
),
best AS (
    SELECT * FROM scored
    QUALIFY row_number() OVER (PARTITION BY run_id, settings_group ORDER BY value DESC NULLS LAST, checkpoint) = 1
),
collapsed AS (
    SELECT run_id FROM run_tags WHERE key = 'collapsed' OR value = 'collapsed'
    UNION
    SELECT run_id FROM health_events WHERE serious
),
board AS (
    SELECT r.run_id, r.experiment, r.name, r.kind, r.status, r.started_at, round(r.duration_s, 1) AS duration_s,
           b.settings_group, b.benchmark,
           CAST(json_extract_string(b.settings, '$.n_problems') AS BIGINT) AS n_problems,
           CAST(json_extract_string(b.settings, '$.n') AS BIGINT) AS samples_per_problem,
           json_extract_string(b.settings, '$.template') AS template,
           CAST(json_extract_string(b.settings, '$.temperature') AS DOUBLE) AS temperature,
           CAST(json_extract_string(b.settings, '$.max_new_tokens') AS BIGINT) AS max_new_tokens,
           b.checkpoint, b.value, b.ci_low, b.ci_high, b.n,
           CASE WHEN b.value IS NULL THEN NULL
                ELSE rank() OVER (PARTITION BY b.settings_group ORDER BY b.value DESC NULLS LAST) END AS rank_in_group,
           count(b.run_id) OVER (PARTITION BY b.settings_group) AS runs_in_group,
           r.run_id IN (SELECT run_id FROM collapsed) AS collapsed
    FROM runs r
    LEFT JOIN best b ON b.run_id = r.run_id
    WHERE $experiment IS NULL OR r.experiment = $experiment
)
SELECT * FROM board
ORDER BY runs_in_group DESC, benchmark NULLS LAST, settings_group, value DESC NULLS LAST, started_at DESC, run_id
