"""A verification pool that cannot hang: worker processes with a hard, per-item timeout. One idea, kept in one
file past 600 lines on purpose: the workers, their budgets and their replacement are one state machine.

Why not `concurrent.futures.ProcessPoolExecutor`: `future.result(timeout)` stops *waiting* but does
not stop the worker, so a sympy expression that never finishes keeps its worker busy forever and
the pool silently shrinks (BUGZOO G-verifier-hang). Why not only the verifiers' own limits
(`limits.cpu_time_limit`, which the pool sets to its timeout in every worker): signals work only on a
process's main thread (Prefect runs tasks in threads), and a signal cannot interrupt a long C-level
operation such as a huge integer power.

So each worker is a process we own, with its own pipe. The parent keeps a budget for the item each
worker is running; when it is spent, the worker is SIGKILLed and replaced, and the caller gets
`Status.TIMEOUT`. The clock of an item starts when a *ready* worker starts on it, and a worker is
ready only after its verifier's `warm_up()`, so neither a slow start-up nor a first-use cost
(langdetect's profiles, sympy's caches) is mistaken for a slow verification. Other workers keep
verifying meanwhile.

A timeout measures the item, not the machine: an item is charged its *own time*, its wall time minus
the time it spent waiting for a CPU (Linux `/proc/PID/schedstat`, field 2). A hang is always runnable,
so its own time is the CPU time it gets; an item that sleeps (the code verifier waiting for its program)
is charged its wall time. An item is killed as a hang when

- its own time reaches `timeout_s` + `_KILL_MARGIN_S`, or
- its wall time reaches `timeout_s` + `_KILL_MARGIN_S` *and* it has used `hang_share` (default 1/4) of
  `timeout_s` as own time: it behaves like a hang (real MATH-500 items use at most ~5 % of a 5 s budget),
  so it is not kept running on a busy machine until its full budget is spent; or
- its wall time reaches `wall_cap_s` (default 10 x timeout): the backstop for a process starved outright.

So on a loaded machine a legitimate item that needs less than `hang_share` of the budget is slowed down,
never failed for lack of CPU, while a hang is killed within timeout + 0.5 s of wall time as long as it
gets about a quarter of a core (up to ~4 runnable processes per core), and once it has used a quarter of
its budget when it gets less. The two goals conflict only there: at wall time T + 0.5 s nothing tells a
hang from an item that legitimately needs more CPU than it could get by then; `hang_share` is where the
line is drawn. The run-queue wait is only added when a waiting process gets the CPU
again, so a process waiting right now is charged that one wait (milliseconds under ordinary load).
Where schedstat cannot be read the item is charged its wall time.

Throughput and hangs (docs/benchmarks/verifiers.md):

- Each worker gets up to `_PREFETCH` items at a time: the one it is running plus one waiting in its
  pipe, so it starts the next item right away instead of idling for a parent round trip per item.
- A worker that has run one item for `_SIDELINE_AFTER_S` is *sidelined*: a spare takes its slot and
  what was queued behind the slow item goes to the others, so a possible hang holds up no worker
  while it waits out its timeout. If the item finishes after all, the worker rejoins as a spare; if
  not, it is killed at the deadline.
- A sidelined worker keeps its normal CPU priority. (Lowering it, `SCHED_IDLE` or nice 19, was tried:
  on a busy machine it starved legitimate slow items into false timeouts, the worse failure.)
- A gold answer is parsed once per pool, not once per worker: a worker reports the golds it parsed
  (pickled) with its result, and the parent attaches that parse to the next item with the same gold
  sent to any other worker. A worker that replaces a killed one therefore does not parse the batch's
  golds again. Items also go preferably to the worker that was last sent their gold
  (`_AFFINITY_WINDOW`), for golds whose parse has not come back yet.
- Replacing a worker is instant: `spares` workers are kept ready. A spare is forked from a working
  worker (`_fork_spare`), so it starts with that worker's sympy caches and golds, and it is re-forked
  every `_REFRESH_SPARE_AFTER` results so that it stays recent. At the start, and when no worker can
  take the request, workers come from a "forkserver" process that has imported math-verify/sympy
  and verified a few generic answers (`rlvr_core.verifiers.warm`), so even those start warm.

Why the forkserver start method rather than fork: like spawn, it works from any thread (forking a
threaded parent can deadlock on locks held by other threads); the server is a clean,
single-threaded interpreter. It is one helper process per parent process (plus multiprocessing's
resource tracker), started by the first pool, shared by later pools and gone when the parent exits.
The usual spawn rule applies: a script that creates a pool at import time must guard it with
`if __name__ == "__main__":`.

`workers=0` runs the verifier in the calling process: no process start-up and no pickling, right for
cheap verifiers, and allowed only for verifiers that declare `can_hang = False` (gsm8k, mcq): there is
no kill in-process. Exceptions are still turned into `error` outcomes.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import socket
import sys
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from multiprocessing import forkserver, reduction
from multiprocessing.connection import Connection, wait
from typing import Any

from rlvr_core.sandbox.sweep import sweep_stale
from rlvr_core.verifiers.base import Outcome, Status, safe_verify
from rlvr_core.verifiers.registry import can_hang, get_verifier

# How long a fresh worker may take to build its verifier. Past this the pool gives up loudly
# rather than waiting forever.
_START_TIMEOUT_S = 120.0
# Items in flight per worker: the running one plus one waiting in the pipe. More would only let
# more items queue behind a slow one.
_PREFETCH = 2
# Only small items are queued behind a running one: a message larger than the socket buffer
# (~200 KB) would block the parent's send until the (possibly hung) worker reads it. Bigger items
# wait for an idle worker.
_PREFETCH_MAX_BYTES = 32 * 1024
# A worker that has run one item this long is sidelined (capped at a quarter of the timeout for tiny
# timeouts). Clean MATH-500 verifications take at most ~0.25 s here, most a few milliseconds.
_SIDELINE_AFTER_S = 0.25
# An item is killed this long after its charged time reached `timeout_s`: the verifier's own CPU-time
# limit (`set_time_limit`) answers `timeout` first where it can, which keeps the warm worker alive.
_KILL_MARGIN_S = 0.5
# The default wall-clock cap on one item, as a multiple of `timeout_s` (see the module docstring).
_WALL_CAP_FACTOR = 10.0
# Past `timeout_s + _KILL_MARGIN_S` of wall time, an item that has used this share of `timeout_s` as its
# own time is a hang (see the module docstring).
_HANG_SHARE = 0.25
# Verifiers cache parsed gold answers per process, so an item goes preferably to the worker that
# already had its gold: a worker with room takes the first of the next few to-do items whose gold
# is new or its own, else the next one (never waits for a busy worker).
_AFFINITY_WINDOW = 8
# Imported once in the forkserver, so that forked workers start with them loaded: `warm` runs the
# `warm_up()` of the verifier of the pool that started the forkserver there (math-verify's sympy state,
# langdetect's profiles, ...), so even a worker started from the forkserver starts warm; "__main__" is
# multiprocessing's own default.
_PRELOAD = ["__main__", "rlvr_core.verifiers", "rlvr_core.verifiers.warm"]
_FORKSERVER_START = threading.Lock()
# The variables naming the verifiers the forkserver warms and the import path to find them with (the parent's
# `sys.path`, which Python 3.11's forkserver does not apply itself), read by `rlvr_core.verifiers.warm` there.
WARM_ENV = "RLVR_WARM_VERIFIERS"
WARM_PATH_ENV = "RLVR_WARM_SYS_PATH"
# The spare is re-forked from a working worker after this many results, so that a replacement has
# the batch's golds and sympy state of a moment ago rather than of the pool's start.
_REFRESH_SPARE_AFTER = 200


def _wait_s(pid: int) -> float | None:
    """Seconds the process has spent runnable but waiting for a CPU (Linux `/proc/PID/schedstat`, second
    field, in ns; added each time a waiting task gets the CPU); None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def _context(name: str) -> Any:
    """The multiprocessing context of a pool of verifier `name`; starts this process's forkserver, warming
    `name` only (`rlvr_core.verifiers.warm` reads WARM_ENV there), unless it is running already."""
    if "forkserver" not in mp.get_all_start_methods():  # Windows
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    # Only takes effect if this process's forkserver is not running yet; harmless otherwise.
    ctx.set_forkserver_preload(_PRELOAD)
    with _FORKSERVER_START:  # the server inherits the environment at its start: name it only then
        told = {WARM_ENV: name, WARM_PATH_ENV: os.pathsep.join(sys.path)}
        before = {k: os.environ.get(k) for k in told}
        os.environ.update(told)
        try:
            forkserver.ensure_running()
        finally:
            for k, v in before.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return ctx


