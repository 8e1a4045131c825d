"""The warehouse is derived from run folders: idempotent ingest, full rebuild, one writer, JSON queries."""

import json
import multiprocessing as mp

import pyarrow as pa
import pytest

from rlvr_core.artifacts.storage import LocalStore, open_store
from rlvr_core.records import warehouse
from rlvr_core.records.runrecord import upload_run_folder, write_run_folder


def make_run(store, tmp_path, run_id: str, n_problems: int = 3):
    run = {"run_id": run_id, "experiment": "exp", "name": "t", "kind": "demo", "status": "FINISHED",
           "started_at": "2026-11-22 01:02:03", "duration_s": 1.5, "config_hash": "c" * 64, "git_dirty": False}
    table = pa.Table.from_pylist([{"problem_id": f"p{i}", "n": 8, "c": i, "pass_rate": i / 8, "pass_at_1": i / 8,
                                   "table_id": "t1", "unexpected_extra_column": 1} for i in range(n_problems)])
    samples = pa.Table.from_pylist([{"eval_id": "base", "benchmark": "synthetic", "problem_id": f"p{i}",
                                     "sample_index": 0, "status": "correct" if i % 2 else "incorrect", "reward": float(i % 2)}
                                    for i in range(n_problems)])
    metrics = pa.Table.from_pylist([{"eval_id": "base", "benchmark": "synthetic", "metric": "accuracy_greedy",
                                     "value": 0.5, "n": n_problems, "ci_low": 0.1, "ci_high": 0.9, "settings": "{}"}])
    local = write_run_folder(tmp_path / run_id, run=run, params={"grpo.lr": 0.001, "name": "t"}, manifest={},
                             config_yaml="", summary={}, tables={"passk/pass_rate_table.parquet": table,
                                                                 "evals/samples.parquet": samples,
                                                                 "evals/metrics.parquet": metrics})
    upload_run_folder(store, f"exp/{run_id}", local)


def counts(db):
    return {t: warehouse.query(f"select count(*) from {t}", path=db)[1][0][0]
            for t in ("runs", "run_params", "pass_rate_tables", "eval_samples", "eval_metrics")}


def test_ingest_is_idempotent_and_rebuild_matches(tmp_path):
    store = LocalStore(tmp_path / "store")
    db = tmp_path / "w.duckdb"
    make_run(store, tmp_path, "r1", 3)
    make_run(store, tmp_path, "r2", 5)
    assert warehouse.find_runs(store) == ["exp/r1", "exp/r2"]
    for prefix in warehouse.find_runs(store):
        warehouse.ingest_run(store, prefix, db)
    first = counts(db)
    assert first == {"runs": 2, "run_params": 4, "pass_rate_tables": 8, "eval_samples": 8, "eval_metrics": 2}
    warehouse.ingest_run(store, "exp/r1", db)  # re-ingest: same rows, no duplicates
    assert counts(db) == first
    rows = warehouse.query_records("select run_id, problem_id, c, pass_at_1, pass_at_8 from pass_rate_tables "
                                   "where run_id = 'r1' order by problem_id", path=db)
    assert rows == [{"run_id": "r1", "problem_id": f"p{i}", "c": i, "pass_at_1": i / 8, "pass_at_8": None}
                    for i in range(3)]
    db.unlink()
    (tmp_path / "w.duckdb.lock").unlink()
    warehouse.rebuild(store, db)
    assert counts(db) == first
    assert warehouse.query("select max(version) from schema_migrations", path=db)[1][0][0] == warehouse.MIGRATIONS[-1][0]


def test_records_are_json_safe(tmp_path):
    store = LocalStore(tmp_path / "store")
    make_run(store, tmp_path, "r1")
    db = tmp_path / "w.duckdb"
    warehouse.ingest_run(store, "exp/r1", db)
    recs = warehouse.query_records("select run_id, started_at, git_dirty, duration_s, 'nan'::double as x from runs", path=db)
    assert recs == [{"run_id": "r1", "started_at": "2026-11-22T01:02:03", "git_dirty": False, "duration_s": 1.5, "x": None}]
    json.dumps(recs)


