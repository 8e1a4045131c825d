"""VerifierPool: order, errors as `error`, hard timeouts with worker replacement, use from a thread.

Two planted hangs. `HANG` is real: `\\boxed{10^{10^{10}}}` against gold 1 makes sympy try to build a
ten-billion digit integer inside math-verify's comparison; the math verifier's own CPU-time limit (set to
the pool's timeout) interrupts it and the warm worker lives on. `C_HANG` (planted_verifiers.py) spins
inside the C regex engine, where no signal handler runs: only the pool's kill stops it.
"""

import contextlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from verifier_data import read_jsonl

from rlvr_core.verifiers import Status, get_verifier
from planted_verifiers import C_HANG as _C_HANG, spin

from rlvr_core.verifiers.pool import _KILL_MARGIN_S, VerifierPool

HANG = ("The answer is $\\boxed{10^{10^{10}}}$.", "1")
C_HANG = (_C_HANG, "1")
PLANTED = "planted_verifiers:planted_math"
TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def math_pool():
    # One pool for the module: spawning workers that import sympy costs seconds on a loaded machine.
    with VerifierPool(PLANTED, workers=2, timeout_s=TIMEOUT_S) as pool:
        yield pool


def gsm8k_pairs(n):
    rows = read_jsonl("gsm8k/test.jsonl")[:n]
    pairs = []
    for i, row in enumerate(rows):
        final = row["answer"].rsplit("####", 1)[1].strip()
        # every third response is wrong, so order mix-ups would show
        response = row["answer"] if i % 3 else f"#### {int(final.replace(',', '')) + 1}"
        pairs.append((response, final))
    return pairs


def test_results_come_back_in_input_order_and_match_in_process():
    pairs = gsm8k_pairs(60)
    local = get_verifier("gsm8k")
    expected = [local.verify(r, g) for r, g in pairs]
    with VerifierPool("gsm8k", workers=2) as pool:
        got = pool.verify_many(pairs)
        assert got == expected
        stats = pool.stats
    assert stats["correct"] == 40 and stats["incorrect"] == 20 and stats["total"] == 60
    assert stats["kills"] == 0 and stats["restarts"] == 0


@pytest.mark.parametrize("workers", [0, 2])
def test_an_exception_is_error_not_incorrect(workers):
    # Planted failures: a gold with no number, a None gold, a non-string response.
    planted = [("#### 35", "no number"), ("#### 35", None), (None, "35"), ("#### 35", "35")]
    with VerifierPool("gsm8k", workers=workers) as pool:
        outs = pool.verify_many(planted)
        assert [o.status for o in outs] == [Status.ERROR] * 3 + [Status.CORRECT]
        assert "ValueError" in outs[0].detail and "TypeError" in outs[1].detail
        assert all(o.reward == 0.0 for o in outs[:3])
        assert pool.stats["error"] == 3 and pool.stats["incorrect"] == 0


def test_error_inside_math_verify_is_error(math_pool):
    # A gold that math-verify cannot parse at all is reported, not scored 0 silently.
    out = math_pool.verify("\\boxed{1}", "\\boxed{")
    assert out.status is Status.ERROR and "could not parse" in out.detail


@pytest.mark.parametrize("hang, killed", [(HANG, False), (C_HANG, True)], ids=["sympy", "C-level"])
def test_hang_is_stopped_within_timeout_plus_one_second_and_the_pool_keeps_working(math_pool, hang, killed):
    before = dict(math_pool.stats)
    good = [("$\\boxed{\\frac{1}{2}}$", "0.5"), ("$\\boxed{3}$", "4"), ("so $x = 27.0$", "27")]
    t0 = time.monotonic()
    outs = math_pool.verify_many([good[0], hang, good[1], good[2]])
    elapsed = time.monotonic() - t0
    assert [o.status for o in outs] == [Status.CORRECT, Status.TIMEOUT, Status.INCORRECT, Status.CORRECT]
    assert elapsed < TIMEOUT_S + 1.0, elapsed
    after = math_pool.stats
    # A C-level hang is killed. A sympy hang is interrupted inside the worker by its own CPU-time limit, unless
    # on a loaded machine the pool's wall-clock limit comes first (the worker got less CPU than its limit in
    # that time): then it is killed too (seen in a suite run beside another worker).
    kills = after["kills"] - before["kills"]
    assert kills == 1 if killed else kills in (0, 1)
    assert after["restarts"] - before["restarts"] == kills
    assert after["timeout"] == before["timeout"] + 1
    assert ("worker killed" in outs[1].detail) is bool(kills), outs[1].detail
    # The (replacement) worker serves the next batch; a second hang is also caught.
    outs = math_pool.verify_many([hang, good[0]])
    assert [o.status for o in outs] == [Status.TIMEOUT, Status.CORRECT]


