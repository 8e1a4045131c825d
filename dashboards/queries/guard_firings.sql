-- Guard firings of one or more runs, to mark on their training curves: the step, the guard, whether it
-- stopped the run, and why (NULL reason: derived from the per-step health/* flags, no firings file).
-- A per-step flag is one row per episode of consecutive flagged steps (step .. last_step, n_steps).
-- param runs: list | run ids, comma-separated
SELECT run_id, step, last_step, n_steps, guard_id, serious, reason, evidence, key, source
FROM health_events
WHERE list_contains($runs, run_id)
ORDER BY run_id, step, guard_id