def test_reader_is_read_only_and_missing_file_is_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="rlvr demo"):
        warehouse.query("select 1", path=tmp_path / "none.duckdb")
    store = LocalStore(tmp_path / "store")
    make_run(store, tmp_path, "r1")
    db = tmp_path / "w.duckdb"
    warehouse.ingest_run(store, "exp/r1", db)
    import duckdb

    with pytest.raises(duckdb.Error):
        warehouse.query("delete from runs", path=db)
    assert counts(db)["runs"] == 1


def _ingest(args):
    root, db, prefix = args
    return warehouse.ingest_run(LocalStore(root), prefix, db)


def test_concurrent_writers_wait_for_the_lock(tmp_path):
    store = LocalStore(tmp_path / "store")
    for i in range(4):
        make_run(store, tmp_path, f"r{i}")
    db = tmp_path / "w.duckdb"
    with mp.get_context("spawn").Pool(4) as pool:
        pool.map(_ingest, [(str(store.root), str(db), f"exp/r{i}") for i in range(4)])
    assert counts(db)["runs"] == 4 and counts(db)["pass_rate_tables"] == 12


def test_ingest_from_s3(s3_env, tmp_path):
    endpoint, bucket = s3_env
    store = open_store(f"s3://{bucket}/artifacts", endpoint_url=endpoint)
    make_run(store, tmp_path, "r1", 4)
    db = tmp_path / "w.duckdb"
    warehouse.rebuild(store, db)
    assert counts(db)["pass_rate_tables"] == 4


def test_limit_with_scalar_subquery_is_honoured(tmp_path):
    # duckdb 2.0.0 returned every row for this shape of query; the pin in pyproject.toml keeps us off it.
    store = LocalStore(tmp_path / "store")
    make_run(store, tmp_path, "r1", n_problems=6)
    db = tmp_path / "w.duckdb"
    warehouse.ingest_run(store, "exp/r1", db)
    rows = warehouse.query_records(
        "select problem_id from pass_rate_tables where run_id = (select max(run_id) from runs) limit 2", path=db)
    assert len(rows) == 2


# ----------------------------------------------------------------------------------- migrations 4-8
def make_trained_run(store, tmp_path, run_id: str, *, firings_file: bool = True, steps: int = 6):
    """A GRPO run folder: step metrics (health flags included), rollouts, guard firings, an export, probes."""
    run = {"run_id": run_id, "experiment": "exp", "kind": "trial", "status": "FINISHED",
           "tags": {"collapsed": "true", "sweep": "lr"}}
    steps_long = pa.Table.from_pylist(
        [{"step": s, "metric": m, "value": v} for s in range(1, steps + 1)
         for m, v in (("reward_mean", s / 10), ("health/G-collapse", float(s == 5)), ("health/G-entropy", float(s >= 4)))])
    firings = [{"guard_id": "G-entropy", "step": 4, "serious": False, "reason": "entropy low", "evidence": {"median": 0.1}},
               {"guard_id": "G-collapse", "step": 5, "serious": True, "reason": "collapsed", "evidence": {"signals": 3},
                "key": ""}]
    rollouts = pa.Table.from_pylist([{"step": s, "position": s, "prompt_id": f"p{s}", "sample_index": 0, "prompt": "q",
                                      "completion": "#### 1", "reward": 1.0, "status": "correct", "length": 3,
                                      "finish_reason": "stop", "overlong_penalty": 0.0, "advantage": 0.5}
                                     for s in range(1, steps + 1)])
    tokens = pa.Table.from_pylist([{"problem_id": "p1", "checkpoint_a": "base", "checkpoint_b": "final", "position": i,
                                    "token_id": i, "token_text": "x", "category": "number", "kl_ab": 0.1, "kl_ba": 0.2,
                                    "kl_sym": 0.3, "is_spike": i == 0} for i in range(4)])
    per_checkpoint = pa.Table.from_pylist([{"probe_id": "explicit", "checkpoint": "final", "step": steps,
                                            "metric": "kl_ba", "mean_kl": 0.3, "n_tokens": 4}])
    tables = {"train/steps_long.parquet": steps_long, "train/rollouts.parquet": rollouts,
              "probes/kl/probe_tokens.parquet": tokens, "probe/probe_checkpoints.parquet": per_checkpoint}
    if firings_file:
        tables["train/health_events.parquet"] = warehouse.health_events_table(firings)
    local = write_run_folder(tmp_path / run_id, run=run, params={"grpo.lr": 1e-5}, manifest={}, config_yaml="",
                             summary={}, tables=tables)
    ck = local / "checkpoints" / "final"
    ck.mkdir(parents=True)
    (ck / "export_manifest.json").write_text(json.dumps(
        {"step": steps, "tag": f"step{steps}", "dtype": "bfloat16", "zero_stage": 3, "created_at": "2026-11-22T01:02:03Z",
         "model": {"class": "Qwen2ForCausalLM", "n_parameters": 1000},
         "files": [{"path": "model.safetensors", "size": 4000, "sha256": "0" * 64},
                   {"path": "config.json", "size": 50, "sha256": "1" * 64}]}))
    upload_run_folder(store, f"exp/{run_id}", local)
    return local


