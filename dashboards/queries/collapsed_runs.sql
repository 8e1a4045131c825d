-- Runs tagged collapsed: a `collapsed` tag in run.json, or a serious guard firing (one that stopped the
-- run), with the first serious firing's step, guard and reason.
-- param experiment: text = NULL | only runs of this experiment (NULL: all)
WITH tagged AS (
    SELECT DISTINCT run_id FROM run_tags WHERE key = 'collapsed' OR value = 'collapsed'
),
first_serious AS (
    SELECT run_id, step, guard_id, reason
    FROM health_events WHERE serious
    QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY step, guard_id) = 1
)
SELECT r.run_id, r.experiment, r.name, r.status, r.started_at,
       r.run_id IN (SELECT run_id FROM tagged) AS tagged_collapsed,
       f.step AS stopped_at_step, f.guard_id, f.reason
FROM runs r
LEFT JOIN first_serious f ON f.run_id = r.run_id
WHERE (r.run_id IN (SELECT run_id FROM tagged) OR f.run_id IS NOT NULL)
  AND ($experiment IS NULL OR r.experiment = $experiment)
ORDER BY r.started_at DESC, r.run_id
