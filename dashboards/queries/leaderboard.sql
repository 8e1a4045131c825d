-- Runs leaderboard: every run with its best value of one eval metric (over its checkpoints), the
-- confidence interval and n behind it, and whether the run collapsed.
-- param metric: text = accuracy_greedy | eval metric to rank by (eval_metrics.metric)
-- param benchmark: text = NULL | only this benchmark (NULL: each run's best row over all benchmarks)
-- param experiment: text = NULL | only runs of this experiment (NULL: all)
WITH best AS (
    SELECT run_id, benchmark, checkpoint, value, ci_low, ci_high, n
    FROM eval_metrics
    WHERE metric = $metric AND ($benchmark IS NULL OR benchmark = $benchmark)
    QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY value DESC NULLS LAST, benchmark, checkpoint) = 1
),
collapsed AS (
    SELECT run_id FROM run_tags WHERE key = 'collapsed' OR value = 'collapsed'
    UNION
    SELECT run_id FROM health_events WHERE serious
)
SELECT r.run_id, r.experiment, r.name, r.kind, r.status, r.started_at, round(r.duration_s, 1) AS duration_s,
       b.benchmark, b.checkpoint, b.value, b.ci_low, b.ci_high, b.n,
       r.run_id IN (SELECT run_id FROM collapsed) AS collapsed
FROM runs r
LEFT JOIN best b ON b.run_id = r.run_id
WHERE $experiment IS NULL OR r.experiment = $experiment
ORDER BY b.value DESC NULLS LAST, r.started_at DESC, r.run_id
