-- Sweeps in the warehouse (param sweep.id, set by the ablation sweep flow on every trial): experiment,
-- number of trials, when the first and last started.
SELECT p.value AS sweep, r.experiment, count(*) AS n_trials, min(r.started_at) AS first_started,
       max(r.started_at) AS last_started
FROM run_params p JOIN runs r ON r.run_id = p.run_id
WHERE p.key = 'sweep.id'
GROUP BY p.value, r.experiment
ORDER BY last_started DESC NULLS LAST, sweep