def _worker_main(conn: Connection, name: str, options: dict[str, Any], timeout_s: float) -> None:
    """Worker loop: build the verifier, warm it up, then serve the parent (see `_serve`).

    Runs on the worker's main thread, so a verifier's own CPU-time limit (`set_time_limit`, signals)
    works in here as a first line; the parent's kill is the hard limit.
    """
    try:
        verifier = get_verifier(name, **options)
        if hasattr(verifier, "set_time_limit"):
            verifier.set_time_limit(timeout_s)
        verifier.warm_up()
    except BaseException as exc:  # noqa: BLE001 — reported to the parent, which raises
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", None))
    _serve(conn, verifier)


def _serve(conn: Connection, verifier: Any) -> None:
    """Answer (index, response, gold) messages in order; "fork" makes a spare (`_fork_spare`)."""
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # parent went away
            return
        if msg is None:  # orderly shutdown
            return
        if msg == "fork":
            _fork_spare(conn, verifier)
            continue
        index, response, gold, parsed_gold = msg
        if parsed_gold is not None:
            verifier.add_parsed_gold(gold, pickle.loads(parsed_gold))
        outcome = safe_verify(verifier, response, gold)
        conn.send(("result", (index, outcome, _parsed_golds(verifier))))


def _parsed_golds(verifier: Any) -> list[tuple[str, bytes]]:
    """Golds the verifier parsed for this item, pickled for the parent to pass to other workers
    (verifiers with a gold cache define `take_parsed_golds`/`add_parsed_gold`; see `MathVerifier`)."""
    if not hasattr(verifier, "take_parsed_golds"):
        return []
    out = []
    for gold, parsed in verifier.take_parsed_golds():
        try:
            out.append((gold, pickle.dumps(parsed, protocol=pickle.HIGHEST_PROTOCOL)))
        except Exception:  # noqa: BLE001 — not shareable; other workers parse it themselves
            pass
    return out


