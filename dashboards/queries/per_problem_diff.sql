-- Per-problem diff between two evaluated checkpoints (two runs, or base vs trained of one run):
-- greedy correctness on each side, the sampled solve rate on each side and its change, and what changed.
-- param run_a: text | the run on the left
-- param run_b: text | the run on the right (may equal run_a with different checkpoints)
-- param checkpoint_a: text = NULL | checkpoint of run_a (NULL: its last non-base checkpoint by name, else base)
-- param checkpoint_b: text = NULL | checkpoint of run_b (same default)
-- param benchmark: text = NULL | only this benchmark (NULL: all)
-- param only_changed: bool = false | true: only problems whose greedy outcome differs
WITH pick AS (
    SELECT
        coalesce($checkpoint_a, (SELECT checkpoint FROM eval_samples WHERE run_id = $run_a
                                 GROUP BY checkpoint ORDER BY checkpoint = 'base', checkpoint DESC LIMIT 1)) AS ck_a,
        coalesce($checkpoint_b, (SELECT checkpoint FROM eval_samples WHERE run_id = $run_b
                                 GROUP BY checkpoint ORDER BY checkpoint = 'base', checkpoint DESC LIMIT 1)) AS ck_b
),
a AS (
    SELECT benchmark, problem_id,
           bool_or(status = 'correct') FILTER (WHERE greedy) AS greedy_correct,
           avg((status = 'correct')::DOUBLE) FILTER (WHERE NOT greedy) AS sampled_rate,
           count(*) FILTER (WHERE NOT greedy) AS n_sampled
    FROM eval_samples
    WHERE run_id = $run_a AND checkpoint = (SELECT ck_a FROM pick)
      AND ($benchmark IS NULL OR benchmark = $benchmark)
    GROUP BY benchmark, problem_id
),
b AS (
    SELECT benchmark, problem_id,
           bool_or(status = 'correct') FILTER (WHERE greedy) AS greedy_correct,
           avg((status = 'correct')::DOUBLE) FILTER (WHERE NOT greedy) AS sampled_rate,
           count(*) FILTER (WHERE NOT greedy) AS n_sampled
    FROM eval_samples
    WHERE run_id = $run_b AND checkpoint = (SELECT ck_b FROM pick)
      AND ($benchmark IS NULL OR benchmark = $benchmark)
    GROUP BY benchmark, problem_id
),
diff AS (
    SELECT coalesce(a.benchmark, b.benchmark) AS benchmark, coalesce(a.problem_id, b.problem_id) AS problem_id,
           (SELECT ck_a FROM pick) AS checkpoint_a, (SELECT ck_b FROM pick) AS checkpoint_b,
           a.greedy_correct AS greedy_a, b.greedy_correct AS greedy_b,
           a.sampled_rate AS sampled_a, b.sampled_rate AS sampled_b,
           b.sampled_rate - a.sampled_rate AS sampled_delta,
           CASE WHEN a.problem_id IS NULL THEN 'only_in_b'
                WHEN b.problem_id IS NULL THEN 'only_in_a'
                WHEN a.greedy_correct IS NULL OR b.greedy_correct IS NULL THEN 'no_greedy'
                WHEN NOT a.greedy_correct AND b.greedy_correct THEN 'fixed'
                WHEN a.greedy_correct AND NOT b.greedy_correct THEN 'broken'
                WHEN a.greedy_correct THEN 'both_right'
                ELSE 'both_wrong' END AS change
    FROM a FULL OUTER JOIN b ON a.benchmark = b.benchmark AND a.problem_id = b.problem_id
)
SELECT * FROM diff
WHERE NOT $only_changed OR change IN ('fixed', 'broken')
ORDER BY CASE change WHEN 'fixed' THEN 0 WHEN 'broken' THEN 1 ELSE 2 END,
         abs(sampled_delta) DESC NULLS LAST, benchmark, problem_id
