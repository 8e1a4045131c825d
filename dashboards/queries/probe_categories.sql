-- Probe: where the checkpoints disagree with the reference, by token category (number, math symbol, …),
-- per compared checkpoint (probe_categories, written by rlvr_core.probe).
-- param run_id: text | the run
-- param probe_id: text = NULL | only this probe (NULL: all)
SELECT probe_id, checkpoint, step, category, n_tokens, mean_kl, n_spikes, spike_rate, spike_share, mean_dlogp
FROM probe_categories
WHERE run_id = $run_id AND ($probe_id IS NULL OR probe_id = $probe_id)
ORDER BY probe_id, step NULLS LAST, checkpoint, mean_kl DESC NULLS LAST
