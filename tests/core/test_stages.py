"""Stage plumbing that needs no model: pass-rate column names and the curriculum's id reconciliation."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlvr_core.data.curriculum import IdMismatchError, pass_rate_table
from rlvr_core.experiment.config import parse_config
from rlvr_core.pipeline import run_record, stages
from rlvr_core.pipeline.passrate_stage import normalise_passk_columns
from rlvr_core.records import warehouse


def test_pass_rate_columns_match_the_warehouse_schema():
    records = [{"problem_id": "p1", "correct": c, "status": s, "length": 5, "finish_reason": "stop"}
               for c, s in [(True, "correct"), (False, "incorrect"), (False, "no_answer"), (False, "timeout")]]
    table = normalise_passk_columns(pass_rate_table(records, ks=(1, 2, 4)))
    sql = warehouse.MIGRATIONS[0][2]
    # Every column the stage writes has a home in the warehouse table (else ingest drops it silently).
    for col in table.column_names:
        assert f"{col} " in sql, col
    row = table.to_pylist()[0]
    assert (row["n"], row["c"], row["n_correct"], row["n_no_answer"], row["n_timeout"]) == (4, 1, 1, 1, 1)
    assert row["pass_at_4"] == 1.0 and row["pass_at_1"] == pytest.approx(0.25)


def _artifacts(tmp_path, table_ids, data_ids):
    cfg = parse_config({})
    train = tmp_path / "train.jsonl"
    train.write_text("".join(f'{{"id": "{i}", "question": "q", "answer": "1"}}\n' for i in data_ids))
    data = stages.DataArtifact(str(train), str(train), "h-" + "-".join(data_ids), "t", len(data_ids), 0, False)
    rows = [{"problem_id": i, "n": 4, "c": k, "pass_rate": k / 4} for i, k in zip(table_ids, [1, 2, 3, 0, 4] * 10)]
    path = tmp_path / f"table-{len(table_ids)}.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    passrates = stages.PassRateArtifact(str(path), "", "tid-" + "-".join(table_ids), False, {})
    return cfg, data, passrates


def test_curriculum_orders_kept_prompts(rlvr_home, tmp_path):
    cfg, data, passrates = _artifacts(tmp_path, ["a", "b", "c", "d", "e"], ["a", "b", "c", "d", "e", "f"])
    cur = stages.curriculum_stage(cfg, data, passrates)
    table = pq.read_table(cur.path).to_pylist()
    # d (never solved) and e (always solved) dropped; easy → hard = highest pass rate first.
    assert [r["problem_id"] for r in table] == ["c", "b", "a"] and [r["position"] for r in table] == [0, 1, 2]
    again = stages.curriculum_stage(cfg, data, passrates)
    assert again.cached and again.curriculum_id == cur.curriculum_id


def test_curriculum_refuses_ids_the_data_lacks(rlvr_home, tmp_path):
    cfg, data, passrates = _artifacts(tmp_path, ["a", "b", "x1", "x2"], ["a", "b", "c"])
    with pytest.raises(IdMismatchError, match=r"2 of 4 .*x1"):
        stages.curriculum_stage(cfg, data, passrates)
    # Tolerance only by explicit setting.
    tolerant = parse_config({"curriculum": {"id_tolerance": 2}})
    with pytest.warns(UserWarning, match="dropping 2"):
        cur = stages.curriculum_stage(tolerant, data, passrates)
    # The tolerated ids are dropped, not trained on.
    assert sorted(pq.read_table(cur.path).column("problem_id").to_pylist()) == ["a", "b"]


def test_prepare_data_reads_real_gsm8k_through_the_loaders(rlvr_home):
    from rlvr_core.experiment.benchmarks import data_root

    gsm8k = data_root() / "gsm8k"
    if not gsm8k.is_dir():
        pytest.skip(f"shared data not found at {gsm8k} (set RLVR_DATA_DIR)")
    cfg = parse_config({"data": {"source": "gsm8k", "train_path": str(gsm8k / "train.jsonl"),
                                 "test_path": str(gsm8k / "test.jsonl")}})
    data = stages.prepare_data(cfg)
    assert (data.n_train, data.n_test) == (7473, 1319)
    first = data.test_rows()[0]
    # Janet's ducks: the gold answer is the number after "####", under a stable, documented id.
    assert first["answer"] == "18" and first["id"] == "gsm8k/test/0"
    again = stages.prepare_data(cfg)
    assert again.cached and again.train_hash == data.train_hash


def test_steps_long_keeps_every_numeric_metric(tmp_path):
    path = tmp_path / "steps.parquet"
    pq.write_table(pa.Table.from_pylist([
        {"step": 1, "reward_mean": 0.25, "lr": 1e-3, "guard": False, "note": "x", "kl_max": None},
        {"step": 2, "reward_mean": 0.5, "lr": 2e-3, "guard": True, "note": "y", "kl_max": 0.1},
    ]), path)
    rows = run_record.steps_long(path).to_pylist()
    assert rows == [{"step": 1, "metric": "reward_mean", "value": 0.25}, {"step": 2, "metric": "reward_mean", "value": 0.5},
                    {"step": 1, "metric": "lr", "value": 1e-3}, {"step": 2, "metric": "lr", "value": 2e-3},
                    {"step": 2, "metric": "kl_max", "value": 0.1}]
