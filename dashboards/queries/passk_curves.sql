-- pass@k curves (unbiased estimator over n samples per problem) of one or more runs, per source
-- (eval/<checkpoint> or a pass-rate table).
-- param runs: list = NULL | run ids, comma-separated (NULL: every run)
SELECT run_id, source, k, value, n_problems
FROM passk_curves
WHERE $runs IS NULL OR list_contains($runs, run_id)
ORDER BY run_id, source, k
