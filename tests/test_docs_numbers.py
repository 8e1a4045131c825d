"""The numbers the README and docs quote for the demo and the sweeps are the ones benchmarks/docs_numbers.py last
recorded (docs/benchmarks/docs_numbers.json), and its rewrite of a quoted place does what it says: old text to new,
or a refusal naming the file when the doc no longer quotes the record. Nothing is measured here (seconds)."""

from __future__ import annotations

import copy
import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("docs_numbers", ROOT / "benchmarks" / "docs_numbers.py")
D = sys.modules.setdefault("docs_numbers", importlib.util.module_from_spec(_spec))  # a script, not a package
_spec.loader.exec_module(D)


@pytest.fixture(scope="module")
def record() -> dict:
    return D._load(ROOT / D.RECORD)


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    """A copy of every file the quotes name, at the same relative paths."""
    for f in {q.file for q in D.QUOTES}:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / f, tmp_path / f)
    return tmp_path


def test_every_quoted_number_is_the_recorded_one(record):
    problems = D.check(record)
    assert not problems, ("a doc quotes a number the record does not hold (re-measure with "
                          "`python benchmarks/docs_numbers.py`, or restore the quote):\n" + "\n".join(problems))


def test_every_quote_names_a_measurement_the_script_makes():
    assert {q.measurement for q in D.QUOTES} <= set(D.MEASUREMENTS)
    assert not (ROOT / D.PENDING).exists(), f"{D.PENDING} left behind: a measurement not applied to the docs"


def _tool(record: dict) -> dict:
    return record["measurements"]["tool-demo"]["values"]


def test_a_hand_edited_number_fails_the_check(record, docs):
    env = docs / "docs/environments.md"
    text, v = env.read_text(), _tool(record)
    quoted = f"**{v['trained_greedy']:.3f} [{v['trained_ci_low']:.3f}, {v['trained_ci_high']:.3f}]**"
    assert quoted in text  # the tool demo's trained accuracy, as recorded
    env.write_text(text.replace(quoted, quoted.replace(f"{v['trained_greedy']:.3f}", f"{v['trained_greedy'] + 0.01:.3f}")))
    problems = D.check(record, docs)
    assert len(problems) == 1 and problems[0].startswith("docs/environments.md: ") and "occurs 0 times" in problems[0]


def _changed(record: dict, name: str, **values) -> dict:
    new = {"measurements": {name: copy.deepcopy(record["measurements"][name])}}
    new["measurements"][name]["values"].update(values)
    return new


def test_the_rewrite_replaces_the_old_numbers_with_the_new(record, docs):
    before = {f: (docs / f).read_text() for f in ("README.md", "docs/environments.md", "docs/demo.md")}
    v = _tool(record)
    old_greedy, old_rate = f"{v['trained_greedy']:.3f}", f"{v['base_tool_call_rate']:.3g}"
    new = _changed(record, "tool-demo", trained_greedy=0.655, base_tool_call_rate=0.015, date="2027-01-02")
    changed = D.apply(record, new, docs)
    assert sorted(changed) == ["README.md", "docs/environments.md"]
    readme, env = (docs / "README.md").read_text(), (docs / "docs/environments.md").read_text()
    assert "greedy 0.000 -> 0.655," in readme and f"greedy 0.000 -> {old_greedy}," not in readme
    assert "tool-call rate 0.015 -> 1 (docs/environments.md)" in readme
    assert f"| **0.655 [{v['trained_ci_low']:.3f}, {v['trained_ci_high']:.3f}]** |" in env
    assert "Measured 2027-01-02 on this" in env
    # Only the quoted spans moved: the rest of each file is as it was, and an unquoted measurement's file untouched.
    restored = readme.replace("0.655,", f"{old_greedy},").replace("rate 0.015 ->", f"rate {old_rate} ->")
    assert restored == before["README.md"]
    assert (docs / "docs/demo.md").read_text() == before["docs/demo.md"]
    merged = D.merged(record, new)
    assert not D.check(merged, docs)
    assert D.check(record, docs)  # the old record no longer matches the rewritten copy


def test_the_rewrite_refuses_when_a_doc_no_longer_quotes_the_record(record, docs):
    readme = docs / "README.md"
    quoted = f"greedy 0.000 -> {_tool(record)['trained_greedy']:.3f},"
    assert quoted in readme.read_text()
    readme.write_text(readme.read_text().replace(quoted, quoted[:-2] + ","))
    before = {f: (docs / f).read_text() for f in ("README.md", "docs/environments.md")}
    with pytest.raises(D.QuoteError) as err:
        D.apply(record, _changed(record, "tool-demo", trained_greedy=0.655), docs)
    msg = str(err.value)
    assert "README.md: quote 'greedy {base_greedy:.3f} -> {trained_greedy:.3f},'" in msg and "nothing was rewritten" in msg
    assert {f: (docs / f).read_text() for f in before} == before  # neither file written


