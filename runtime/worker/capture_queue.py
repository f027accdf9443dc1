"""Capture off the serving path: (state, size) units, ordered by what serving needs next.

A worker that captures in the background queues one unit per capture size of each state
(`GraphCaptureManager.begin`) and serves eagerly, reason "not_ready", every step whose padded
size has no graph yet; each unit publishes its graph atomically when done
(`GraphCaptureManager.capture_size`). Order: the active state's units first, then the other
states' in the order they were queued; within a state the sizes that served the most recent
batches first (counted by padded size), the smallest first before any batch was seen.

Where units run depends on the backend. Trace and compile record over stand-ins of the static
rows, so a background thread may run them beside serving. A CUDA capture must not overlap
kernels that other threads launch, so CUDA units run at step boundaries: the engine calls
`run_for(budget_s)` between steps, holding the worker's lock.

A unit that raises anything (an Exception or any other BaseException: SystemExit, a
KeyboardInterrupt raised inside it) counts as failed (``units_failed``, logged; its size serves
eager) and the queue goes on. In the background thread nothing propagates: the thread keeps
running the other units. In a calling thread (the step-boundary units of a CUDA engine) an
interrupt (a BaseException that is not an Exception) propagates after the unit is counted, so
Ctrl-C still stops the program. Units still pending when the queue is stopped are cancelled:
counted (``units_cancelled``, and in ``units_failed``) and logged. `stop` never waits past its
timeout and says whether the thread is still running (a hung unit cannot be cut off in Python;
it is left behind, a daemon thread).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from draftgraph.graphs import GraphCaptureError
from draftgraph.graphs.core.cancel import cancel_scope
from draftgraph.runtime.worker.state import RuntimeState

__all__ = ["CaptureQueue"]

logger = logging.getLogger(__name__)


class _Entry:
    """One queued manager: its state, the order it was queued in, and its phase (None: the
    state's draft step; else the name of one of the host's phases, see `runtime.worker.host_phases`)."""

    __slots__ = ("manager", "order", "paced", "phase", "state")

    def __init__(self, state: RuntimeState, manager: Any, order: int, paced: bool = True,
                 phase: str | None = None) -> None:
        self.state = state
        self.manager = manager
        self.order = order
        self.paced = paced
        self.phase = phase


IDLE_S = 0.05  # the background thread starts a unit after this long without a served step ...
MAX_WAIT_S = 10.0  # ... or after this long without a unit, so a busy server still progresses
EXIT_WAIT_S = 20.0  # at exit, the longest wait for a unit in progress (cancelled: ~0.1-1 s; a thread
# still in torch when the interpreter finalizes can abort it, so this bound is generous)
MAX_THREADS = 2  # background threads while units compile in the compile process (`_wanted_threads`)


class BatchLoad:
    """Which padded size serving needs most: the served batch sizes, recent and bounded
    (halved when one passes 65,536). The queue's order within a state."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: dict[int, int] = {}  # batch size -> steps

    def note(self, b: int) -> None:
        """Count one served batch of size ``b``."""
        seen = self._seen
        n = seen.get(b, 0) + 1
        seen[b] = n
        if n > 1 << 16:  # keep it recent and bounded
            self._seen = {k: v // 2 for k, v in seen.items() if v > 1}

    def first(self, manager: Any, sizes: list[int]) -> int:
        """Of ``sizes`` (pending in ``manager``), the one that served the most batches (padded
        by ``manager``), the smallest first on a tie or before any batch was seen."""
        load: dict[int, int] = {}
        for b, n in self._seen.items():
            p = manager.padded_size(b)
            if p is not None:
                load[p] = load.get(p, 0) + n
        return min(sizes, key=lambda s: (-load.get(s, 0), s))


class CaptureQueue:
    """Pending capture units of one worker. ``active`` returns the state serving now.

    One job, running a worker's capture units: their order, their runs in the calling or a
    background thread, and the counts of those runs share one lock, one list of entries and
    the set of units being taken, so they stay one class (the served sizes it orders by are
    `BatchLoad`'s).

    The background thread starts a unit when serving has been idle for ``idle_s`` (no step
    noted), or when ``max_wait_s`` passed since its last unit: a unit beside serving slows it
    down (measured on 2 cores: the demo's loop served 120 tokens/s beside a compile, 1,669
    without), so a busy server gets at most one unit per ``max_wait_s`` and an idle one all of
    them at once. ``max_wait_s = 0`` runs units back to back."""

    def __init__(self, active: Callable[[], RuntimeState], idle_s: float = IDLE_S,
                 max_wait_s: float = MAX_WAIT_S) -> None:
        self._active = active
        self.idle_s = idle_s
        self.max_wait_s = max_wait_s
        self._last_step = time.perf_counter()  # the latest noted step (queueing counts as one)
        self._last_unit = time.perf_counter()  # when the thread last finished (or started waiting)
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)
        self._entries: list[_Entry] = []
        self._order = 0
        self._load = BatchLoad()  # served batch sizes: the order within a state
        self._running = 0  # units being captured now
        self._taken: set[tuple[int, int]] = set()  # (id(manager), size) being captured now
        self._threads: list[threading.Thread] = []
        self.max_threads = MAX_THREADS  # more during a fill with several compile processes
        self.interrupt_at_exit: Callable[[], None] | None = None  # see `stop_at_exit`
        self._cancel = threading.Event()  # set at exit: the capture threads' recordings stop
        self.threaded = False  # a background thread runs the units (trace, compile)
        self._stopped = False
        self._abandoned = False  # stop timed out: the thread runs a unit that did not return
        self._atexit = False
        self.units_run = 0
        self.units_failed = 0  # raised, or cancelled by stop (see the module docstring)
        self.units_cancelled = 0  # pending when stop was called: never run
        self.idle_since: float | None = time.perf_counter()  # None while units are pending
        self.unit_s = 0.0  # seconds the units that ran took (over units_run: a unit's mean)
        self.compile_units = 0  # of units_run, those whose capture ran a compile (the compile backend) ...
        self.compile_unit_s = 0.0  # ... and their seconds (the others recorded and checked, or only recorded)
        self.unfinished_s = 0.0  # the longest a unit ran that failed or was cut off (a lower bound)
        self._unit_started: float | None = None  # when the latest unit in progress started

    # ---- queueing ----------------------------------------------------------------------------
    def add(self, state: RuntimeState, manager: Any, background_thread: bool, paced: bool = True,
            phase: str | None = None) -> None:
        """Queue every pending size of ``manager`` (``state``'s draft graphs, or its ``phase``);
        with ``background_thread`` start (or keep) the thread that runs them. ``paced=False``: its
        units compile in another process (only recording runs here), so they start at once,
        busy or not (the pacing of the class docstring is for units that compile here)."""
        with self._lock:
            self._entries.append(_Entry(state, manager, self._order, paced, phase))
            self._order += 1
            self.idle_since = None
            self._last_step = time.perf_counter()  # serving usually starts right after queueing
            self.threaded = self.threaded or background_thread
        if background_thread:
            self._ensure_thread()

    def note_batch(self, b: int) -> None:
        """Count a served batch size (for the order of the next units) and the step's time."""
        self._last_step = time.perf_counter()
        self._load.note(b)

    def pending(self) -> int:
        """Units not captured yet (including any being captured now)."""
        with self._lock:
            self._prune()
            return sum(len(e.manager.pending_sizes) for e in self._entries)

    def running_s(self) -> float | None:
        """Seconds the latest unit in progress has run (None when none runs)."""
        started = self._unit_started
        return None if started is None else time.perf_counter() - started

    # ---- running -----------------------------------------------------------------------------
    def _prune(self) -> None:
        """Drop entries with nothing pending (done, or released: release clears the pending)."""
        live = [e for e in self._entries if e.manager.pending_sizes]
        if len(live) != len(self._entries):
            self._entries = live
        if not live and self._running == 0 and self.idle_since is None:
            self.idle_since = time.perf_counter()
            self._done.notify_all()

    def _pick(self) -> tuple[_Entry, int] | None:
        """The next unit (see the module docstring), or None; the caller holds the lock."""
        self._prune()
        active = self._active()
        busy = {m for m, _ in self._taken}
        for entry in sorted(self._entries, key=lambda e: (e.state is not active, e.order)):
            manager = entry.manager
            if id(manager) in busy:  # one thread per manager: its backend compiles one unit at a time
                continue
            sizes = list(manager.pending_sizes)
            if not sizes:
                continue
            size = self._load.first(manager, sizes)
            self._taken.add((id(manager), size))
            return entry, size
        return None

    def run_one(self, interrupts: bool = True) -> bool:
        """Capture the next unit in the calling thread; False when none is pending (or stopped).
        A unit that raises is counted failed and logged; ``interrupts``: a BaseException that is
        not an Exception (KeyboardInterrupt, SystemExit) then propagates (the background thread
        passes False: it keeps going)."""
        with self._lock:
            if self._stopped:
                return False
            picked = self._pick()
            if picked is None:
                return False
            entry, size = picked
            self._running += 1
            started = self._unit_started = time.perf_counter()
        state = entry.state
        ran = False
        try:
            seconds = entry.manager.capture_size(size)
            ran = True
            self.unit_s += seconds
            if _publish_figures(entry, size, seconds):
                self.compile_units += 1
                self.compile_unit_s += seconds
            self.units_run += 1
        except (GraphCaptureError, ValueError) as exc:
            self.units_failed += 1
            log = logger.info if self._stopped else logger.warning  # cut off by stop: expected
            log("background capture of %r at size %d failed; that size serves eager: %s", state, size, exc)
        except Exception as exc:  # released meanwhile, or anything else: never kill the thread
            self.units_failed += 1
            logger.warning("background capture of %r at size %d stopped: %s", state, size, exc)
        except BaseException as exc:  # SystemExit, KeyboardInterrupt... raised by the unit itself
            self.units_failed += 1
            logger.error("capture of %r at size %d raised %s: counted failed, that size serves eager%s",
                         state, size, type(exc).__name__, "" if not interrupts else " (propagated)")
            if interrupts:
                raise
        finally:
            with self._lock:
                if not ran:
                    self.unfinished_s = max(self.unfinished_s, time.perf_counter() - started)
                if self._unit_started == started:
                    self._unit_started = None
                self._running -= 1
                self._taken.discard((id(entry.manager), size))
                self._prune()
        return True

    def paced(self) -> bool:
        """True when the next unit waits for its turn (see the class docstring): it compiles in
        this process. False when it compiles elsewhere, or none is pending."""
        with self._lock:
            self._prune()
            active = self._active()
            for entry in sorted(self._entries, key=lambda e: (e.state is not active, e.order)):
                if any((id(entry.manager), s) not in self._taken for s in entry.manager.pending_sizes):
                    return entry.paced
            return False

    def _wait_for_a_turn(self) -> None:
        """Background thread: wait until serving is idle or ``max_wait_s`` passed since the last
        unit (or the queue is stopped); no wait when the next unit compiles elsewhere."""
        if not self.paced():
            return
        while not self._stopped:
            now = time.perf_counter()
            if now - self._last_step >= self.idle_s or now - self._last_unit >= self.max_wait_s:
                return
            time.sleep(min(self.idle_s, 0.01))

    def run_for(self, budget_s: float) -> int:
        """Run units in the calling thread until ``budget_s`` is spent (at least one when any is
        pending); returns how many ran."""
        start = time.perf_counter()
        n = 0
        while self.run_one():
            n += 1
            if time.perf_counter() - start >= budget_s:
                break
        return n

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until nothing is pending (True) or ``timeout_s`` passes (False)."""
        deadline = None if timeout_s is None else time.perf_counter() + timeout_s
        with self._lock:
            while True:
                self._prune()
                if not self._entries and self._running == 0:
                    return True
                left = None if deadline is None else deadline - time.perf_counter()
                if left is not None and left <= 0:
                    return False
                self._done.wait(timeout=0.05 if left is None else min(left, 0.05))

    # ---- the background thread ---------------------------------------------------------------
    def stop(self, timeout_s: float | None = 60.0, interrupt: Callable[[], None] | None = None) -> bool:
        """Run no further unit (pending ones stay eager: cancelled, counted in ``units_failed``
        and logged) and wait up to ``timeout_s`` (never longer; None: without limit) for the
        one in progress. True when no unit is running any more; False, with a warning, when
        the thread still runs after the timeout (a hung unit: it is left behind as a daemon
        thread and publishes nothing the stopped queue does not expect). Called at exit as
        well: a capture thread must not be cut off while torch tears down. ``interrupt`` is
        called once no further unit can start and before the wait (the worker ends its compile
        process there, so a unit waiting on a compile returns at once, counted failed)."""
        return self._stop(timeout_s, log_cancelled=True, interrupt=interrupt)

    def stop_at_exit(self) -> None:
        """`stop` at interpreter exit, quickly and quietly: pending units are cancelled unlogged,
        ``interrupt_at_exit`` (the worker ends its compile processes there, so a unit waiting on a
        compile returns at once, and none compiles here instead) is called, and a unit still
        recording is cancelled at its next torch call (`graphs.core.cancel`) and waited for up to
        `EXIT_WAIT_S` (then it is left behind as a daemon thread: the store's
        writes are whole files renamed into place, so a cut-off one leaves no entry); no wait
        when a stop already gave up on the thread."""
        if not self._abandoned:
            self._cancel.set()  # a recording in progress stops at its next torch call
            self._stop(EXIT_WAIT_S, log_cancelled=False, interrupt=self.interrupt_at_exit, quiet=True)

    def _stop(self, timeout_s: float | None, log_cancelled: bool, interrupt: Callable[[], None] | None = None,
              quiet: bool = False) -> bool:
        with self._lock:
            first = not self._stopped
            self._stopped = True
            threads = list(self._threads)
            if first:
                self._prune()
                cancelled = sum(len([z for z in e.manager.pending_sizes if (id(e.manager), z) not in self._taken])
                                for e in self._entries)
                self.units_cancelled += cancelled
                self.units_failed += cancelled
                if cancelled and log_cancelled:
                    logger.warning("capture stopped: %d pending capture units cancelled (counted failed; "
                                   "their sizes serve eager)", cancelled)
        if interrupt is not None:
            interrupt()
        deadline = None if timeout_s is None else time.perf_counter() + timeout_s
        for thread in threads:
            if thread is threading.current_thread():
                continue
            thread.join(None if deadline is None else max(0.0, deadline - time.perf_counter()))
            if thread.is_alive():
                self._abandoned = True
                log = logger.info if quiet else logger.warning
                log("capture thread still running %s s after stop (a unit in progress did not return); "
                    "left behind as a daemon thread", timeout_s)
                return False
        return True

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._threads = [t for t in self._threads if t.is_alive()]
            while len(self._threads) < _wanted_threads(self._entries, self.max_threads):
                thread = threading.Thread(target=self._work, name="draftgraph-capture", daemon=True)
                self._threads.append(thread)
                thread.start()
            if not self._atexit:
                self._atexit = True
                ref = weakref.ref(self)
                atexit.register(_stop_at_exit, ref)

    def _work(self) -> None:
        """Run units until none is pending; a later `add` starts a new thread."""
        _lower_priority()
        with _short_gil_turns(), cancel_scope(self._cancel):
            self._work_loop()

    def _work_loop(self) -> None:
        self._last_unit = time.perf_counter()
        while True:
            self._wait_for_a_turn()
            if self.run_one(interrupts=False):
                self._last_unit = time.perf_counter()
                continue
            with self._lock:
                self._prune()
                if not self._entries or self._stopped or len(self._threads) > 1:
                    # done, or every manager left is another thread's: that one finishes it
                    with contextlib.suppress(ValueError):
                        self._threads.remove(threading.current_thread())
                    return
            time.sleep(0.01)  # every pending unit is being captured by another caller


def _publish_figures(entry: _Entry, size: int, seconds: float) -> bool:
    """Add a captured unit's figures to its state (the same figures a blocking capture records;
    a phase's only while the state still holds that phase's manager). True when it compiled."""
    state, manager = entry.state, entry.manager
    record = manager.stats.sizes.get(size)
    if entry.phase is not None:
        phases = state.phases
        if phases is not None and phases.managers.get(entry.phase) is manager:
            phases.figures[entry.phase].add_size(manager, size, seconds)
    else:
        state.capture_s += seconds
        if record is not None:
            state.compile_s += record.compile_s
            state.capture_bytes += record.capture_bytes or 0
        state.nodes[size] = manager.node_count(size)
    return record is not None and record.compiles > 0


def _wanted_threads(entries: list[_Entry], max_threads: int) -> int:
    """Background threads worth running over ``entries`` (the caller holds the queue's lock): one,
    or up to ``max_threads`` (`MAX_THREADS`; one per compile process during a fill) while at least
    two managers wait and none of them compiles here. A unit that compiles in the compile process
    spends most of its time waiting for it; a second thread meanwhile records and checks another
    state's units, so this process's work and the compile process's overlap (a cold fill measured
    66 s one unit after another). Units that compile here stay one at a time: they are paced to
    spare serving."""
    live = [e for e in entries if e.manager.pending_sizes]
    if len(live) < 2 or any(e.paced for e in live):
        return 1
    return min(max_threads, len(live))


def _lower_priority() -> None:
    """Give this thread (and the compilers it starts) a lower CPU priority than serving (Linux
    schedules threads one by one; elsewhere, or without permission, nothing changes)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except (AttributeError, OSError):
        pass