def test_new_tables_are_ingested(tmp_path):
    store = LocalStore(tmp_path / "store")
    make_trained_run(store, tmp_path, "g1")
    db = tmp_path / "w.duckdb"
    counts = warehouse.ingest_run(store, "exp/g1", db)
    assert {t: counts[t] for t in ("health_events", "rollout_samples", "checkpoints", "probe_tokens",
                                   "probe_checkpoints", "probe_problems", "run_tags", "train_steps")} == {
        "health_events": 2, "rollout_samples": 6, "checkpoints": 1, "probe_tokens": 4, "probe_checkpoints": 1,
        "probe_problems": 0, "run_tags": 2, "train_steps": 18}
    ev = warehouse.query_records("select step, guard_id, serious, reason, evidence, source from health_events "
                                 "order by step", path=db)
    assert ev == [{"step": 4, "guard_id": "G-entropy", "serious": False, "reason": "entropy low",
                   "evidence": '{"median": 0.1}', "source": "firings"},
                  {"step": 5, "guard_id": "G-collapse", "serious": True, "reason": "collapsed",
                   "evidence": '{"signals": 3}', "source": "firings"}]
    (ck,) = warehouse.query_records("select * from checkpoints", path=db)
    assert ck["checkpoint"] == "final" and ck["step"] == 6 and ck["total_bytes"] == 4050 and ck["n_files"] == 2
    assert ck["uri"] == store.url("exp/g1/checkpoints/final") and ck["n_parameters"] == 1000
    assert ck["manifest_sha256"] == store.sha256("exp/g1/checkpoints/final/export_manifest.json")
    probes = warehouse.query("select distinct probe_id from probe_tokens union all "
                             "select distinct probe_id from probe_checkpoints", path=db)[1]
    assert probes == [("kl",), ("explicit",)]  # folder name when the file has no probe_id column
    tags = warehouse.query("select key, value from run_tags order by key", path=db)[1]
    assert tags == [("collapsed", "true"), ("sweep", "lr")]


def test_health_events_fall_back_to_step_flags(tmp_path):
    store = LocalStore(tmp_path / "store")
    make_trained_run(store, tmp_path, "g2", firings_file=False)
    db = tmp_path / "w.duckdb"
    warehouse.ingest_run(store, "exp/g2", db)
    rows = warehouse.query("select step, guard_id, serious, source from health_events order by step, guard_id", path=db)[1]
    # health/G-collapse at step 5; health/G-entropy at steps 4..6 (value > 0), none at value 0
    assert rows == [(4, "G-entropy", None, "train_steps"), (5, "G-collapse", None, "train_steps"),
                    (5, "G-entropy", None, "train_steps"), (6, "G-entropy", None, "train_steps")]