def test_finish_applies_the_pending_numbers_and_records_them(record, docs):
    (docs / D.RECORD).parent.mkdir(parents=True, exist_ok=True)
    D._save(docs / D.RECORD, record)
    D._save(docs / D.PENDING, _changed(record, "demo", trained_greedy=0.561, wall_s=400.4))
    assert D.finish(docs) == 0
    assert not (docs / D.PENDING).exists()
    saved = D._load(docs / D.RECORD)
    assert saved["measurements"]["demo"]["values"]["trained_greedy"] == 0.561
    assert saved["measurements"]["demo-native"] == record["measurements"]["demo-native"]
    assert "→ **0.561** [0.486, 0.622],\n  paired" in (docs / "docs/demo.md").read_text()
    assert "base pass@32 0.750, 400 s\n" in (docs / "docs/demo.md").read_text()


def _pivot(key: str, cells: list[tuple]) -> dict:
    """What `rlvr sweep show --json` prints: pivot_rows of sweep_pivot's rows (the flow's own converter)."""
    from rlvr_core.pipeline.sweeps import pivot_rows

    raw = [{key: v, "n_seeds": len(s), "mean": sum(s) / len(s), "ci_low": lo, "ci_high": hi, "ci_kind": "t over 3 seeds",
            "per_seed": list(s), "seeds": [0, 1, 2], "trial_ids": ["t00", "t01", "t02"]} for v, s, lo, hi in cells]
    return {"sweep_id": "demo-lr-0badcafe", "metric": "accuracy_greedy", "swept_keys": [key],
            "rows": pivot_rows(raw, [key])}


def test_sweep_values_are_what_the_pivot_prints():
    from rlvr_core.core.stats import wilson_interval
    from rlvr_core.pipeline.sweeps import format_pivot

    pivot = _pivot("grpo.lr", [(0.0003, (0.405, 0.38, 0.38), 0.352, 0.424), (3e-05, (0.045, 0.04, 0.04), 0.034, 0.049)])
    v = D.sweep_values(pivot, 200)
    printed = format_pivot(pivot["rows"], ["grpo.lr"], "accuracy_greedy").splitlines()
    assert v["pivot_table"] == "\n".join("    " + line for line in printed[:-1])
    assert v["lr=0_0003/per_seed"] == "0.405, 0.380, 0.380" and v["lr=3e-05/seeds"] == "0, 1, 2"
    assert v["lr=0_0003/seed_min"] == 0.38 and v["lr=3e-05/seed_max"] == 0.045
    assert v["lr=0_0003/wilson_low_min"] == wilson_interval(76, 200)[0]
    assert v["lr=3e-05/wilson_high_max"] == wilson_interval(9, 200)[1]
    assert v["min_mean"] == pytest.approx(0.125 / 3) and v["max_mean"] == pytest.approx(1.165 / 3)


def test_the_recorded_pivot_tables_are_the_recorded_cells(record):
    """A table the docs quote is what format_pivot prints for the cells recorded beside it, so the table and a
    mean quoted in prose cannot tell two stories."""
    for name, key in (("demo-lr", "grpo.lr"), ("demo-losses", "grpo.policy_loss")):
        v = record["measurements"][name]["values"]
        cells = sorted({k.split("/")[0] for k in v if "/" in k})
        rows = [(v[f"{c}/{key.split('.')[-1]}"], tuple(map(float, v[f"{c}/per_seed"].split(", "))),
                 v[f"{c}/ci_low"], v[f"{c}/ci_high"]) for c in cells]
        table = D.sweep_values(_pivot(key, rows), 200)["pivot_table"].splitlines()
        recorded = v["pivot_table"].splitlines()
        assert table[:2] == recorded[:2] and sorted(table[2:]) == sorted(recorded[2:]), name


def test_demo_values_read_the_summary_rlvr_demo_prints():
    s = {"mlflow_run_id": "abc", "n_eval": 200, "base_pass_at_1": 0.015, "base_pass_at_1_ci95": [0.005, 0.043],
         "trained_pass_at_1": 0.445, "trained_pass_at_1_ci95": [0.377, 0.515],
         "comparison": {"accuracy_greedy": {"delta": 0.43, "ci_low": 0.358, "ci_high": 0.502, "n": 200, "mcnemar_p": 7e-24}},
         "base_pass_at_k": {"1": 0.1, "32": 0.75}, "trained_pass_at_k": {"32": 0.8}, "duration_s": 300.0,
         "train": {"steps": 120}, "eval": {"environment": {"tool_call_rate": 0.0, "tool_call_rate_ci": [0.0, 0.019]}},
         "trained_eval": {}}
    v = D.demo_values(s)
    assert (v["delta_points"], v["base_pass_at_32"], v["trained_pass_at_32"], v["train_steps"]) == (43.0, 0.75, 0.8, 120)
    assert v["base_tool_call_ci_high"] == 0.019 and "trained_tool_call_rate" not in v