_SWITCH_S = 0.0002  # GIL hand-over interval while a capture thread runs (Python's default: 5 ms)
_turns = {"threads": 0, "saved": 0.0}
_turns_lock = threading.Lock()


@contextlib.contextmanager
def _short_gil_turns() -> Iterator[None]:
    """While capture threads run, hand the GIL over every 0.2 ms instead of every 5 ms.

    Serving releases the GIL around every torch op and must take it back after each; with
    Python's 5 ms interval a busy capture thread (inductor's codegen is Python) makes it wait
    up to 5 ms per op (measured: the demo's serving loop fell from 300 to 74 tokens/s). The
    interval is process-wide, so it is restored when the last capture thread ends."""
    with _turns_lock:
        if _turns["threads"] == 0:
            _turns["saved"] = sys.getswitchinterval()
            sys.setswitchinterval(min(_SWITCH_S, _turns["saved"]))
        _turns["threads"] += 1
    try:
        yield
    finally:
        with _turns_lock:
            _turns["threads"] -= 1
            if _turns["threads"] == 0:
                sys.setswitchinterval(_turns["saved"])


def _stop_at_exit(ref: weakref.ref[CaptureQueue]) -> None:
    """At interpreter exit: let a running unit finish (bounded) and start no other."""
    queue = ref()
    if queue is not None:
        queue.stop_at_exit()