def all_counts(db):
    return {t: warehouse.query(f"select count(*) from {t}", path=db)[1][0][0] for t in ("runs", *warehouse.RUN_TABLES)}


def test_unchanged_runs_are_skipped_changed_ones_reingested(tmp_path):
    store = LocalStore(tmp_path / "store")
    make_trained_run(store, tmp_path, "g1")
    make_run(store, tmp_path, "r1", 3)
    db = tmp_path / "w.duckdb"
    first = warehouse.ingest_all(store, db)
    assert first["ingested"] == ["g1", "r1"] and first["skipped"] == []
    before = all_counts(db)
    again = warehouse.ingest_all(store, db)
    assert again["ingested"] == [] and again["skipped"] == ["g1", "r1"] and again["rows"] == first["rows"]
    assert all_counts(db) == before
    forced = warehouse.ingest_all(store, db, force=True)
    assert forced["ingested"] == ["g1", "r1"] and all_counts(db) == before
    # New content for r1 (5 problems instead of 3): re-ingested, its old rows replaced.
    make_run(store, tmp_path / "v2", "r1", 5)
    third = warehouse.ingest_all(store, db)
    assert third["ingested"] == ["r1"] and third["skipped"] == ["g1"]
    assert all_counts(db)["pass_rate_tables"] == 5
    # A report written into the run folder later is not an input: the run stays skipped.
    store.put_text("exp/r1/reports/index.html", "<html></html>")
    assert warehouse.ingest_all(store, db)["skipped"] == ["g1", "r1"]


def test_interrupted_ingest_resumes(tmp_path):
    store = LocalStore(tmp_path / "store")
    for rid in ("a1", "a2", "a3"):
        make_run(store, tmp_path, rid)
    good = store.get_bytes("exp/a3/evals/samples.parquet")
    store.put_bytes("exp/a3/evals/samples.parquet", b"not parquet")
    db = tmp_path / "w.duckdb"
    with pytest.raises(warehouse.IngestError, match=r"exp/a3/evals/samples\.parquet: not a readable Parquet file"):
        warehouse.ingest_all(store, db)
    assert warehouse.query("select run_id from runs order by run_id", path=db)[1] == [("a1",), ("a2",)]
    store.put_bytes("exp/a3/evals/samples.parquet", good)
    resumed = warehouse.ingest_all(store, db)
    assert resumed["skipped"] == ["a1", "a2"] and resumed["ingested"] == ["a3"]
    assert all_counts(db)["eval_samples"] == 9


def test_bad_files_name_the_file_and_field(tmp_path):
    store = LocalStore(tmp_path / "store")
    make_run(store, tmp_path, "r1")
    db = tmp_path / "w.duckdb"
    # A required column missing: the file and the column are named.
    store.put_bytes("exp/r1/evals/samples.parquet", _parquet_bytes([{"eval_id": "e", "benchmark": "b", "sample_index": 0}]))
    with pytest.raises(warehouse.IngestError, match=r"exp/r1/evals/samples\.parquet: column 'problem_id' is missing "
                                                     r"\(required by warehouse table eval_samples"):
        warehouse.ingest_run(store, "exp/r1", db)
    # A value that does not cast: the file and the table are named.
    store.put_bytes("exp/r1/evals/samples.parquet", _parquet_bytes(
        [{"eval_id": "e", "benchmark": "b", "problem_id": "p", "sample_index": "first"}]))
    with pytest.raises(warehouse.IngestError, match=r"exp/r1/evals/samples\.parquet: cannot load into warehouse table "
                                                     r"eval_samples.*first"):
        warehouse.ingest_run(store, "exp/r1", db)
    store.put_text("exp/r2/run.json", json.dumps({"experiment": "exp"}))
    with pytest.raises(warehouse.IngestError, match=r"exp/r2/run\.json: field 'run_id' is missing"):
        warehouse.ingest_run(store, "exp/r2", db)
    store.put_text("exp/r3/run.json", json.dumps({"run_id": "r3", "experiment": "exp"}))
    store.put_text("exp/r3/checkpoints/final/export_manifest.json", json.dumps({"step": 1}))
    with pytest.raises(warehouse.IngestError, match=r"exp/r3/checkpoints/final/export_manifest\.json: field 'files'"):
        warehouse.ingest_run(store, "exp/r3", db)
    with pytest.raises(warehouse.IngestError, match=r"exp/none/run\.json: no run\.json"):
        warehouse.ingest_run(store, "exp/none", db)
    assert warehouse.query("select count(*) from runs", path=db)[1] == [(0,)]  # nothing half-written


