-- Ablation pivot: the trials of a sweep (or the runs of an experiment) grouped by the params that differ between them (the
-- swept params; seed-like params are ignored, so each group is one configuration over its seeds), with
-- the mean of a metric over seeds and a two-sided 95% Student-t interval: mean ± t(0.975, n-1) · sd / √n.
-- A configuration with one run has no spread to measure: it gets that run's own interval over problems (the
-- evaluation's Wilson interval; none for pass@k), and `ci_kind` says which interval a row has.
-- One row per (configuration, benchmark); the dashboard pivots benchmarks into columns, and the sweep pivot
-- (rlvr_core.pipeline.sweeps.sweep_pivot) runs this query with the sweep's keys and reads the swept values from `cell`.
-- param experiment: text = NULL | only runs of this experiment (runs.experiment; NULL: all)
-- param sweep: text = NULL | only the trials of this sweep (param sweep.id; NULL: all)
-- param metric: text = accuracy_greedy | eval metric to compare
-- param benchmark: text = NULL | only this benchmark (NULL: all)
-- param checkpoint: text = NULL | evaluated checkpoint to use (NULL: per run, the last non-base checkpoint by name, else base)
-- param ignore: list = %seed%,name,sweep.trial_% | LIKE patterns of param keys that never define a configuration
-- param keys: list = NULL | the param keys that define a configuration (NULL: the keys whose values differ between the runs, less ignore)
WITH trials AS (
    SELECT run_id FROM runs
    WHERE ($experiment IS NULL OR experiment = $experiment)
      AND ($sweep IS NULL OR run_id IN (SELECT run_id FROM run_params WHERE key = 'sweep.id' AND value = $sweep))
),
params AS (  -- every (trial, candidate key) pair, a missing key read as '∅' so it can differ too
    SELECT t.run_id, k.key, coalesce(p.value, '∅') AS value
    FROM trials t
    CROSS JOIN (SELECT DISTINCT key FROM run_params WHERE run_id IN (SELECT run_id FROM trials)) k
    LEFT JOIN run_params p ON p.run_id = t.run_id AND p.key = k.key
    WHERE CASE WHEN $keys IS NULL
               THEN NOT coalesce(list_bool_or(list_transform($ignore, lambda pat: k.key LIKE pat)), false)
               ELSE list_contains($keys, k.key) END
),
swept AS (  -- the given keys, else the candidates whose values differ
    SELECT key FROM params GROUP BY key HAVING $keys IS NOT NULL OR count(DISTINCT value) > 1
),
configs AS (
    SELECT t.run_id,
           coalesce(string_agg(p.key || '=' || p.value, ', ' ORDER BY p.key), '(one configuration)') AS config,
           CAST(coalesce(to_json(map_from_entries(
               list((p.key, p.value) ORDER BY p.key) FILTER (WHERE p.key IS NOT NULL))), '{}') AS VARCHAR) AS cell
    FROM trials t
    LEFT JOIN params p ON p.run_id = t.run_id AND p.key IN (SELECT key FROM swept)
    GROUP BY t.run_id
),
labels AS (  -- how a sweep names its trials: the seed and the trial id (NULL outside sweeps)
    SELECT run_id, max(TRY_CAST(value AS BIGINT)) FILTER (WHERE key = 'seed') AS seed,
           max(value) FILTER (WHERE key = 'sweep.trial_id') AS trial_id
    FROM run_params
    WHERE run_id IN (SELECT run_id FROM trials) AND key IN ('seed', 'sweep.trial_id')
    GROUP BY run_id
),
per_trial AS (
    SELECT e.run_id, e.benchmark, e.value, e.n, e.ci_low, e.ci_high
    FROM eval_metrics e
    WHERE e.run_id IN (SELECT run_id FROM trials) AND e.metric = $metric
      AND ($benchmark IS NULL OR e.benchmark = $benchmark)
      AND ($checkpoint IS NULL OR e.checkpoint = $checkpoint)
    QUALIFY row_number() OVER (PARTITION BY e.run_id, e.benchmark
                               ORDER BY e.checkpoint = 'base', e.checkpoint DESC) = 1
),
grouped AS (
    SELECT c.config, any_value(c.cell) AS cell, p.benchmark, count(*) AS n_seeds, avg(p.value) AS mean,
           stddev_samp(p.value) AS sd, min(p.value) AS min, max(p.value) AS max,
           list(p.run_id ORDER BY p.run_id) AS runs,
           list(p.value ORDER BY l.seed, l.trial_id, p.run_id) AS per_seed,
           list(l.seed ORDER BY l.seed, l.trial_id, p.run_id) AS seeds,
           list(l.trial_id ORDER BY l.seed, l.trial_id, p.run_id) AS trial_ids,
           min(p.n) AS n_problems, min(p.ci_low) AS run_ci_low, max(p.ci_high) AS run_ci_high
    FROM per_trial p JOIN configs c ON c.run_id = p.run_id LEFT JOIN labels l ON l.run_id = p.run_id
    GROUP BY c.config, p.benchmark
),
-- t(0.975, df): exact (rlvr_core.eval.compare.t_quantile) for df <= 30, from the list below; beyond, the Cornish–Fisher
-- expansion around z = 1.959964, within 2e-6 of the exact quantile at df = 31 and closer above.
-- tests/dashboards/test_dashboard_queries.py checks the interval against rlvr_core.eval.compare.paired_t_interval.
with_t AS (
    SELECT *, n_seeds - 1 AS df, 1.959963984540054 AS z FROM grouped
),
with_q AS (
    SELECT *, CASE WHEN df < 1 THEN NULL
                   WHEN df <= 30 THEN [12.7062047362, 4.3026527297, 3.1824463053, 2.7764451052, 2.5705818356,
                                       2.4469118511, 2.3646242516, 2.3060041352, 2.2621571628, 2.2281388520,
                                       2.2009851601, 2.1788128297, 2.1603686565, 2.1447866879, 2.1314495456,
                                       2.1199052992, 2.1098155778, 2.1009220402, 2.0930240544, 2.0859634473,
                                       2.0796138447, 2.0738730679, 2.0686576104, 2.0638985616, 2.0595385528,
                                       2.0555294386, 2.0518305165, 2.0484071418, 2.0452296421, 2.0422724563][df]
                   ELSE z + (z^3 + z) / (4 * df) + (5 * z^5 + 16 * z^3 + 3 * z) / (96 * df^2)
                        + (3 * z^7 + 19 * z^5 + 17 * z^3 - 15 * z) / (384 * df^3) END AS t
    FROM with_t
)
SELECT config, cell, benchmark, n_seeds, mean, sd,
       CASE WHEN n_seeds >= 2 THEN mean - t * sd / sqrt(n_seeds) ELSE run_ci_low END AS ci_low,
       CASE WHEN n_seeds >= 2 THEN mean + t * sd / sqrt(n_seeds) ELSE run_ci_high END AS ci_high,
       CASE WHEN n_seeds >= 2 THEN 't over ' || n_seeds || ' seeds'
            WHEN run_ci_low IS NOT NULL THEN 'wilson (1 seed)' ELSE 'none (1 seed)' END AS ci_kind,
       min, max, runs, per_seed, seeds, trial_ids, n_problems,
       (SELECT string_agg(key, ', ' ORDER BY key) FROM swept) AS swept_params
FROM with_q
ORDER BY benchmark, mean DESC, config
