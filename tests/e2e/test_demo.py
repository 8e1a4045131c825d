"""`rlvr demo` end to end through the real CLI: ephemeral Prefect, MLflow on sqlite, DuckDB, local artifacts.

Runs a reduced demo (fewer problems and warm-start steps) so the suite stays within CI's budget; the
full demo's numbers are measured by `make demo` and recorded in docs/demo.md.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

SMALL = [
    "--set", "data.synthetic.n_train=400", "--set", "data.synthetic.n_test=60",
    "--set", "model.warm_start.steps=150", "--set", "passk.max_prompts=24", "--set", "eval.n_samples=4",
    "--set", "passk.n_samples=4", "--set", "passk.ks=[1,2,4]", "--set", "tracking.experiment=e2e",
    "--set", "grpo.enabled=false",  # the demo trains by default; the GRPO test below turns it back on, small
    # The demo shuffles its prompts; easy-to-hard is set here because its order is checkable from the table.
    "--set", "curriculum.strategy=easy_to_hard",
]


def rlvr(home: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PREFECT_", "RLVR_"))}
    env["RLVR_HOME"] = str(home)
    exe = Path(sys.executable).parent / "rlvr"
    return subprocess.run([str(exe), *args], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def demo_runs(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    first = rlvr(home, "demo", "--json", *SMALL)
    assert first.returncode == 0, first.stderr[-4000:]
    second = rlvr(home, "demo", "--json", *SMALL)
    assert second.returncode == 0, second.stderr[-4000:]
    return home, json.loads(first.stdout.strip().splitlines()[-1]), json.loads(second.stdout.strip().splitlines()[-1]), first


def test_summary_json_has_the_promised_fields(demo_runs):
    home, s, _, proc = demo_runs
    for key in ("base_pass_at_1", "n_eval", "mlflow_run_id", "warehouse_path", "artifact_uri", "duration_s"):
        assert key in s
    assert s["n_eval"] == 60
    lo, hi = s["base_pass_at_1_ci95"]
    assert 0 <= lo <= s["base_pass_at_1"] <= hi <= 1
    # pass@k is non-decreasing in k (a property of the unbiased estimator averaged over problems).
    curve = [s["base_pass_at_k"][k] for k in sorted(s["base_pass_at_k"], key=int)]
    assert curve == sorted(curve)
    assert "summary" in proc.stderr and "greedy accuracy" in proc.stderr  # the readable summary


def test_second_run_reuses_cached_stages(demo_runs):
    _, first, second, _ = demo_runs
    assert first["cached"] == {"data": False, "base_model": False, "pass_rate_table": False, "curriculum": False}
    assert second["cached"] == {"data": True, "base_model": True, "pass_rate_table": True, "curriculum": True}
    assert second["duration_s"] < first["duration_s"]
    # Same inputs, same seeds: the evaluation reproduces exactly.
    assert second["base_pass_at_1"] == first["base_pass_at_1"] and second["base_pass_at_k"] == first["base_pass_at_k"]


def test_warehouse_answers_about_the_runs(demo_runs):
    home, first, second, _ = demo_runs
    q = rlvr(home, "warehouse", "query", "select run_id, kind, status from runs order by started_at", "--json")
    assert q.returncode == 0, q.stderr
    rows = json.loads(q.stdout)
    assert {r["run_id"] for r in rows} == {first["mlflow_run_id"], second["mlflow_run_id"]}
    assert all(r["kind"] == "demo" and r["status"] == "FINISHED" for r in rows)
    q = rlvr(home, "warehouse", "query",
             f"select count(*) as n, sum(c) as c, sum(n) as total from pass_rate_tables where run_id = '{first['mlflow_run_id']}'", "--json")
    (row,) = json.loads(q.stdout)
    assert row["n"] == 24 and row["total"] == 24 * 4
    # Status counts made it into the warehouse and agree with c.
    q = rlvr(home, "warehouse", "query", "select sum(n_correct) = sum(c) as ok, count(n_correct) as k "
             f"from pass_rate_tables where run_id = '{first['mlflow_run_id']}'", "--json")
    assert json.loads(q.stdout) == [{"ok": True, "k": 24}]
    # The demo drops only the always-solved prompts: the curriculum is exactly the prompts with c < n
    # (never-solved ones included, last), easiest first.
    q = rlvr(home, "warehouse", "query", "select problem_id from pass_rate_tables "
             f"where run_id = '{first['mlflow_run_id']}' and c < n order by problem_id", "--json")
    not_always = [r["problem_id"] for r in json.loads(q.stdout)]
    q = rlvr(home, "warehouse", "query", "select c.problem_id, c.position, c.pass_rate from curricula c "
             f"where c.run_id = '{first['mlflow_run_id']}' order by c.position", "--json")
    cur = json.loads(q.stdout)
    assert len(cur) == first["curriculum"]["n_prompts"] == first["pass_rates"]["n_kept"]
    assert sorted(r["problem_id"] for r in cur) == not_always
    assert all(r["pass_rate"] < 1 for r in cur) and cur[-1]["pass_rate"] == 0
    assert [r["pass_rate"] for r in cur] == sorted((r["pass_rate"] for r in cur), reverse=True)
    # The warehouse's greedy accuracy is recomputable from its own per-sample rows.
    q = rlvr(home, "warehouse", "query",
             "select avg(case when status = 'correct' then 1.0 else 0.0 end) as acc, count(*) as n from eval_samples "
             f"where run_id = '{first['mlflow_run_id']}' and greedy", "--json")
    (row,) = json.loads(q.stdout)
    assert row["n"] == 60 and row["acc"] == pytest.approx(first["base_pass_at_1"])


def test_passk_command_is_served_from_the_cache(demo_runs):
    home, first, _, _ = demo_runs
    proc = rlvr(home, "passk", "--json", *SMALL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads(proc.stdout.strip().splitlines()[-1])
    assert s["cached"] is True and s["n_kept"] == first["pass_rates"]["n_kept"]
    manifest = json.loads((Path(s["table_path"]).parent / "manifest.json").read_text())
    assert manifest["n_problems"] == 24 and manifest["template"] == "qa@1" and manifest["verifier_version"]


def test_mlflow_and_artifacts_hold_the_run(demo_runs):
    home, s, _, _ = demo_runs
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow' / 'mlflow.db'}")
    run = client.get_run(s["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.metrics["eval/synthetic/accuracy_greedy"] == pytest.approx(s["base_pass_at_1"])
    assert run.data.tags["config_hash"] == s["config_hash"]
    assert run.data.params["eval.verifier"] == "gsm8k"
    names = {a.path for a in client.list_artifacts(s["mlflow_run_id"])}
    assert {"config.yaml", "manifest.json", "run.json"} <= names
    # One child run per stage under the demo's parent run.
    children = client.search_runs([run.info.experiment_id], f"tags.mlflow.parentRunId = '{s['mlflow_run_id']}'")
    assert {c.info.run_name for c in children} == {"data", "base-model", "passk", "curriculum", "evaluate-base"}
    assert (Path(s["artifact_uri"]) / "index.html").is_file()
    run_dir = Path(s["artifact_uri"])
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["config_hash"] == s["config_hash"] and manifest["prompt_template"] == "qa@1"
    assert set(manifest["datasets"]) == {"train", "test"} and manifest["model"]["hash"]
    # The base model reloads like any hub model from the cache folder the manifest names.
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(manifest["model"]["path"], local_files_only=True)


def test_bad_config_fails_before_any_run(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("grpo:\n  learning_rate: 0.1\n")
    home = tmp_path / "home"
    proc = rlvr(home, "demo", "-c", str(bad), timeout=120)
    assert proc.returncode == 2
    assert f"{bad}: grpo.learning_rate: unknown key" in proc.stderr
    # Nothing left behind: no MLflow store, no warehouse, no artifacts.
    assert not (home / "mlflow" / "mlflow.db").exists() and not (home / "warehouse.duckdb").exists()
    assert not (home / "artifacts").exists() or not any((home / "artifacts").iterdir())
    proc = rlvr(home, "config", "validate", str(tmp_path / "missing.yaml"), timeout=120)
    assert proc.returncode == 2 and "no such file" in proc.stderr


def test_demo_with_grpo_records_training_and_the_trained_eval(demo_runs):
    home, first, _, _ = demo_runs
    grpo = ["--set", "grpo.enabled=true", "--set", "grpo.steps=3", "--set", "grpo.prompts_per_step=2",
            "--set", "grpo.group_size=4", "--set", "grpo.checkpoint_every=2", "--set", "grpo.eval_every=2",
            "--set", "grpo.eval_samples=2"]
    proc = rlvr(home, "demo", "--json", *SMALL, *grpo)
    assert proc.returncode == 0, proc.stderr[-4000:]
    s = json.loads(proc.stdout.strip().splitlines()[-1])
    # Base numbers are the cached stages' numbers; the trained model is evaluated the same way.
    assert s["base_pass_at_1"] == first["base_pass_at_1"] and s["n_eval"] == 60
    lo, hi = s["trained_pass_at_1_ci95"]
    assert 0 <= lo <= s["trained_pass_at_1"] <= hi <= 1
    assert s["delta_pass_at_1"] == pytest.approx(s["trained_pass_at_1"] - s["base_pass_at_1"])
    run = s["mlflow_run_id"]
    q = rlvr(home, "warehouse", "query", "select count(distinct step) as steps, count(*) > 3 as many from train_steps "
             f"where run_id = '{run}'", "--json")
    assert json.loads(q.stdout) == [{"steps": 3, "many": True}]
    q = rlvr(home, "warehouse", "query", "select eval_id, count(*) as n from eval_samples "
             f"where run_id = '{run}' and greedy group by eval_id order by eval_id", "--json")
    assert json.loads(q.stdout) == [{"eval_id": "base", "n": 60}, {"eval_id": "trained", "n": 60}]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow' / 'mlflow.db'}")
    # Per-step training numbers live on the pipeline's `train` child run (docs/tracking.md).
    train_run = s["mlflow_child_run_ids"]["train"]
    assert client.get_run(train_run).data.tags["mlflow.parentRunId"] == run
    history = sorted(client.get_metric_history(train_run, "train/reward_mean"), key=lambda m: m.step)
    assert [m.step for m in history] == [1, 2, 3]
    # Sent while training ran (StepMetricsSink), each step at the time it finished: not one shared stamp.
    stamps = [m.timestamp for m in history]
    assert len(set(stamps)) == 3 and stamps == sorted(stamps)
    # The periodic held-out evaluation (every 2 steps and after the last) uses the final evaluation's
    # problems, prompts, decoding and verifier: its last point is exactly the trained model's score.
    curve = {m.step: m.value for m in client.get_metric_history(train_run, "train/eval/greedy_pass_at_1")}
    assert sorted(curve) == [2, 3]
    assert curve[3] == pytest.approx(s["trained_pass_at_1"], abs=1e-12)
    assert {m.step for m in client.get_metric_history(train_run, "train/eval/pass_at_2")} == {2, 3}
    assert client.get_run(run).data.metrics["eval/synthetic/trained/accuracy_greedy"] == pytest.approx(
        s["trained_pass_at_1"])
    # The run lists every guard of docs/guards.md as active or with the setting it needs.
    from rlvr_core.experiment.guard_coverage import GUARDS

    assert list(s["guard_coverage"]) == list(GUARDS)
    assert s["guard_coverage"]["G-no-eval"].startswith("active: every 2 steps")
    assert s["guard_coverage"]["G-reward-hacking"].startswith("needs at least 3 eval points")  # 2 points in 3 steps
    # benchmarks/docs_numbers.py reads the numbers the docs quote from this summary (docs/testing.md).
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_numbers", ROOT / "benchmarks" / "docs_numbers.py")
    dn = sys.modules.setdefault("docs_numbers", importlib.util.module_from_spec(spec))
    spec.loader.exec_module(dn)
    v = dn.demo_values(s)
    d = s["comparison"]["accuracy_greedy"]
    assert (v["base_greedy"], v["trained_greedy"], v["n"], v["train_steps"]) == (
        s["base_pass_at_1"], s["trained_pass_at_1"], 60, 3)
    assert (v["delta_points"], v["delta_ci_low_points"]) == (pytest.approx(100 * d["delta"]), pytest.approx(100 * d["ci_low"]))
    assert v["base_pass_at_4"] == s["base_pass_at_k"]["4"] and "base_tool_call_rate" not in v
    assert dn.rollout_values(s["artifact_uri"]) == {}  # single-turn: its steps have no tool-call rate
    # The closing summary prints each evaluation's own truncation: the trained one's is the trained evaluation's
    # share (what its G-truncation flag is raised on), not the base model's.
    for who, ev_id, e in (("base model", "base", s["eval"]), ("after GRPO", "trained", s["trained_eval"])):
        line = next(x for x in proc.stderr.splitlines() if x.strip().startswith(f"{who}: truncated completions"))
        assert f"truncated completions {e['truncation_share']:.1%}" in line
        flagged = any(f["eval_id"] == ev_id and f["guard_id"] == "G-truncation" for f in s["eval_flags"])
        assert flagged == (e["truncation_share"] > 0.1)
    # The trained numbers come from the exported checkpoint, uploaded and verified in the artifact store.
    from rlvr_core.artifacts.export import verify_export
    from rlvr_core.artifacts.storage import open_store

    assert s["export"]["step"] == 3 and s["export"]["dtype"] == "float32"
    store = open_store(str(home / "artifacts"))
    manifest = verify_export(store, f"e2e/demo-{run[:8]}/checkpoints/final",
                             expected_manifest_sha256=s["export"]["manifest_sha256"])
    assert {"model.safetensors", "config.json"} <= {f["path"] for f in manifest["files"]}
    assert client.get_run(run).data.tags["export_uri"] == s["export"]["uri"]

    # The base-vs-trained comparison, recomputed here from the two evaluations' per-sample rows.
    import pyarrow.parquet as pq

    run_dir = Path(s["artifact_uri"])
    rows = pq.read_table(run_dir / "evals" / "samples.parquet").to_pylist()
    greedy = {e: {r["problem_id"]: r["status"] == "correct" for r in rows if r["eval_id"] == e and r["greedy"]}
              for e in ("base", "trained")}
    common = sorted(greedy["base"].keys() & greedy["trained"].keys())
    solved = {e: {p for p in common if greedy[e][p]} for e in greedy}
    c = s["comparison"]
    assert len(common) == 60 and (c["a"], c["b"], c["n_problems"]) == ("base", "trained", len(common))
    acc = c["accuracy_greedy"]
    assert acc["delta"] == pytest.approx((len(solved["trained"]) - len(solved["base"])) / len(common))
    assert acc["delta"] == pytest.approx(s["trained_pass_at_1"] - s["base_pass_at_1"])
    assert acc["ci_low"] <= acc["delta"] <= acc["ci_high"]
    assert c["solved_greedy_only"] == {"base": len(solved["base"] - solved["trained"]),
                                       "trained": len(solved["trained"] - solved["base"])}
    ever = {e: {r["problem_id"] for r in rows if r["eval_id"] == e and not r["greedy"] and r["status"] == "correct"}
            for e in ("base", "trained")}
    assert c["solvable_overlap"] == {"both": len(ever["base"] & ever["trained"]),
                                     "a_only": len(ever["base"] - ever["trained"]),
                                     "b_only": len(ever["trained"] - ever["base"]),
                                     "neither": len(set(common) - ever["base"] - ever["trained"])}
    assert "# trained vs base" in (run_dir / "comparison.md").read_text()
    assert json.loads((run_dir / "comparison.json").read_text())["benchmarks"]["synthetic"]["n_problems"] == 60

    # The warehouse's newer tables fill from the run: the trainer's rollouts (copied as they are) ...
    manifest = json.loads((run_dir / "manifest.json").read_text())
    train_folder = Path(manifest["trained_model"]["path"]).parent  # the GRPO stage folder
    n_rollouts = pq.read_metadata(train_folder / "rollouts.parquet").num_rows
    assert n_rollouts > 0
    q = rlvr(home, "warehouse", "query", f"select count(*) as n from rollout_samples where run_id = '{run}'", "--json")
    assert json.loads(q.stdout) == [{"n": n_rollouts}]
    # ... and the traced groups on the run (tracking.traces: the evaluation steps 2 and 3, both groups of each)
    # hold the warehouse's completions and rewards for the same steps.
    q = rlvr(home, "warehouse", "query", "select step, prompt_id, sample_index, completion, reward, status, length, "
             f"finish_reason from rollout_samples where run_id = '{run}'", "--json")
    warehouse = {(r["step"], r["prompt_id"], r["sample_index"]): r for r in json.loads(q.stdout)}
    traces = client.search_traces(locations=[client.get_run(run).info.experiment_id], run_id=run,
                                  filter_string="tags.`rlvr.kind` = 'rollout'", max_results=100)
    assert sorted((t.info.tags["step"], t.info.tags["prompt_id"]) for t in traces) == sorted(
        (str(st), p) for st in (2, 3) for p in {k[1] for k in warehouse if k[0] == st})
    compared = 0
    for t in traces:
        step = int(t.info.tags["step"])
        assert client.search_traces(locations=[t.info.experiment_id], run_id=run,
                                    filter_string=f"tags.step = '{step}'", max_results=100)
        for out in next(sp for sp in t.data.spans if sp.parent_id is None).outputs:
            row = warehouse.get((step, t.info.tags["prompt_id"], out["sample_index"]))
            if row is not None:
                assert {k: out[k] for k in ("completion", "reward", "status", "length", "finish_reason")} == {
                    k: row[k] for k in ("completion", "reward", "status", "length", "finish_reason")}
                assert out["weight_version"] == step - 1
                compared += 1
    assert compared == sum(1 for k in warehouse if k[0] in (2, 3)) > 0
    # ... the guard firings and per-step flag episodes from the trainer's summary, then the evaluations'
    # flags (the file is authoritative, even when empty) ...
    firings = json.loads((train_folder / "grpo_summary.json").read_text())["health_firings"]
    n_eval_flags = len(s["eval_flags"])
    assert pq.read_metadata(run_dir / "train" / "health_events.parquet").num_rows == len(firings) + n_eval_flags
    q = rlvr(home, "warehouse", "query", "select count(*) filter (where source in ('firings', 'step_flags')) as "
             f"train, count(*) filter (where source = 'eval') as eval from health_events where run_id = '{run}'",
             "--json")
    assert json.loads(q.stdout) == [{"train": len(firings), "eval": n_eval_flags}]
    # ... a run that did not collapse carries no `collapsed` tag ...
    assert "tags" not in json.loads((run_dir / "run.json").read_text())
    # ... and pass@k for every k = 1..n of both evaluations and both scorings, where pass@n is the share of
    # problems solved by at least one of the n samples.
    n = {e: len([r for r in rows if r["eval_id"] == e and not r["greedy"] and r["problem_id"] == common[0]])
         for e in ("base", "trained")}
    assert n == {"base": 4, "trained": 4}  # SMALL's eval.n_samples
    q = rlvr(home, "warehouse", "query", "select eval_id, scoring, list(k order by k) as ks, "
             "max_by(value, k) as at_n from passk_curves "
             f"where run_id = '{run}' group by eval_id, scoring order by eval_id, scoring", "--json")
    curves = json.loads(q.stdout)
    assert [(r["eval_id"], r["scoring"]) for r in curves] == [("base", "gsm8k:flexible"), ("base", "gsm8k:strict"),
                                                              ("trained", "gsm8k:flexible"), ("trained", "gsm8k:strict")]
    assert all(r["ks"] == list(range(1, n[r["eval_id"]] + 1)) for r in curves)
    headline = {r["eval_id"]: r["at_n"] for r in curves if r["scoring"] == c["scoring"]}
    assert headline == {e: pytest.approx(len(ever[e]) / len(common)) for e in ("base", "trained")}

    # The short probe report (base vs trained on the problems base failed and trained solved, from the two
    # evaluations' greedy completions): its slice is exactly those problems, and its token table reaches the
    # warehouse with the run.
    greedy_ok = {e: {r["problem_id"] for r in rows if r["eval_id"] == e and r["greedy"] and r["status"] == "correct"}
                 for e in ("base", "trained")}
    probe = s["probe"]
    assert probe["n_selected"] == min(50, len(greedy_ok["trained"] - greedy_ok["base"]))
    assert (run_dir / "probe" / "report.md").is_file()
    n_tokens = pq.read_metadata(run_dir / "probe" / "probe_tokens.parquet").num_rows
    q = rlvr(home, "warehouse", "query", f"select count(*) as n from probe_tokens where run_id = '{run}'", "--json")
    assert json.loads(q.stdout) == [{"n": n_tokens}]


def test_a_run_stopped_by_a_guard_is_recorded_and_exports_nothing(demo_runs):
    # beta 0.1 at lr 0.02 wrecks this model within a few steps: reward to 0, nearly every completion truncated,
    # no group with reward variance (nothing trained; the KL to the reference is then measured on what was
    # sampled). Default guard settings: G-collapse compares the steps with the base model's own numbers on the
    # same prompts (the pass-rate table), so it can judge from step 5 (its window) instead of step 10, and the KL
    # detector stops a sustained blow-up that comes with that collapse. Either may be first. The cached stages of
    # the demo are reused.
    home = demo_runs[0]
    grpo = ["--set", "grpo.enabled=true", "--set", "grpo.steps=12", "--set", "grpo.prompts_per_step=2",
            "--set", "grpo.group_size=4", "--set", "grpo.lr=0.02", "--set", "grpo.beta=0.1",
            "--set", "grpo.warmup_steps=2", "--set", "grpo.checkpoint_every=2",
            "--set", "tracking.experiment=e2e-stop"]
    proc = rlvr(home, "demo", "--json", *SMALL, *grpo)
    # Exit code 3 and one line that names the guard, the step and the setting, then why and where the details are;
    # no traceback on the terminal (it is in the log file the message names).
    assert proc.returncode == 3, proc.stderr[-3000:]
    err = proc.stderr.splitlines()
    i = next(i for i, line in enumerate(err) if line.startswith("rlvr demo: stopped by "))
    head = re.match(r"rlvr demo: stopped by (G-collapse|G-kl-explosion) at step (\d+) of 12; lower grpo\.lr \(now 0\.02\)",
                    err[i])
    assert head, err[i]
    assert err[i + 1].startswith("  why: ") and err[i + 2].startswith("  details: report ")
    assert "Traceback" not in proc.stderr and not any(x.startswith("{") for x in proc.stdout.splitlines())
    log = Path(re.search(r"log (\S+\.log)", err[i + 2]).group(1))
    assert "Traceback" in log.read_text() and "GuardError" in log.read_text()
    # The details name files that exist and an MLflow address a browser opens (a database store: the command that
    # serves it, then the run's page there).
    report, train_summary = (Path(re.search(rf"{k} (\S+?);", err[i + 2]).group(1)) for k in ("report", "training summary"))
    assert report.is_file() and train_summary.is_file(), err[i + 2]
    assert "MLflow `mlflow ui --backend-store-uri sqlite:" in err[i + 2] and "http://127.0.0.1:5000/#/experiments/" in err[i + 2]
    q = rlvr(home, "warehouse", "query", "select r.run_id, r.status, t.value as stopped_at from runs r join run_tags t "
             "using (run_id) where r.experiment = 'e2e-stop' and t.key = 'stopped_at_step'", "--json")
    (run,) = json.loads(q.stdout)
    stop = int(run["stopped_at"])
    assert run["status"] == "FAILED" and stop == int(head.group(2)) <= 9  # before today's step-10 baselines
    q = rlvr(home, "warehouse", "query", "select key, value from run_tags where run_id = "
             f"'{run['run_id']}' and key = 'collapsed'", "--json")
    assert json.loads(q.stdout) == [{"key": "collapsed", "value": "true"}]
    # The serious firing and the steps up to the stop reached the warehouse; nothing after it ran.
    q = rlvr(home, "warehouse", "query", "select guard_id, step from health_events where run_id = "
             f"'{run['run_id']}' and serious", "--json")
    events = json.loads(q.stdout)  # both guards may fire at the stop step; the message names the first
    assert events and {e["step"] for e in events} == {stop}
    assert {e["guard_id"] for e in events} <= {"G-kl-explosion", "G-collapse"} and \
        head.group(1) in {e["guard_id"] for e in events}
    q = rlvr(home, "warehouse", "query", "select max(step) as last from train_steps where run_id = "
             f"'{run['run_id']}'", "--json")
    assert json.loads(q.stdout) == [{"last": stop}]
    # The run folder holds the summary and report; no checkpoint was exported from the bad state.
    run_dir = next((home / "artifacts" / "e2e-stop").glob(f"demo-{run['run_id'][:8]}"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "collapsed" and summary["stopped_at_step"] == stop
    assert "stopped by a guard" in (run_dir / "report.md").read_text()
    assert not (run_dir / "checkpoints").exists()
    # ... and the training summary, with what the run was guarded against.
    train_summary = json.loads((run_dir / "train" / "grpo_summary.json").read_text())
    assert train_summary["stopped_at_step"] == stop and train_summary["guard_coverage"]["G-collapse"].startswith("active")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow' / 'mlflow.db'}")
    assert client.get_run(run["run_id"]).info.status == "FAILED"


def test_guard_calibration_replays_the_finished_runs_of_a_home(demo_runs):
    # benchmarks/guard_calibration.py (docs/guards_training.md, "False stops on healthy runs") on this module's
    # home: the finished GRPO run of the test above is replayed with the base model's numbers on its prompts and
    # stops nothing; the run a guard stopped is not a finished run and is not counted.
    home = demo_runs[0]
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "guard_calibration.py"), str(home), "--json",
                          str(home / "calibration.json")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    runs = json.loads((home / "calibration.json").read_text())
    assert runs and all(r["stops"] == [] for r in runs) and {r["steps"] for r in runs} == {3}
    assert out.stdout.strip().splitlines()[-1] == f"false stops: 0 of {len(runs)} healthy runs"


def test_collapse_is_read_from_the_trainer_summary():
    from rlvr_core.pipeline.run_record import collapsed as _collapsed

    assert _collapsed({"tags": ["collapsed"], "health_firings": []})
    assert _collapsed({"health_firings": [{"guard_id": "G-collapse", "step": 3, "serious": True}]})
    assert not _collapsed({"health_firings": [{"guard_id": "G-entropy", "step": 3, "serious": False}]})
    assert not _collapsed({"steps": 3, "done": True})