# The spares this worker forked and has not reaped yet.
_SPARE_PIDS: set[int] = set()


def _reap_spares(signum: int | None = None, frame: Any = None) -> None:
    """SIGCHLD handler of a worker: reap the spares it forked that have exited, and no other child (a child
    a verifier started is waited for by the verifier, which must get its real exit status)."""
    for pid in list(_SPARE_PIDS):
        try:
            done, _status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            _SPARE_PIDS.discard(pid)


def _fork_spare(conn: Connection, verifier: Any) -> None:
    """Fork a copy of this (warm) worker as a spare and hand the parent a pipe to it.

    Why: a worker killed on a hang takes its warm state with it: sympy's caches and the parsed
    golds of the batch (a GRPO batch checks G responses against each gold). A replacement started
    from scratch verifies the rest of the batch up to twice as slowly; a fork of a sibling starts
    with all of that. The child talks over a new socket pair whose parent end is passed over
    `conn` as a file descriptor (SCM_RIGHTS). It is not the pool's child: the pool kills it by pid,
    and this worker reaps it (`_reap_spares` on SIGCHLD), so no zombie is left even after this worker dies.
    SIGCHLD is not simply ignored: then the kernel reaps *every* child of the worker at once, and a verifier
    that runs a program and reads its exit status (the code verifier) reads 0, "passed", for any program.
    """
    signal.signal(signal.SIGCHLD, _reap_spares)
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the spare: keep only its own end; the worker's pipe belongs to the worker
        _SPARE_PIDS.clear()  # its siblings are not its children
        try:
            ours.close()
            conn.close()
            link = Connection(theirs.detach())
            link.send(("ready", None))
            _serve(link, verifier)
        finally:
            os._exit(0)
    _SPARE_PIDS.add(pid)
    _reap_spares()  # in case it already exited before its pid was recorded
    theirs.close()
    conn.send(("forked", pid))
    reduction.send_handle(conn, ours.fileno(), os.getppid())
    ours.close()


