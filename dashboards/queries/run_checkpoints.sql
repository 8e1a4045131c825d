-- Exported checkpoints of one run (one row per export_manifest.json).
-- param run_id: text | the run
SELECT checkpoint, step, tag, dtype, zero_stage, n_parameters, n_files, total_bytes, manifest_sha256, uri, created_at
FROM checkpoints
WHERE run_id = $run_id
ORDER BY step NULLS LAST, checkpoint
