"""The capture queue's threads: two while units of several managers compile in the compile
process (one records and checks while the other waits for a compile), one otherwise, and never
two units of one manager at once."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from draftgraph.runtime.worker.capture_queue import MAX_THREADS, CaptureQueue

TIMEOUT_S = 30.0  # a bound on every wait below (the units take milliseconds)


class _Manager:
    """A stand-in for a graph manager: each unit waits on ``gate`` (a compile in another process)
    and notes which units ran together."""

    def __init__(self, name: str, sizes: tuple[int, ...], log: _Log, gate: threading.Event | None = None) -> None:
        self.name = name
        self.pending_sizes = set(sizes)
        self.stats = SimpleNamespace(sizes={})
        self._log = log
        self._gate = gate

    def padded_size(self, b: int) -> int | None:
        return b if b in self.pending_sizes else None

    def node_count(self, size: int) -> int:
        return 1

    def capture_size(self, size: int) -> float:
        self._log.enter(self.name)
        try:
            if self._gate is not None and not self._gate.wait(TIMEOUT_S):
                raise RuntimeError("the test's gate never opened")
            time.sleep(0.002)
        finally:
            self._log.leave(self.name)
        self.pending_sizes.discard(size)
        return 0.002


class _Log:
    """Units in flight, by manager name, and the most seen at once (overall and per manager)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now: dict[str, int] = {}
        self.most = 0
        self.most_one_manager = 0
        self.together: set[frozenset[str]] = set()

    def enter(self, name: str) -> None:
        with self._lock:
            self.now[name] = self.now.get(name, 0) + 1
            live = frozenset(k for k, v in self.now.items() if v)
            self.together.add(live)
            self.most = max(self.most, sum(self.now.values()))
            self.most_one_manager = max(self.most_one_manager, self.now[name])

    def leave(self, name: str) -> None:
        with self._lock:
            self.now[name] -= 1


def _state() -> SimpleNamespace:
    return SimpleNamespace(capture_s=0.0, compile_s=0.0, capture_bytes=0, nodes={}, phases=None)


def _threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "draftgraph-capture"]


def test_units_compiling_elsewhere_run_two_managers_at_once_never_one_manager_twice():
    log = _Log()
    gate = threading.Event()  # the "compile process": closed until both threads are inside a unit
    states = [_state(), _state()]
    queue = CaptureQueue(lambda: states[0], idle_s=0.0, max_wait_s=0.0)
    managers = [_Manager(n, (1, 2, 4, 8), log, gate) for n in ("a", "b")]
    for state, manager in zip(states, managers):
        queue.add(state, manager, background_thread=True, paced=False)
    deadline = time.monotonic() + TIMEOUT_S
    while log.most < 2 and time.monotonic() < deadline:  # both wait at the gate: two threads
        time.sleep(0.001)
    assert log.most == 2 and len(_threads()) == MAX_THREADS == 2
    gate.set()
    assert queue.wait(TIMEOUT_S) and queue.stop(TIMEOUT_S)
    assert queue.units_run == 8 and queue.units_failed == 0
    assert log.most_one_manager == 1  # one backend never runs two of its units at once
    assert frozenset({"a", "b"}) in log.together
    assert all(not m.pending_sizes for m in managers)


def test_units_compiling_here_run_one_at_a_time():
    log = _Log()
    states = [_state(), _state()]
    queue = CaptureQueue(lambda: states[0], idle_s=0.0, max_wait_s=0.0)
    for state, name in zip(states, ("a", "b")):
        queue.add(state, _Manager(name, (1, 2, 4), log), background_thread=True, paced=True)
    assert len(_threads()) == 1
    assert queue.wait(TIMEOUT_S) and queue.stop(TIMEOUT_S)
    assert queue.units_run == 6 and log.most == 1


def test_one_manager_left_is_finished_by_one_thread_and_the_other_ends():
    log = _Log()
    gate = threading.Event()
    states = [_state(), _state()]
    queue = CaptureQueue(lambda: states[0], idle_s=0.0, max_wait_s=0.0)
    queue.add(states[0], _Manager("long", tuple(range(1, 9)), log, gate), background_thread=True, paced=False)
    queue.add(states[1], _Manager("short", (1,), log), background_thread=True, paced=False)
    deadline = time.monotonic() + TIMEOUT_S
    while queue.units_run < 1 and time.monotonic() < deadline:  # "short" done; "long" waits at the gate
        time.sleep(0.001)
    while len(_threads()) > 1 and time.monotonic() < deadline:  # the idle thread ends, not spins
        time.sleep(0.001)
    assert queue.units_run == 1 and len(_threads()) == 1
    gate.set()
    assert queue.wait(TIMEOUT_S) and queue.stop(TIMEOUT_S)
    assert queue.units_run == 9 and log.most_one_manager == 1 and not _threads()