class _Forked:
    """The process handle of a spare forked by a worker: what the pool needs of `mp.Process`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.exitcode = None  # not our child: its exit status goes to the worker that forked it

    def is_alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        try:  # Linux: a killed process that is not reaped yet (a zombie) still takes signals
            with open(f"/proc/{self.pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return True

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def join(self, timeout: float | None = None) -> None:
        give_up = time.monotonic() + (timeout if timeout is not None else 1e9)
        while self.is_alive() and time.monotonic() < give_up:
            time.sleep(0.002)


@dataclass(eq=False)  # identity: workers are compared with `is` / found in lists
class _Worker:
    process: Any  # multiprocessing.Process
    conn: Connection
    started_at: float
    ready: bool = False
    # Indices sent to this worker, in the order it runs them; queue[0] is the running one.
    queue: deque[int] = field(default_factory=deque)
    clock: float = 0.0  # when queue[0] started, as seen by the parent
    fork_pending: bool = False  # asked to fork a spare, which has not arrived yet
    golds: set[str] = field(default_factory=set)  # golds it has parsed or been sent parsed
    # The process's run-queue wait (`_wait_s`) when its running item started; the item is charged its wall
    # time less the wait since. None: the wall clock counts.
    wait_mark: float | None = None


@dataclass
class _Batch:
    """State of one `verify_many` call."""

    pairs: list[tuple[str, Any]]
    t0: float
    results: list[Outcome | None]
    done_at: list[float]
    todo: deque[int]
    remaining: int
    payloads: dict[int, bytes] = field(default_factory=dict)


class VerifierPool:
    """`with VerifierPool("math", workers=2, timeout_s=5) as pool: outcomes = pool.verify_many(pairs)`.

    `verify_many` returns one Outcome per (response, gold) pair, in input order. Calls from several
    threads are serialised (one batch at a time), which keeps the bookkeeping simple and is what a
    Prefect task needs; for more throughput give one pool more workers. `spares` idle workers are
    kept ready to replace a killed one at once.
    """

    def __init__(
        self,
        name: str,
        options: dict[str, Any] | None = None,
        workers: int = 2,
        timeout_s: float = 5.0,
        spares: int = 1,
        sideline_after_s: float = _SIDELINE_AFTER_S,
        wall_cap_s: float | None = None,
        hang_share: float = _HANG_SHARE,
    ) -> None:
        if workers < 0 or spares < 0:
            raise ValueError(f"workers and spares must be >= 0, got {workers}, {spares}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if workers == 0 and can_hang(name):
            raise ValueError(f"verifier {name!r} can hang (it declares can_hang = True), so it cannot run "
                             "in-process (workers=0), where nothing could stop it: use workers >= 1")
        self.name = name
        self.options = dict(options or {})
        self.n_workers = workers
        self.n_spares = spares if workers else 0
        self.timeout_s = timeout_s
        self._sideline_after = min(sideline_after_s, timeout_s / 4)
        self.wall_cap_s = max(timeout_s + _KILL_MARGIN_S, wall_cap_s or _WALL_CAP_FACTOR * timeout_s)
        self.hang_share = hang_share
        # Built here too: validates name and options before any process starts, gives the version for
        # timeout outcomes, and is the verifier itself when workers=0.
        self._local = get_verifier(name, **self.options)
        sweep_stale()  # sandbox folders a crashed earlier run left (rlvr_core/sandbox/sweep.py)
        if hasattr(self._local, "set_time_limit"):
            self._local.set_time_limit(timeout_s)
        if workers == 0:
            self._local.warm_up()
        self._ctx = _context(name) if workers else None
        # Spares are forked from warm workers where the platform can (see `_fork_spare`).
        self._can_fork = self._ctx is not None and self._ctx.get_start_method() == "forkserver"
        self._since_spare = 0  # results since the newest spare was made
        # The refresh carries a worker's parsed golds and sympy caches to the spare; verifiers without
        # such state (gsm8k, mcq, …) skip it: each fork of a large parent (one that imported torch,
        # say) costs the donor time for nothing.
        self._refresh_spares = hasattr(self._local, "add_parsed_gold")
        self._workers: list[_Worker] = []
        self._spares: list[_Worker] = []
        # Workers taken out of service while they run a slow item (maybe a hang); see `_sideline`.
        self._sidelined: list[_Worker] = []
        self._dying: list[_Worker] = []  # killed, not reaped yet
        self._gold_home: dict[str, _Worker] = {}  # gold text -> worker that was last sent it
        # Gold text -> its parse, pickled, as reported by the worker that parsed it (see `_send`).
        self._parsed_golds: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._status_counts: Counter[str] = Counter()
        self._kills = 0
        self._restarts = 0
        self._forked = 0
        self._crashes = 0
        self._closed = False
        # Per-item latency (start on a worker to result, seconds) of the last items, for benchmarks.
        self.latencies: deque[float] = deque(maxlen=100_000)
        # For each item of the last verify_many call: seconds from the call's start to its result.
        self.last_done_s: list[float] = []
        self._workers = [self._start_worker() for _ in range(workers)]
        self._fill_spares()

    # ----------------------------------------------------------------- lifecycle
    def _start_worker(self) -> _Worker:
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(
            target=_worker_main,
            args=(child_conn, self.name, self.options, self.timeout_s),
            name=f"verifier-{self.name}",
            daemon=True,  # never outlive the parent, even if close() is skipped
        )
        proc.start()
        child_conn.close()  # the parent's copy; EOF on parent_conn then means the worker died
        return _Worker(process=proc, conn=parent_conn, started_at=time.monotonic())

    def _fill_spares(self) -> None:
        """Top the spares up: forked from a warm worker when one can take the request, else started
        from the forkserver (at pool start, or when every worker is stuck)."""
        while len(self._spares) + sum(w.fork_pending for w in self._workers) < self.n_spares:
            if not self._ask_for_fork():
                self._spares.append(self._start_worker())

    def _ask_for_fork(self) -> bool:
        """Ask the best donor (ready, not stuck, shortest queue, then most items behind it) to fork."""
        if not self._can_fork:
            return False
        now = time.monotonic()
        donors = [w for w in self._workers if w.ready and not w.fork_pending and not self._stuck(w, now)]
        if not donors:
            return False
        donor = min(donors, key=lambda w: len(w.queue))
        try:
            donor.conn.send("fork")
        except OSError:  # died between items; _receive will see its EOF
            return False
        donor.fork_pending = True
        return True

    def _adopt_fork(self, w: _Worker, pid: int) -> None:
        """`w` forked a spare: take the pipe it passes, keep the newest `n_spares` spares."""
        w.fork_pending = False
        try:
            fd = reduction.recv_handle(w.conn)
        except (EOFError, OSError):  # the donor died mid-hand-over: nobody can reach that spare
            _Forked(pid).kill()
            raise
        now = time.monotonic()
        spare = _Worker(process=_Forked(pid), conn=Connection(fd), started_at=now)
        self._forked += 1
        self._since_spare = 0
        self._spares.append(spare)
        while len(self._spares) > self.n_spares:  # a refresh: retire the oldest
            self._retire(self._spares.pop(0))
        if w.queue:  # the fork ran between two items: the next one starts now
            w.clock, w.wait_mark = now, _wait_s(w.process.pid)

    def _retire(self, w: _Worker) -> None:
        try:
            w.conn.send(None)
        except (OSError, ValueError):
            pass
        self._kill(w)

    def _kill(self, w: _Worker, wait: bool = True) -> None:
        if w.process.is_alive():
            w.process.kill()  # SIGKILL: a hung sympy call ignores anything gentler
        w.conn.close()
        if wait:
            w.process.join(timeout=5)
        else:  # reaped later (`_reap`), so the batch does not wait for a big process to exit
            self._dying.append(w)

    def _reap(self, timeout: float = 0.0) -> None:
        give_up = time.monotonic() + timeout
        reaped = False
        for w in list(self._dying):
            w.process.join(timeout=max(0.0, give_up - time.monotonic()))
            if not w.process.is_alive():
                self._dying.remove(w)
                reaped = True
        if reaped:  # a killed worker's sandboxed item ended with it; a hook-only item's folder may be left
            sweep_stale()

    def _replace(self, w: _Worker) -> None:
        """Kill `w` and put a spare in its slot (a ready one if any), then start a new spare."""
        self._kill(w)
        sweep_stale()  # the folder of a hook-only item it was running
        self._restarts += 1
        self._workers[self._workers.index(w)] = self._take_spare()
        self._fill_spares()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for w in self._workers:
            if w.fork_pending:
                self._drop_pending_fork(w)
        everyone = self._workers + self._sidelined + self._spares
        for w in everyone:
            try:
                w.conn.send(None)
            except (OSError, ValueError):
                pass
        give_up = time.monotonic() + 2
        for w in everyone:
            if not w.queue:  # a busy worker would not read the shutdown message
                w.process.join(timeout=max(0.0, give_up - time.monotonic()))
            self._kill(w)
        self._reap(timeout=5)
        sweep_stale()
        self._workers, self._sidelined, self._spares = [], [], []

    def _drop_pending_fork(self, w: _Worker) -> None:
        """At close: wait briefly for a requested spare and kill it, so that none outlives the pool."""
        give_up = time.monotonic() + 2
        try:
            while w.conn.poll(max(0.0, give_up - time.monotonic())):
                kind, payload = w.conn.recv()
                if kind == "forked":
                    os.close(reduction.recv_handle(w.conn))
                    _Forked(payload).kill()
                    return
        except (EOFError, OSError):
            pass

    def __enter__(self) -> "VerifierPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # best effort; daemon processes die with the parent anyway
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    # ----------------------------------------------------------------- API
    @property
    def version(self) -> str:
        return self._local.version

    @property
    def pids(self) -> list[int]:
        """Process ids of the workers and spares (for tests and monitoring)."""
        return [w.process.pid for w in self._workers + self._sidelined + self._spares]

    @property
    def stats(self) -> dict[str, int]:
        """Counts per status (`timeout` includes the verifiers' own CPU-time limits) plus `kills` (items whose
        worker was killed at the pool's limit), worker restarts and crashes since the pool started."""
        out = {s.value: self._status_counts.get(s.value, 0) for s in Status}
        out.update(
            total=sum(self._status_counts.values()),
            kills=self._kills,
            restarts=self._restarts,
            forked_spares=self._forked,
            crashes=self._crashes,
        )
        return out

    def verify(self, response: str, gold: Any) -> Outcome:
        return self.verify_many([(response, gold)])[0]

    def verify_many(self, pairs: list[tuple[str, Any]]) -> list[Outcome]:
        if self._closed:
            raise RuntimeError("VerifierPool is closed")
        with self._lock:
            if self.n_workers == 0:
                results, done = [], []
                t0 = time.monotonic()
                for r, g in pairs:
                    t = time.monotonic()
                    results.append(safe_verify(self._local, r, g))
                    self.latencies.append(time.monotonic() - t)
                    done.append(time.monotonic() - t0)
                self.last_done_s = done
            else:
                results = self._run(list(pairs))
        for o in results:
            self._status_counts[o.status.value] += 1
        return results

    # ----------------------------------------------------------------- scheduling
    def _outcome(self, status: Status, detail: str) -> Outcome:
        return Outcome(status, 0.0, None, self.name, self.version, detail)

    def _run(self, pairs: list[tuple[str, Any]]) -> list[Outcome]:
        n = len(pairs)
        b = _Batch(pairs, time.monotonic(), [None] * n, [0.0] * n, deque(range(n)), n)
        # Until every item has a result and every worker has finished what it was sent (an item
        # that was also given to another worker is still run here; its result is dropped).
        while b.remaining or any(w.queue for w in self._workers + self._sidelined):
            self._dispatch(b)
            self._receive(b, self._next_wakeup(b))
            self._enforce_deadlines(b)
            if (self._refresh_spares and self._since_spare >= _REFRESH_SPARE_AFTER and self.n_spares
                    and not any(w.fork_pending for w in self._workers)):
                self._since_spare = 0
                self._ask_for_fork()
        self.last_done_s = b.done_at
        return b.results  # type: ignore[return-value]

    def _record(self, b: _Batch, i: int, outcome: Outcome) -> bool:
        """First result of an item wins; False for a duplicate (an item that was run twice)."""
        if b.results[i] is not None:
            return False
        b.results[i] = outcome
        b.done_at[i] = time.monotonic() - b.t0
        b.remaining -= 1
        return True

    def _payload(self, b: _Batch, i: int) -> bytes | None:
        if i not in b.payloads:
            response, gold = b.pairs[i]
            try:
                b.payloads[i] = pickle.dumps((i, response, gold, None), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:  # noqa: BLE001 — the pair cannot be sent: an error, not a crash
                self._record(b, i, self._outcome(
                    Status.ERROR, f"could not send item to worker: {type(exc).__name__}: {exc}"))
                return None
        return b.payloads[i]

    def _with_parsed_gold(self, b: _Batch, i: int, w: _Worker, payload: bytes) -> bytes:
        """The item's message for `w`, with the gold's parse attached when another worker parsed it
        and `w` has not got it: a gold is parsed once per pool, and a worker that replaces a killed
        one does not parse the golds of the batch again."""
        gold = b.pairs[i][1]
        if not isinstance(gold, str) or gold in w.golds:
            return payload
        if len(w.golds) > 4096:  # about what a worker keeps (math_verifier._GOLD_CACHE)
            w.golds.clear()
        w.golds.add(gold)
        parsed = self._parsed_golds.get(gold)
        if parsed is None:
            return payload  # `w` parses it and reports the parse with its result
        response = b.pairs[i][0]
        return pickle.dumps((i, response, gold, parsed), protocol=pickle.HIGHEST_PROTOCOL)

    def _stuck(self, w: _Worker, now: float) -> bool:
        """Running one item for longer than `_sideline_after` (maybe a hang)."""
        return bool(w.queue) and now - w.clock >= self._sideline_after

    def _pick(self, b: _Batch, w: _Worker, now: float) -> int:
        """Position in the to-do list of the next item for `w` (see `_AFFINITY_WINDOW`)."""
        for k in range(min(_AFFINITY_WINDOW, len(b.todo))):
            gold = b.pairs[b.todo[k]][1]
            home = self._gold_home.get(gold) if isinstance(gold, str) else None
            if home is None or home is w or home not in self._workers or not home.ready or self._stuck(home, now):
                return k
        return 0

    def _dispatch(self, b: _Batch) -> None:
        """Top up every ready worker to `_PREFETCH` items, except one stuck on a slow item."""
        for w in self._workers:
            while w.ready and len(w.queue) < _PREFETCH and b.todo:
                now = time.monotonic()
                if self._stuck(w, now):
                    break  # do not queue behind a possible hang
                k = self._pick(b, w, now)
                i = b.todo[k]
                payload = None if b.results[i] is not None else self._payload(b, i)
                if payload is None:  # already answered (it was queued behind a slow item) or unpicklable
                    del b.todo[k]
                    continue
                if w.queue and len(payload) > _PREFETCH_MAX_BYTES:
                    break
                try:
                    w.conn.send_bytes(self._with_parsed_gold(b, i, w, payload))
                except OSError:  # the worker died between items; _receive sees its EOF and replaces it
                    break
                del b.todo[k]
                if not w.queue:
                    w.clock, w.wait_mark = now, _wait_s(w.process.pid)
                w.queue.append(i)
                gold = b.pairs[i][1]
                if isinstance(gold, str):
                    if len(self._gold_home) > 100_000:  # bound the memory of a long-lived pool
                        self._gold_home.clear()
                    self._gold_home[gold] = w

    def _next_wakeup(self, b: _Batch) -> float | None:
        """Seconds until the earliest deadline, sideline point or start-up limit (None: no limit)."""
        now = time.monotonic()
        times = [w.clock + self.timeout_s for w in self._workers if w.queue]
        times += [w.clock + self._sideline_after for w in self._workers if w.queue]
        # A sidelined item's charged time grows at most as fast as the wall clock: check again when it
        # could meet a kill rule of `_enforce_deadlines` at the earliest.
        limit = self.timeout_s + _KILL_MARGIN_S
        for w in self._sidelined:
            if w.queue:
                need = limit if now < w.clock + limit else self.hang_share * self.timeout_s
                times += [w.clock + self.wall_cap_s, now + max(0.01, need - self._item_time(w, now))]
                times += [w.clock + limit] if now < w.clock + limit else []
        times += [w.started_at + _START_TIMEOUT_S for w in self._workers + self._spares if not w.ready]
        return max(0.0, min(times) - now) if times else None

    def _receive(self, b: _Batch, timeout: float | None) -> None:
        """Read results and ready signals; a closed pipe means the worker died."""
        listening = {w.conn: w for w in self._workers + self._sidelined + self._spares}
        for conn in wait(list(listening), timeout):
            w = listening[conn]
            if not any(w is x for x in self._workers + self._sidelined + self._spares):
                continue  # retired or killed while an earlier message of this round was handled
            try:
                while conn.poll():
                    kind, payload = conn.recv()
                    if kind == "ready":
                        w.ready = True
                    elif kind == "forked":
                        self._adopt_fork(w, payload)
                    elif kind == "result":
                        i, outcome, parsed_golds = payload
                        for gold, parsed in parsed_golds:
                            if len(self._parsed_golds) > 100_000:  # bound a long-lived pool's memory
                                self._parsed_golds.clear()
                            self._parsed_golds[gold] = parsed
                            w.golds.add(gold)
                        now = time.monotonic()
                        assert w.queue and w.queue[0] == i, (w.queue, i)
                        w.queue.popleft()
                        self._since_spare += 1
                        if self._record(b, i, outcome):
                            self.latencies.append(now - w.clock)
                        # The next queued item started when this one ended.
                        w.clock, w.wait_mark = now, _wait_s(w.process.pid) if w.queue else None
                        if w in self._sidelined:
                            if not w.queue:
                                self._reinstate(w)
                            # else it goes on with what was queued behind, charged from now
                    elif kind == "failed":
                        self._kill(w)
                        raise RuntimeError(f"verifier worker for {self.name!r} failed to start: {payload}")
            except (EOFError, OSError):
                self._on_death(b, w)

    def _on_death(self, b: _Batch, w: _Worker) -> None:
        """A worker died (segfault, OOM kill): its running item is an error, not a wrong answer."""
        if not any(w is x for x in self._workers + self._sidelined + self._spares):
            return  # the pool retired it itself while reading its last message; nothing was lost
        if not w.ready and not isinstance(w.process, _Forked):
            # A fresh worker that cannot even start would fail the same way again: stop loudly.
            self._kill(w)
            raise RuntimeError(f"verifier worker for {self.name!r} died while starting")
        # A forked spare that died before its first message holds no item: it is replaced like any
        # crashed worker.
        self._crashes += 1
        if w in self._spares:
            self._kill(w)
            self._spares.remove(w)
            self._fill_spares()
            return
        if w.queue:
            self._record(b, w.queue.popleft(), self._outcome(
                Status.ERROR, f"worker process died (exit code {w.process.exitcode})"))
        self._give_back(b, w)
        if w in self._sidelined:  # its slot was filled when it was sidelined
            self._sidelined.remove(w)
            self._kill(w)
        else:
            self._replace(w)

    def _sideline(self, b: _Batch, w: _Worker) -> None:
        """`w` has run one item past `_sideline_after`: take it out of service and put a spare in its
        slot, so that a possible hang costs the batch no worker while it waits out its timeout.

        What was queued behind the slow item goes back to the to-do list for the others; `w` still
        runs it if the slow item finishes after all (the duplicates are dropped), then rejoins as a
        spare (`_reinstate`); if the slow item times out, `w` is killed (`_enforce_deadlines`). On a
        machine with a core per worker plus one, a hang then costs only `_sideline_after`.
        """
        for i in reversed(list(w.queue)[1:]):
            if b.results[i] is None:
                b.todo.appendleft(i)
        self._workers[self._workers.index(w)] = self._take_spare()
        self._sidelined.append(w)
        self._fill_spares()

    def _item_time(self, w: _Worker, now: float) -> float:
        """The time charged to the running item of `w`: its wall time less the time its process waited
        for a CPU since the item started (see the module docstring)."""
        wait = _wait_s(w.process.pid) if w.wait_mark is not None else None
        return now - w.clock if wait is None else max(0.0, now - w.clock - (wait - w.wait_mark))

    def _take_spare(self) -> _Worker:
        """The newest ready spare (a fresh worker if there is none)."""
        if not self._spares:
            return self._start_worker()
        spare = next((s for s in reversed(self._spares) if s.ready), self._spares[-1])
        self._spares.remove(spare)
        return spare

    def _reinstate(self, w: _Worker) -> None:
        """A sidelined worker finished after all: it is warm, so it becomes the newest spare."""
        self._sidelined.remove(w)
        w.wait_mark = None
        self._spares.append(w)
        while len(self._spares) > self.n_spares:
            self._retire(self._spares.pop(0))

    def _give_back(self, b: _Batch, w: _Worker) -> None:
        """Items sent to `w` but not started go back to the front of the to-do list, in order,
        unless they are already waiting there or queued on another worker (moved there from behind a slow item)."""
        held, w.queue = w.queue, deque()
        elsewhere = {i for x in self._workers for i in x.queue}
        waiting = set(b.todo)
        for i in reversed(held):
            if b.results[i] is None and i not in elsewhere and i not in waiting:
                b.todo.appendleft(i)

    def _enforce_deadlines(self, b: _Batch) -> None:
        now = time.monotonic()
        for w in list(self._sidelined):
            if not w.queue:
                continue
            charged, wall = self._item_time(w, now), now - w.clock
            limit = self.timeout_s + _KILL_MARGIN_S
            hang_like = wall >= limit and charged >= self.hang_share * self.timeout_s
            if charged >= limit or hang_like or wall >= self.wall_cap_s:
                i = w.queue.popleft()
                detail = f"worker killed after {charged:.2f} s of its own time ({wall:.2f} s wall; limit {self.timeout_s:g} s)"
                if charged < self.hang_share * self.timeout_s:
                    detail = (f"worker killed at the wall-clock cap of {self.wall_cap_s:g} s, starved of CPU "
                              f"({charged:.2f} s of its own time)")
                if self._record(b, i, self._outcome(Status.TIMEOUT, detail)):
                    self._kills += 1
                    self.latencies.append(now - w.clock)
                self._give_back(b, w)
                self._sidelined.remove(w)
                self._kill(w, wait=False)
                self._restarts += 1
        self._reap()
        for w in list(self._workers):
            if self._stuck(w, now):
                self._sideline(b, w)
        for w in self._workers + self._spares:
            if not w.ready and now >= w.started_at + _START_TIMEOUT_S:
                raise RuntimeError(f"verifier worker for {self.name!r} did not start within {_START_TIMEOUT_S:g} s")
