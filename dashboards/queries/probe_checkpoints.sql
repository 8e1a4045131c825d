-- Probe trajectory: per compared checkpoint, the mean per-sequence KL to the reference (with spread),
-- spikes and entropies, and where a series of the trajectory turns (e.g. 'mean_kl peak') (probe_checkpoints and
-- probe_turning_points, written by rlvr_core.probe). Every run with probe results when run_id is NULL.
-- param run_id: text = NULL | only this run (NULL: all)
-- param probe_id: text = NULL | only this probe (NULL: all)
SELECT c.run_id, c.probe_id, c.checkpoint, c.step, c.metric, c.n_sequences, c.n_tokens, c.mean_kl, c.std_kl,
       c.median_kl, c.max_kl, c.token_mean_kl, c.mean_spikes, c.total_spikes, c.mean_entropy_a, c.mean_entropy_b,
       c.mean_dlogp,
       (SELECT string_agg(t.series || ' ' || t.kind, ', ' ORDER BY t.series) FROM probe_turning_points t
        WHERE t.run_id = c.run_id AND t.probe_id = c.probe_id AND t.step = c.step) AS turning_points
FROM probe_checkpoints c
WHERE ($run_id IS NULL OR c.run_id = $run_id) AND ($probe_id IS NULL OR c.probe_id = $probe_id)
ORDER BY c.run_id, c.probe_id, c.step NULLS LAST, c.checkpoint
