-- Guard firings of one or more runs, to mark on their training curves: the step, the guard, whether it
-- stopped the run, and why (NULL reason: derived from the per-step health/* flags, no firings file).
-- param runs: list | run ids, comma-separated
SELECT run_id, step, guard_id, serious, reason, evidence, key, source
FROM health_events
WHERE list_contains($runs, run_id)
ORDER BY run_id, step, guard_id