def _parquet_bytes(rows):
    import io

    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    return buf.getvalue()


def test_rebuild_resumes_and_prunes(tmp_path):
    store = LocalStore(tmp_path / "store")
    make_run(store, tmp_path, "r1")
    make_run(store, tmp_path, "r2")
    db = tmp_path / "w.duckdb"
    # A rebuild interrupted after r1 and r0 (a run since deleted from the store) left its partial file.
    partial = db.with_name(db.name + ".rebuild")
    warehouse.ingest_run(store, "exp/r1", partial)
    make_run(store, tmp_path, "r0")
    warehouse.ingest_run(store, "exp/r0", partial)
    for f in store.list("exp/r0"):
        (store.root / f).unlink()
    warehouse.rebuild(store, db)
    assert not partial.exists()
    assert warehouse.query("select run_id from runs order by run_id", path=db)[1] == [("r1",), ("r2",)]
    log = warehouse.query("select run_id from ingest_log order by run_id", path=db)[1]
    assert log == [("r1",), ("r2",)]


def test_new_tables_from_s3(s3_env, tmp_path):
    endpoint, bucket = s3_env
    store = open_store(f"s3://{bucket}/artifacts", endpoint_url=endpoint)
    make_trained_run(store, tmp_path, "g1")
    db = tmp_path / "w.duckdb"
    first = warehouse.ingest_all(store, db)
    assert first["rows"]["checkpoints"] == 1 and first["rows"]["rollout_samples"] == 6
    assert warehouse.query("select uri from checkpoints", path=db)[1] == [(f"s3://{bucket}/artifacts/exp/g1/checkpoints/final",)]
    assert warehouse.ingest_all(store, db)["skipped"] == ["g1"]
    local = LocalStore(tmp_path / "local-copy")
    make_trained_run(local, tmp_path / "again", "g1")
    db2 = tmp_path / "w2.duckdb"
    warehouse.ingest_all(local, db2)
    cols = "step, guard_id, serious, reason, evidence"
    assert warehouse.query(f"select {cols} from health_events order by step", path=db)[1] == \
        warehouse.query(f"select {cols} from health_events order by step", path=db2)[1]


def test_a_bad_run_in_a_batch_keeps_the_good_ones_before_it(tmp_path):
    store = LocalStore(tmp_path / "store")
    for rid in ("b1", "b2", "b3"):
        make_run(store, tmp_path, rid)
    good = store.get_bytes("exp/b2/evals/samples.parquet")
    # Readable Parquet whose values do not cast: found by DuckDB mid-batch, not while reading the files.
    store.put_bytes("exp/b2/evals/samples.parquet", _parquet_bytes(
        [{"eval_id": "e", "benchmark": "b", "problem_id": "p", "sample_index": "first"}]))
    db = tmp_path / "w.duckdb"
    with pytest.raises(warehouse.IngestError, match=r"exp/b2/evals/samples\.parquet: cannot load"):
        warehouse.ingest_all(store, db)  # all three fit in one batch
    assert warehouse.query("select run_id from ingest_log order by run_id", path=db)[1] == [("b1",)]
    store.put_bytes("exp/b2/evals/samples.parquet", good)
    resumed = warehouse.ingest_all(store, db)
    assert resumed["skipped"] == ["b1"] and resumed["ingested"] == ["b2", "b3"]
    # Committing every run on its own (batch_rows=1) gives the same warehouse.
    db1 = tmp_path / "w1.duckdb"
    warehouse.ingest_all(store, db1, batch_rows=1)
    assert all_counts(db1) == all_counts(db)


