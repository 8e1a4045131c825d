-- Training curves: per-step metrics of one or more runs in long form (run, step, metric, value).
-- param runs: list | run ids, comma-separated
-- param metrics: list = reward_mean,loss,entropy,kl_ref_mean,grad_norm,completion_len_mean | metric names (NULL: every metric)
SELECT run_id, step, metric, value
FROM train_steps
WHERE list_contains($runs, run_id)
  AND ($metrics IS NULL OR list_contains($metrics, metric))
ORDER BY run_id, metric, step