def test_pool_works_from_a_non_main_thread(math_pool):
    # Prefect runs tasks in a thread pool: math-verify's signal timeouts cannot work there, the
    # pool's process kill must.
    box = {}

    def run():
        box["outs"] = math_pool.verify_many([HANG, C_HANG, ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "(3, \\pi/2)")])

    t = threading.Thread(target=run)
    t.start()
    t.join(timeout=30)
    assert [o.status for o in box["outs"]] == [Status.TIMEOUT, Status.TIMEOUT, Status.CORRECT]


def test_new_pool_created_from_a_thread():
    box = {}

    def run():
        with VerifierPool("gsm8k", workers=1) as pool:
            box["out"] = pool.verify("#### 1,200", "1200")

    t = threading.Thread(target=run)
    t.start()
    t.join(timeout=60)
    assert box["out"].status is Status.CORRECT


GOOD = [("$\\boxed{\\frac{1}{2}}$", "0.5", Status.CORRECT), ("$\\boxed{3}$", "4", Status.INCORRECT),
        ("so $x = 27.0$", "27", Status.CORRECT)]


def test_a_hang_holds_up_nothing_else_and_its_replacement_is_already_warm():
    # The hang is planted second, so the item after it is queued on the same worker (prefetch): it
    # must be moved to the other worker instead of waiting for the kill.
    T = 1.5
    items = [GOOD[k % 3] for k in range(30)]
    items.insert(1, (*C_HANG, Status.TIMEOUT))
    with VerifierPool(PLANTED, workers=2, timeout_s=T) as pool:
        pool.verify_many([(r, g) for r, g, _ in GOOD])  # workers and spare started and warm
        t0 = time.monotonic()
        outs = pool.verify_many([(r, g) for r, g, _ in items])
        elapsed = time.monotonic() - t0
        done = pool.last_done_s
        assert [o.status for o in outs] == [s for _, _, s in items]
        # Killed once it has had the timeout plus the kill margin of CPU time: on a core of its own,
        # that much wall time (+ slack for the rest of this machine's load).
        assert T + _KILL_MARGIN_S <= done[1] < T + 1.0, done[1]
        assert max(d for i, d in enumerate(done) if i != 1) < T / 2, done
        # A restart that re-imported sympy would show here as seconds, not the kill alone.
        assert elapsed < T + 1.0, elapsed
        assert pool.stats["kills"] == 1 and pool.stats["restarts"] == 1


def test_back_to_back_hangs_on_one_worker_cost_only_their_timeouts():
    # One worker, so every hang kills the only worker: the spare takes over at once, and a new spare
    # is ready before the next hang needs it.
    T = 1.0
    with VerifierPool(PLANTED, workers=1, timeout_s=T, spares=1) as pool:
        pool.verify_many([(r, g) for r, g, _ in GOOD])
        t0 = time.monotonic()
        outs = pool.verify_many([C_HANG, GOOD[0][:2], C_HANG, GOOD[1][:2], C_HANG, GOOD[2][:2]])
        elapsed = time.monotonic() - t0
        assert [o.status for o in outs] == [Status.TIMEOUT, Status.CORRECT, Status.TIMEOUT,
                                           Status.INCORRECT, Status.TIMEOUT, Status.CORRECT]
        assert elapsed < 3 * (T + _KILL_MARGIN_S) + 0.6, elapsed
        assert pool.stats["restarts"] == 3