# ----------------------------------------------------------------------------------- migration 9
def test_evaluator_columns_survive_ingestion(tmp_path):
    """Every column the evaluator writes (rlvr_core/eval/evaluate.py) lands in the warehouse with its value, for a
    real evaluation of a tiny model (few warm-start steps: its answers are poor, which is fine here)."""
    import pyarrow.parquet as pq

    from rlvr_core.experiment.benchmarks import load_benchmark
    from rlvr_core.data.synthetic import SyntheticSpec, make_synthetic_dataset
    from rlvr_core.eval.evaluate import RunSettings, evaluate
    from rlvr_core.eval.metrics import CURVES_FILE, METRICS_FILE, SAMPLES_FILE
    from rlvr_core.tiny.warmstart import WarmStartSpec, warm_start

    rows = make_synthetic_dataset(SyntheticSpec(n_train=64, n_test=4, seed=0))["train"]
    ckpt = warm_start(rows, tmp_path / "ckpt", WarmStartSpec(steps=3, batch_size=8, hidden_size=32, num_layers=1,
                                                             heads=2, warmup_steps=1, num_threads=1))
    run_dir = tmp_path / "run"
    evaluate(ckpt, [load_benchmark("synthetic")], out=run_dir, max_problems=3, n=2, eval_id="e1",
             run=RunSettings(verifier_workers=0))
    (run_dir / "run.json").write_text(json.dumps({"run_id": "ev1", "experiment": "exp"}))
    store = LocalStore(tmp_path / "store")
    upload_run_folder(store, "exp/ev1", run_dir)
    db = tmp_path / "w.duckdb"
    warehouse.ingest_run(store, "exp/ev1", db)

    for table, name, key in (("eval_samples", SAMPLES_FILE, ("greedy", "sample_index", "problem_id")),
                             ("eval_metrics", METRICS_FILE, ("metric",)),
                             ("passk_curves", CURVES_FILE, ("source", "k"))):
        written = pq.read_table(run_dir / name)
        cols = written.column_names
        # Nothing the evaluator writes is dropped (the extras of migration 9 included) ...
        assert not set(cols) - set(warehouse.query(f"select * from {table} limit 0", path=db)[0]), table
        # ... and every value comes back exactly as written (JSON columns as their text; DOUBLE holds float64).
        stored = warehouse.query_records(f"select {', '.join(cols)} from {table} where run_id = 'ev1'", path=db)
        order = lambda r: tuple(r[k] for k in key)  # noqa: E731
        assert sorted(stored, key=order) == sorted(written.to_pylist(), key=order), table
    # The check above covers the new columns with real values, not NULLs (ifeval's instruction counts aside).
    (row,) = warehouse.query_records(
        "select count(benchmark_hash) as benchmark_hash, count(seed) as seed, count(top_p) as top_p, count(engine) as engine, count(scoring) as scoring, "
        "count(continued_after_answer) as continued, count(meta) as meta, "
        "count(json_extract(side_by_side, '$.\"gsm8k:strict\".status')) as sbs, count(*) as n from eval_samples", path=db)
    assert row == dict.fromkeys(row, 3 * (1 + 2)), row  # 3 problems × (greedy + 2 samples), every one filled
