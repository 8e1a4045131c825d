-- What there is to choose from: every eval metric with its benchmarks and checkpoints, and every
-- training metric, with how many runs have each (for the dashboard's pickers).
SELECT 'eval' AS kind, metric AS name, string_agg(DISTINCT benchmark, ',' ORDER BY benchmark) AS benchmarks,
       string_agg(DISTINCT checkpoint, ',' ORDER BY checkpoint) AS checkpoints, count(DISTINCT run_id) AS n_runs
FROM eval_metrics GROUP BY metric
UNION ALL
SELECT 'train', metric, NULL, NULL, count(DISTINCT run_id) FROM train_steps GROUP BY metric
ORDER BY kind, n_runs DESC, name