def _descendants(pid: int) -> set[int]:
    """Live descendant processes of `pid`, from /proc (zombies count: they would be leaks too)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # exited while we looked
            continue
        ppid = int(text.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            found.add(c)
            todo.append(c)
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_close_leaves_no_processes_behind_after_kills_and_replacements():
    # multiprocessing's forkserver and resource tracker are one-per-parent helpers that outlive any
    # pool (and exit with the parent); start them first so that "before" includes them.
    with VerifierPool("gsm8k", workers=1) as pool:
        pool.verify("#### 1", "1")
    before = _descendants(os.getpid())
    seen = set()
    with VerifierPool(PLANTED, workers=2, timeout_s=0.5, spares=1) as pool:
        seen |= set(pool.pids)
        pool.verify_many([C_HANG, GOOD[0][:2], C_HANG])
        seen |= set(pool.pids)
        assert pool.stats["restarts"] == 2
    assert len(seen) >= 5  # 2 workers + 1 spare + 2 replacements started
    assert _descendants(os.getpid()) == before
    # Spares forked by a worker that was then killed belong to init, not to us: check them by pid.
    assert not [pid for pid in seen if Path(f"/proc/{pid}").exists()
                and (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z")]


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_replacements_are_forked_from_a_warm_worker_and_refreshed():
    # After a kill the new spare is a fork of a surviving worker (its child), so that the next
    # replacement starts with the batch's parsed golds and sympy caches, not from scratch. A donor must
    # not be busy past the sideline point when the fork is asked for (else the spare comes from the
    # forkserver, by design): 0.5 s, not the 0.125 s a 0.5 s timeout gives, so that a loaded machine
    # (CI with two test workers) does not starve a quick item past it.
    with VerifierPool(PLANTED, workers=2, timeout_s=2.0, spares=1, sideline_after_s=0.5) as pool:
        pool.verify_many([(r, g) for r, g, _ in GOOD])
        outs = pool.verify_many([C_HANG] + [GOOD[k % 3][:2] for k in range(20)])
        assert outs[0].status is Status.TIMEOUT
        assert [o.status for o in outs[1:]] == [GOOD[k % 3][2] for k in range(20)]
        # The spare was asked for at the kill; it is taken in while the pool next listens, which a
        # short batch can finish before (the donor's fork ran late on a loaded machine): listen again.
        for _ in range(40):
            pool.verify_many([(r, g) for r, g, _ in GOOD])
            if pool.stats["forked_spares"]:
                break
            time.sleep(0.05)
        worker_pids = {w.process.pid for w in pool._workers}
        assert pool.stats["forked_spares"] >= 1
        (spare,) = pool._spares
        assert _ppid(spare.process.pid) in worker_pids
        # The forked spare works when promoted: plant a second hang.
        outs = pool.verify_many([C_HANG, GOOD[0][:2], GOOD[1][:2]])
        assert [o.status for o in outs] == [Status.TIMEOUT, Status.CORRECT, Status.INCORRECT]
        assert pool.stats["restarts"] == 2
        # A long batch re-forks the spare from a working worker (keeps one spare, the newest). The count
        # restarts when a fork arrives, and the other worker keeps answering while the donor forks: on a
        # loaded machine (CI) a fork came more than 50 results late, so 2 x _REFRESH_SPARE_AFTER + 50 items saw one
        # refresh. 1,000 items leave room for 300 results of lag per fork and still rule out "never".
        from rlvr_core.verifiers.pool import _REFRESH_SPARE_AFTER

        before = pool.stats["forked_spares"]
        n = 5 * _REFRESH_SPARE_AFTER
        pool.verify_many([GOOD[k % 3][:2] for k in range(n)])
        assert pool.stats["forked_spares"] >= before + 2
        assert len(pool._spares) == 1


def test_unknown_verifier_and_bad_options_fail_before_any_process_starts():
    with pytest.raises(KeyError):
        VerifierPool("no-such-verifier")
    with pytest.raises(ValueError):
        VerifierPool("gsm8k", options={"mode": "nope"})


def test_a_slow_item_is_sidelined_not_killed_and_its_worker_rejoins_as_a_spare():
    # A correct answer that takes ~0.8 s (over the sideline point, under the timeout): the quick
    # items behind it go to the spare that takes its worker's slot, and its own verdict still counts.
    slow = "```python\nimport time\ntime.sleep(0.8)\ndef add(a, b):\n    return a + b\n```"
    quick = "```python\ndef add(a, b):\n    return a + b\n```"
    tests = ["assert add(1, 2) == 3"]
    with VerifierPool("code", options={"time_limit_s": 3.0}, workers=1, timeout_s=4.0, spares=1) as pool:
        pool.verify_many([(quick, tests)])
        slow_pid = pool.pids[0]
        outs = pool.verify_many([(slow, tests), (quick, tests), (quick, tests)])
        done = pool.last_done_s
        assert [o.status for o in outs] == [Status.CORRECT] * 3
        assert done[0] >= 0.8 and max(done[1:]) < done[0], done
        assert pool.stats["kills"] == 0 and pool.stats["restarts"] == 0
        assert slow_pid in pool.pids and slow_pid != pool._workers[0].process.pid  # now a spare


def test_a_blocked_item_is_charged_its_wall_time():
    # The code verifier waits (sleeps) for its program: not waiting for a CPU, so the pool charges the
    # wall time and kills it at the pool's timeout, whatever the program's own (longer) limit says.
    sleeper = "```python\nimport time\ntime.sleep(30)\n```"
    with VerifierPool("code", options={"time_limit_s": 20.0}, workers=1, timeout_s=1.0) as pool:
        t = time.monotonic()
        out = pool.verify(sleeper, ["assert True"])
        elapsed = time.monotonic() - t
    assert out.status is Status.TIMEOUT and "worker killed" in out.detail, out
    assert 1.0 + _KILL_MARGIN_S <= elapsed < 1.0 + 1.0, elapsed


@contextlib.contextmanager
def _busy_loops(per_core: int):
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(per_core * len(os.sched_getaffinity(0)))]
    try:
        yield
    finally:
        for h in hogs:
            h.kill()
            h.wait()


def test_a_loaded_machine_slows_items_down_but_does_not_time_them_out():
    # Two busy loops per core: a worker gets about a third of a core. An item that needs 0.45 s of CPU
    # then takes over the 1 s timeout in wall time (a wall-clock timeout would kill it) and still comes
    # back correct: it is charged its own time. (hang_share=0.5: the item needs more than the default
    # quarter of the budget, which past timeout + margin of wall time would count as a hang.)
    with VerifierPool(PLANTED, workers=1, timeout_s=1.0, hang_share=0.5) as pool:
        assert pool.verify("$\\boxed{2}$", "2").status is Status.CORRECT  # started and warm
        with _busy_loops(2):
            t = time.monotonic()
            slow = pool.verify(spin(0.45), "1")
            slow_wall = time.monotonic() - t
            after = pool.verify("$\\boxed{3}$", "3")
    assert slow.status is Status.CORRECT, slow
    assert slow_wall > 1.0, f"the machine was not loaded enough to test anything: {slow_wall:.2f} s"
    assert after.status is Status.CORRECT


def test_a_hang_on_a_loaded_machine_is_still_killed_within_timeout_plus_one_second():
    # Default settings, two busy loops per core: the C-level hang gets a third of a core, so it has used
    # a quarter of its budget by timeout + margin of wall time and is killed then.
    T = 2.0
    with VerifierPool(PLANTED, workers=1, timeout_s=T) as pool:
        assert pool.verify("$\\boxed{2}$", "2").status is Status.CORRECT
        with _busy_loops(2):
            t = time.monotonic()
            hang = pool.verify(*C_HANG)
            hang_wall = time.monotonic() - t
            after = pool.verify("$\\boxed{3}$", "3")
    assert hang.status is Status.TIMEOUT and "worker killed" in hang.detail, hang
    assert T + _KILL_MARGIN_S <= hang_wall < T + 1.0, (hang_wall, hang.detail)
    assert after.status is Status.CORRECT


def test_hang_capable_verifiers_refuse_to_run_in_process():
    for name in ("math", "minerva", "ifeval", "code"):
        with pytest.raises(ValueError, match="can hang"):
            VerifierPool(name, workers=0)
    with VerifierPool("gsm8k", workers=0) as pool:  # declares can_hang = False
        assert pool.verify("#### 3", "3").status is Status.CORRECT


def test_many_sidelined_items_rejoining_at_once_lose_nothing():
    # Sidelining after 10 ms sidelines nearly every item: workers keep finishing late, rejoining as
    # spares and pushing older (sometimes still starting) spares out while their messages are being
    # read. Regression: reading the last message of a spare retired in that same round crashed the
    # pool ("died while starting", or a ValueError in the replacement).
    pairs = [(r, g) for r, g, _ in GOOD] * 40
    want = [s for _, _, s in GOOD] * 40
    with VerifierPool("math", workers=2, timeout_s=2.0, spares=1, sideline_after_s=0.01) as pool:
        outs = pool.verify_many(pairs)
        assert [o.status for o in outs] == want
        assert pool.stats["crashes"] == 0 and pool.stats["kills"] == 0


def test_a_pool_warms_only_its_own_verifier():
    """The forkserver a pool starts warms that pool's verifier, not every registered one (math-verify, sympy,
    langdetect: seconds that `rlvr verify` of another verifier paid). A fresh process, so that its pool starts the
    forkserver; a worker forked from it reports what the server warmed. The verifier's module is found through
    the parent's `sys.path` only (as under pytest), which the server must adopt to import and warm it."""
    here = Path(__file__).resolve().parent
    code = (f"import sys; sys.path.insert(0, {str(here)!r})\n"
            "from rlvr_core.verifiers.pool import VerifierPool\n"
            "with VerifierPool('planted_verifiers:warm_report', workers=1, spares=0) as pool:\n"
            "    print(pool.verify('x', 'y').extracted)\n")
    env = {**os.environ, "PYTHONPATH": str(here.parents[1])}
    env.pop("RLVR_WARM_VERIFIERS", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["planted_verifiers:warm_report"]  # one verifier warmed, not every registered one
