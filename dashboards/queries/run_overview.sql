-- One run: its record, tags and where its artifacts are.
-- param run_id: text | the run
SELECT r.*, (SELECT string_agg(key || coalesce('=' || value, ''), ', ' ORDER BY key)
             FROM run_tags t WHERE t.run_id = r.run_id) AS tags
FROM runs r
WHERE r.run_id = $run_id
