-- Best checkpoint per benchmark: the (run, checkpoint) with the highest value of a metric on each
-- benchmark, with its interval, n, and where the exported checkpoint lives when it was exported.
-- param metric: text = accuracy_greedy | eval metric to rank by
-- param experiment: text = NULL | only runs of this experiment (NULL: all)
-- param include_base: bool = true | false: leave out the untrained base model (checkpoint 'base')
WITH ranked AS (
    SELECT e.benchmark, e.run_id, r.experiment, e.checkpoint, e.value, e.ci_low, e.ci_high, e.n,
           row_number() OVER (PARTITION BY e.benchmark
                              ORDER BY e.value DESC, e.ci_low DESC NULLS LAST, e.run_id, e.checkpoint) AS rank
    FROM eval_metrics e
    JOIN runs r ON r.run_id = e.run_id
    WHERE e.metric = $metric
      AND ($experiment IS NULL OR r.experiment = $experiment)
      AND ($include_base OR e.checkpoint IS DISTINCT FROM 'base')
      AND e.value IS NOT NULL
)
SELECT k.benchmark, k.run_id, k.experiment, k.checkpoint, k.value, k.ci_low, k.ci_high, k.n,
       c.step AS checkpoint_step, c.uri AS checkpoint_uri
FROM ranked k
-- An evaluation names its checkpoint by export folder name (final) or by the export's path or URI
-- (…/checkpoints/final): either finds the export.
LEFT JOIN checkpoints c ON c.run_id = k.run_id
     AND (c.checkpoint = k.checkpoint OR c.uri = k.checkpoint OR ends_with(k.checkpoint, '/checkpoints/' || c.checkpoint))
WHERE k.rank = 1
ORDER BY k.benchmark
