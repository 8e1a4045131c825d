-- Probe: the tokens where a checkpoint disagrees most with the reference (largest symmetric KL), with
-- the problem, position, category and both log-probs.
-- param run_id: text | the run
-- param probe_id: text = NULL | only this probe (NULL: all)
-- param checkpoint: text = NULL | only this compared checkpoint (checkpoint_b; NULL: all)
-- param limit: int = 50 | how many tokens
SELECT probe_id, checkpoint_b AS checkpoint, step_b AS step, problem_id, position, token_text, category, kl_sym,
       kl_ab, kl_ba, dlogp, logp_a, logp_b, entropy_a, entropy_b, is_spike
FROM probe_tokens
WHERE run_id = $run_id AND ($probe_id IS NULL OR probe_id = $probe_id)
  AND ($checkpoint IS NULL OR checkpoint_b = $checkpoint)
ORDER BY kl_sym DESC NULLS LAST, probe_id, checkpoint_b, problem_id, position
LIMIT $limit
