"""`rlvr eval` / `rlvr compare` as a user runs them (subprocesses), recording runs into a real artifact store
and DuckDB warehouse, and comparing by folder and by run id."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def cli(home: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PREFECT_", "RLVR_"))}
    env.update({"RLVR_HOME": str(home), "OMP_NUM_THREADS": "1"})
    return subprocess.run([sys.executable, "-m", "rlvr_cli.eval", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def evals(tiny_checkpoints, tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    weak, strong = tiny_checkpoints
    common = ["--benchmark", "synthetic", "--max-problems", "16", "--n", "4", "--quiet", "--json"]
    out = {}
    # Verifier worker processes for one run (the default); in-process for the others (faster, same outcomes).
    for name, ckpt, extra in (("weak", weak, ["--record"]), ("strong", strong, ["--record", "--verifier-workers", "0"]),
                              ("strong24", strong, ["--max-new-tokens", "24", "--verifier-workers", "0"])):
        proc = cli(home, "eval", str(ckpt), *common, *extra, "--eval-id", name, "--out", str(home / name))
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    return home, out


def test_eval_prints_and_records(evals):
    home, out = evals
    s = out["weak"]["benchmarks"]["synthetic"]
    assert s["n"] == 16 and set(s["passk"]) == {"1", "2", "4"} and 0 <= s["accuracy_greedy"] <= 1
    from rlvr_core.records.warehouse import query_records

    rows = query_records("select count(*) as n, avg(case when status = 'correct' then 1.0 else 0 end) as acc "
                         "from eval_samples where greedy and run_id = ?", [out["weak"]["run"]["run_id"]],
                         path=home / "warehouse.duckdb")
    assert rows == [{"n": 16, "acc": pytest.approx(s["accuracy_greedy"])}]
    kinds = query_records("select kind, count(*) as n from runs group by kind", path=home / "warehouse.duckdb")
    assert kinds == [{"kind": "eval", "n": 2}]


def test_compare_folders_and_run_ids(evals):
    home, out = evals
    proc = cli(home, "compare", str(home / "weak"), str(home / "strong"), "--json", "--out", str(home / "cmp"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    r = res["benchmarks"]["synthetic"]
    a, b = out["weak"]["benchmarks"]["synthetic"], out["strong"]["benchmarks"]["synthetic"]
    d = r["deltas"]["accuracy_greedy"]
    assert (d["a"], d["b"]) == (a["accuracy_greedy"], b["accuracy_greedy"])
    assert d["delta"] == pytest.approx(b["accuracy_greedy"] - a["accuracy_greedy"])
    assert d["a_only"] == len(r["solved_greedy"]["a_only"]) and d["b_only"] == len(r["solved_greedy"]["b_only"])
    assert r["passk_curves"]["a"]["4"] == pytest.approx(a["passk"]["4"])
    assert sum(r["solvable_overlap"].values()) == 16 and sum(r["pass_rate_histogram"]["b"].values()) == 16
    assert (home / "cmp" / "comparison.md").read_text().startswith("# strong#strong vs weak#weak")
    # The same comparison from the artifact store, by run id (and by EXPERIMENT/RUN_ID#EVAL_ID).
    ra, rb = out["weak"]["run"], out["strong"]["run"]
    proc = cli(home, "compare", ra["run_id"], f"{rb['prefix']}#strong", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["benchmarks"]["synthetic"]["deltas"] == r["deltas"]


def test_compare_refuses_different_settings(evals):
    home, _ = evals
    proc = cli(home, "compare", str(home / "weak"), str(home / "strong24"))
    assert proc.returncode == 2
    assert "settings differ" in proc.stderr and "synthetic: max_new_tokens: A=48 B=24" in proc.stderr
    assert "benchmark_hash" in proc.stderr
    proc = cli(home, "compare", str(home / "weak"), str(home / "strong24"), "--allow-different-settings")
    assert proc.returncode == 0 and "COMPARING ANYWAY" in proc.stderr
    assert "WARNING: the settings differ" in proc.stdout


def test_bad_input_is_named(evals, tmp_path):
    home, _ = evals
    proc = cli(home, "eval", str(tmp_path), "--benchmark", "synthetic")
    assert proc.returncode == 2 and "no config.json" in proc.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nversion: 1\n")
    (tmp_path / "config.json").write_text("{}")
    proc = cli(home, "eval", str(tmp_path), "--benchmark", str(bad))
    assert proc.returncode == 2 and f"{bad}: data: Field required" in proc.stderr
    proc = cli(home, "eval", str(tmp_path), "--benchmark", "nosuch")
    assert proc.returncode == 2 and "no benchmark named 'nosuch'" in proc.stderr
    proc = cli(home, "compare", str(home / "weak"), str(tmp_path))
    assert proc.returncode == 2 and "no evals/samples.parquet" in proc.stderr
