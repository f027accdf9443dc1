"""The request table has one owner: other threads only post adds and aborts, the stepping thread
applies them at its step boundary. Race tests in process (bounded in count and time)."""

from __future__ import annotations

import random
import sys
import threading
import time

from draftgraph.runtime.engine.request_table import RequestTable
from draftgraph.runtime.engine.stats import EngineStats

ADDERS = 3
ADDS_PER_THREAD = 1500
DEADLINE_S = 60.0


def _table(slots: int = 2) -> RequestTable:
    return RequestTable(slots, vocab_size=100, max_len=64, reserve=4, stats=EngineStats())


def _step(table: RequestTable, rng: random.Random) -> None:
    """What the engine's step does with the table: the boundary, admissions, ends."""
    table.begin_step()
    for req in table.admissions():
        table.admitted(req)
    for req in table.running:
        if rng.random() < 0.3:
            req.output.append(1)
            req.done = True
    table.retire_done()


def test_adds_beside_aborts_of_waiting_requests_never_break_a_step():
    """Threads add while the stepping thread aborts waiting requests and steps: no step raises,
    every abort lands exactly once, and nothing stays live once everything ended. On the old
    table (a waiting request removed from the deque outside the lock the adders append under)
    the step raised "deque mutated during iteration" and aborts were lost."""
    table, rng = _table(), random.Random(0)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch often: the race shows within seconds
    try:
        _race(table, rng)
    finally:
        sys.setswitchinterval(switch)


def _race(table: RequestTable, rng: random.Random) -> None:
    ids: list[int] = []
    ids_lock = threading.Lock()
    stop_at = time.monotonic() + DEADLINE_S

    def adder() -> None:
        for _ in range(ADDS_PER_THREAD):
            if time.monotonic() > stop_at:
                return
            rid = table.add([1, 2, 3], 4)
            with ids_lock:
                ids.append(rid)

    threads = [threading.Thread(target=adder, daemon=True) for _ in range(ADDERS)]
    for t in threads:
        t.start()
    errors: list[BaseException] = []
    aborted: set[int] = set()
    steps = 0
    while any(t.is_alive() for t in threads) and time.monotonic() < stop_at:
        with ids_lock:
            chosen = rng.sample(ids, min(len(ids), 40))
        for rid in chosen:
            try:
                if table.abort(rid):
                    aborted.add(rid)
            except KeyError:
                pass
        try:
            _step(table, rng)
        except Exception as exc:  # the old table: RuntimeError / ValueError out of begin_step
            errors.append(exc)
        steps += 1
    for t in threads:
        t.join(5.0)
    for rid in ids:  # every client leaves: abort all, then step until the table is empty
        table.abort(rid)
    for _ in range(20_000):
        if not table.has_work():
            break
        _step(table, rng)
    assert not errors, f"{len(errors)} of {steps} steps raised, first: {errors[0]!r}"
    assert not table.has_work() and table.next_batch_size() == 0
    ended = [table.pop_result(rid) for rid in ids]
    assert all(out is not None for out in ended), "a request is still live after every client left"
    counts = table.stats.snapshot()
    assert counts["requests_aborted"] + counts["requests_finished"] == len(ids)


def test_an_abort_applies_once_wherever_the_request_is():
    """Posted before its add was applied, while waiting, while running, after it finished, and
    twice: each request ends once, counted once."""
    table, rng = _table(slots=1), random.Random(1)
    first = table.add([1], 4)
    assert table.abort(first) and table.abort(first)  # before any boundary: still live, asked twice
    running = table.add([1], 4)
    waiting = table.add([2], 4)
    _step(table, random.Random(99))  # first aborted; `running` admitted
    assert table.pop_result(first) == []
    table.running[0].done = False
    assert [r.rid for r in table.running] == [running]
    assert table.abort(waiting) and table.abort(running)
    table.begin_step()
    assert not table.has_work()
    assert table.pop_result(waiting) == [] and table.pop_result(running) == []
    done = table.add([3], 1)
    while table.has_work():
        _step(table, rng)
    assert table.abort(done) is False  # ended already: nothing to apply
    table.begin_step()
    assert table.stats.snapshot()["requests_aborted"] == 3
    assert table.stats.snapshot()["requests_finished"] == 1


def test_the_inbox_is_bounded():
    """Adds not yet applied are bounded (`max_inbox`): the one past it is refused, not queued."""
    table = RequestTable(1, 100, 64, 4, EngineStats(), max_inbox=8)
    for _ in range(8):
        table.add([1], 2)
    try:
        table.add([1], 2)
    except RuntimeError as exc:
        assert "inbox" in str(exc)
    else:
        raise AssertionError("the 9th add was queued past max_inbox=8")
    table.begin_step()
    table.add([1], 2)  # drained at the boundary: room again
