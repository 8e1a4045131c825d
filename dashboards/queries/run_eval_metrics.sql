-- Every eval metric of one run, per benchmark and checkpoint, with intervals and n.
-- param run_id: text | the run
SELECT benchmark, checkpoint, eval_id, metric, value, ci_low, ci_high, n
FROM eval_metrics
WHERE run_id = $run_id
ORDER BY benchmark, checkpoint, metric
