"""Capture off the serving path: units queued by (state, size), run by a background thread
(trace, compile) while steps are served eagerly; published whole; cancelled with their state;
reloads that swap only when ready; start-up figures in the engine."""

from __future__ import annotations

import queue
import threading
import time

import pytest
import torch
from engine_support import MAX_NEW, models, prompts, reference

from draftgraph.graphs.compile.inductor import compiler_available
from draftgraph.runtime import (
    CudaGraphConfig,
    PhaseGraphConfig,
    RuntimeArgs,
    SpeculativeConfig,
)
from draftgraph.runtime.engine import SpecDecodeEngine
from draftgraph.runtime.testing import make_draft_input

SIZES = (1, 2, 4, 8)
SPEC = SpeculativeConfig(3, 2, 6)  # the workers' draft shape (as `_args` gives it)
MAX_SERVE_ROUNDS = 20_000  # a bound on serving while graphs publish (a few hundred suffice)


def _args(s: int = 3, k: int = 2, n: int | None = 6, sizes=SIZES) -> RuntimeArgs:
    return RuntimeArgs(SpeculativeConfig(s, k, n), CudaGraphConfig(PhaseGraphConfig(bs=sizes)))


def _same(got, want) -> bool:
    return all(torch.equal(a, b) for a, b in zip(got, want))


def test_steps_from_another_thread_equal_eager_while_graphs_publish(make_worker):
    w, ref = make_worker(SPEC, bs=SIZES, backend=None), make_worker(SPEC, bs=SIZES, backend=None)
    w.capture.queue.max_wait_s = 0.0  # units back to back beside serving (not only when idle)
    w.capture_graphs("trace", background=True)
    assert not w.capture.ready() and w.state.graphs.pending_sizes == SIZES
    errors: list[str] = []
    served = {"steps": 0}

    def serve() -> None:
        for _ in range(MAX_SERVE_ROUNDS):  # bounded by steps, not by the clock
            if w.capture.ready():
                return
            for b in (1, 3, 6):
                inp = make_draft_input(b, 2, seed=served["steps"])
                if not _same(w.draft_forward(inp), ref.draft_forward(inp)):
                    errors.append(f"b={b} step {served['steps']}")
                served["steps"] += 1

    t = threading.Thread(target=serve)
    t.start()
    t.join(90)
    assert not t.is_alive(), "serving thread did not finish"
    assert errors == []
    assert w.capture.wait(30) and w.state.graphs.is_captured
    c = w.counters
    assert c.eager_steps_by_reason.get("not_ready", 0) > 0  # served eagerly while capturing
    before = c.graph_replays
    for b in (1, 3, 6):
        inp = make_draft_input(b, 2, seed=b)
        assert _same(w.draft_forward(inp), ref.draft_forward(inp))
    assert w.counters.graph_replays == before + 3  # every size is ready now
    assert w.state.capture_s > 0


def test_active_state_first_and_most_seen_sizes_first(monkeypatch, make_worker):
    from draftgraph.runtime.worker.capture_queue import CaptureQueue

    monkeypatch.setattr(CaptureQueue, "_ensure_thread", lambda self: None)  # units run only here
    w = make_worker(SPEC, bs=(1, 2, 4, 8), backend=None)
    other = w.build_runtime_state(2, 4, backend="trace", background=True)  # queued first
    w.capture_graphs("trace", background=True)  # the active state: captured before `other`
    for _ in range(5):
        w.capture.queue.note_batch(6)  # padded 8: the size serving needs most
    order: list[tuple[int, int]] = []
    while w.capture.queue.pending():
        before = {id(s): set(s.graphs.captured_sizes) for s in (w.state, other)}
        assert w.capture.run_pending(0.0) == 1
        for s in (w.state, other):
            new = set(s.graphs.captured_sizes) - before[id(s)]
            order += [(s.num_steps, size) for size in new]
    assert order[:4] == [(3, 8), (3, 1), (3, 2), (3, 4)]
    assert order[4:] == [(2, 8), (2, 1), (2, 2), (2, 4)]


def test_releasing_a_state_cancels_its_pending_units(make_worker):
    w = make_worker(SPEC, bs=SIZES, backend=None)
    state = w.build_runtime_state(2, 4, backend="trace", background=True)
    manager = state.graphs
    state.release()
    assert manager.pending_sizes == () and manager.captured_sizes == ()
    assert w.capture.queue.pending() == 0 and w.capture.ready()
    assert w.capture.wait(5)


def test_a_failed_unit_leaves_its_size_eager_and_serving_goes_on(caplog, make_worker):
    w, ref = make_worker(SPEC, bs=(2, 4), backend=None), make_worker(SPEC, bs=(2, 4), backend=None)
    w.capture_graphs("trace", background=True)
    manager = w.state.graphs
    real = manager._capture_one

    def fail_at_4(backend, size, copies=False):
        if size == 4:
            raise MemoryError("injected")
        return real(backend, size, copies)

    manager._capture_one = fail_at_4
    assert w.capture.wait(30)
    assert manager.captured_sizes == (2,) and set(manager.failed_sizes) == {4}
    for b in (2, 3):
        inp = make_draft_input(b, 2, seed=b)
        assert _same(w.draft_forward(inp), ref.draft_forward(inp))
    assert w.counters.eager_steps_by_reason == {"capture_failed": 1}
    assert "size 4 failed" in caplog.text


def test_a_prepared_reload_commits_only_when_ready(make_worker):
    w = make_worker(SPEC, bs=SIZES, backend=None)
    w.capture_graphs("trace")
    prepared = w.reloads.prepare(_args(s=2, n=4), backend="trace", background=True)
    assert not prepared.ready and w.spec.num_steps == 3  # the old state keeps serving
    assert w.capture.wait(30) and prepared.ready and prepared.failed_sizes == {}
    w.reloads.commit(prepared)
    assert w.spec.num_steps == 2 and w.state.has_graphs and w.state.graphs.is_captured


def test_stop_runs_no_further_unit(make_worker):
    w = make_worker(SPEC, bs=SIZES, backend=None)
    w.capture_graphs("trace", background=True)
    assert w.capture.stop(30)  # True: the capture thread has ended (joined), not only been told
    left = w.capture.queue.pending()
    assert not [t for t in threading.enumerate() if t.name == "draftgraph-capture"]
    assert w.capture.queue.pending() == left and w.capture.run_pending(0.0) == 0  # nothing more is captured
    inp = make_draft_input(3, 2)
    w.draft_forward(inp)  # still serving


@pytest.mark.parametrize("backend", ["trace", pytest.param("compile", marks=[pytest.mark.slow, pytest.mark.skipif(
    not compiler_available(), reason="no C++ compiler for inductor")])])  # compile: the slow tier (inductor)
def test_engine_lossless_with_background_capture_and_startup_figures(backend):
    target, head = models("eagle")
    args = RuntimeArgs(SpeculativeConfig(3, 1), CudaGraphConfig(PhaseGraphConfig(bs=(1, 2, 4))),
                       max_running_requests=8)
    engine = SpecDecodeEngine(args, target, head, backend=backend)
    st = engine.startup()  # nothing captured in the constructor: every size pending
    assert st["capture"] == "background" and st["graphs_ready_s"] is None
    assert st["states"][0]["sizes_pending"] == [1, 2, 4]
    ids = [engine.add_request(list(p), MAX_NEW) for p in prompts()[:6]]
    while engine.has_work():
        engine.step()
    assert [engine.result(i) for i in ids] == reference()[:6]
    assert engine.worker.capture.wait(300)
    st = engine.startup()
    assert st["graphs_ready_s"] is not None and st["graphs_ready_s"] >= st["startup_s"]
    assert st["states"][0]["sizes_ready"] == [1, 2, 4] and st["capture_s"] > 0
    assert (st["capture_units_run"], st["capture_units_failed"]) == (3, 0)
    assert (st["compile_s"] > 0) == (backend == "compile")
    ids = [engine.add_request(list(p), MAX_NEW) for p in prompts()[6:10]]
    while engine.has_work():
        engine.step()
    assert [engine.result(i) for i in ids] == reference()[6:10]
    assert engine.stats()["graph_replays"] > 0
    engine.close()


class _Clock:
    """The capture queue's clock, moved by the test: ``perf_counter`` reads ``now``; ``sleep``
    really sleeps (briefly) so the capture thread yields, without moving ``now``."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        time.sleep(min(seconds, 0.001))


def test_a_busy_server_gets_a_unit_per_max_wait_an_idle_one_all(monkeypatch, make_worker):
    from draftgraph.runtime.worker import capture_queue

    clock = _Clock()
    monkeypatch.setattr(capture_queue, "time", clock)  # the queue's pacing runs on the test's clock
    sizes = tuple(range(1, 9))
    w = make_worker(SPEC, bs=sizes, backend=None)
    w.capture.queue.max_wait_s = 1.5
    started: queue.Queue[float] = queue.Queue()  # the clock when each unit started
    w.capture_graphs("trace", background=True)
    _inject(w.state.graphs, {s: (lambda: started.put(clock.now)) for s in sizes})
    inp = make_draft_input(1, 2)
    t0 = clock.now
    for _ in range(200):  # busy: a step every 20 ms (under IDLE_S) for 4 s of the queue's clock
        clock.now += 0.02
        w.draft_forward(inp)
    # still busy (no time passes now): the max_wait rule alone lets one unit run, at >= 1.5 s
    first = started.get(timeout=60)
    assert first - t0 >= 1.5
    # paced: every later unit of the busy period starts 1.5 s (of the clock) after the one before
    busy = [first]
    while not started.empty():
        busy.append(started.get())
    # so at most 2 of the 8 in [1.5 s, 4 s]: not all, which back to back take well under 4 s
    assert all(b - a >= 1.5 for a, b in zip(busy, busy[1:])) and len(busy) <= 2
    clock.now += 1.0  # idle (no step for 1 s > IDLE_S): the rest at once, whatever the pacing
    for _ in range(8 - len(busy)):
        started.get(timeout=60)
    assert w.capture.stop(60)  # the thread has ended: every unit published, none cancelled
    assert started.empty() and w.capture.queue.units_cancelled == 0
    assert w.state.graphs.captured_sizes == sizes and w.capture.queue.pending() == 0


def test_units_that_compile_elsewhere_are_not_paced(monkeypatch, make_worker):
    """A unit whose compile runs in the compile process holds this process only to record: a
    busy server gets every unit back to back (the clock never lets a paced one start)."""
    from draftgraph.graphs.manager import GraphCaptureManager
    from draftgraph.runtime.worker import capture_queue

    clock = _Clock()
    monkeypatch.setattr(capture_queue, "time", clock)
    monkeypatch.setattr(GraphCaptureManager, "compiles_elsewhere", property(lambda self: True))
    sizes = (1, 2, 4, 8)
    w = make_worker(SPEC, bs=sizes, backend=None)
    w.capture.queue.max_wait_s = 1e9  # a paced unit would never start while busy
    w.capture_graphs("trace", background=True)
    assert w.capture.queue.paced() is False
    inp = make_draft_input(1, 2)
    for _ in range(MAX_SERVE_ROUNDS):  # busy: a step every 20 ms of the queue's clock
        clock.now += 0.02
        w.draft_forward(inp)
        if not w.capture.queue.pending():
            break
    assert w.state.graphs.captured_sizes == sizes and w.capture.queue.units_run == len(sizes)


# ---- issue 32: units that raise anything, hang, or are cancelled ------------------------------
def _inject(manager, fault_at: dict):
    """Make ``manager``'s capture of the listed sizes call ``fault_at[size]()`` instead."""
    real = manager._capture_one

    def capture_one(backend, size, copies=False):
        if size in fault_at:
            fault_at[size]()
        return real(backend, size, copies)

    manager._capture_one = capture_one


def _raise(exc: BaseException):
    def go():
        raise exc
    return go


def test_a_unit_raising_system_exit_fails_alone_and_the_thread_goes_on(caplog, make_worker):
    w = make_worker(SPEC, bs=(1, 2, 4, 8), backend=None)
    w.capture_graphs("trace", background=True)
    manager = w.state.graphs
    _inject(manager, {2: _raise(SystemExit(3)), 4: _raise(KeyboardInterrupt())})
    assert w.capture.wait(60), f"capture thread died: {w.capture.queue.pending()} units pending"
    assert manager.captured_sizes == (1, 8) and set(manager.failed_sizes) == {2, 4}
    q = w.capture.queue
    assert (q.units_run, q.units_failed) == (2, 2)
    assert "SystemExit" in caplog.text and "KeyboardInterrupt" in caplog.text
    # a later reload's units still land: the queue is alive
    prepared = w.reloads.prepare(_args(s=2, n=4), backend="trace", background=True)
    assert w.capture.wait(60) and prepared.ready and prepared.failed_sizes == {}


def test_an_interrupt_in_a_calling_thread_unit_is_counted_then_propagates(monkeypatch, make_worker):
    from draftgraph.runtime.worker.capture_queue import CaptureQueue

    monkeypatch.setattr(CaptureQueue, "_ensure_thread", lambda self: None)  # units run only here
    w = make_worker(SPEC, bs=(1, 2), backend=None)
    w.capture_graphs("trace", background=True)
    _inject(w.state.graphs, {1: _raise(KeyboardInterrupt())})
    with pytest.raises(KeyboardInterrupt):
        w.capture.run_pending(10.0)
    q = w.capture.queue
    assert q.units_failed == 1 and q.pending() == 1  # counted; the other unit still queued
    assert w.capture.run_pending(10.0) == 1 and q.pending() == 0 and q.units_run == 1


def test_a_hung_unit_stop_returns_at_its_timeout_and_says_so_pending_ones_cancelled(caplog, make_worker):
    w = make_worker(SPEC, bs=(1, 2, 4, 8), backend=None)
    release, entered = threading.Event(), threading.Event()

    def hang():
        entered.set()
        release.wait(60)

    w.capture_graphs("trace", background=True)
    _inject(w.state.graphs, {1: hang})
    try:
        assert entered.wait(30)
        assert w.capture.stop(0.3) is False  # the thread still runs: said (it returned before the unit did)
        q = w.capture.queue
        assert q.units_cancelled == 3 and q.units_failed == 3  # 2, 4, 8 never ran
        assert "still running" in caplog.text and "3 pending capture units cancelled" in caplog.text
    finally:
        release.set()
    assert w.capture.stop(30) is True


def test_pending_units_get_an_estimate_from_the_units_that_ran(make_worker):
    from draftgraph.runtime.commands.cli import _ready_text
    from draftgraph.runtime.engine.report import graphs_eta

    w = make_worker(SPEC, bs=(1, 2, 4, 8), backend=None)
    q = w.capture.queue
    assert graphs_eta(q, 0) is None
    release, entered = threading.Event(), threading.Event()

    def hang():
        entered.set()
        release.wait(60)

    w.capture_graphs("trace", background=True)
    _inject(w.state.graphs, {4: hang})  # before any batch: the smallest first, so 1 and 2 ran
    try:
        assert entered.wait(30)
        assert w.state.graphs.pending_compiles == 0  # trace: nothing compiles
        eta = graphs_eta(q, len(w.state.graphs.pending_sizes), w.state.graphs.pending_compiles)
        assert (eta["pending"], eta["basis"], eta["units_measured"]) == (2, "measured", 2)
        assert (eta["compiles"], eta["checks"], eta["compiles_measured"]) == (0, 2, 0)
        assert eta["per_check_s"] > 0 and eta["seconds"] == pytest.approx(2 * eta["per_check_s"])
        assert eta["paced_s"] == q.max_wait_s
        report = {"graphs_ready_s": None, "capture": "background", "graphs_eta": eta,
                  "states": [{"sizes_ready": [1, 2], "sizes_pending": [4, 8], "sizes_failed": []}]}
        text = _ready_text(report)
        assert text.startswith("not yet: 2 of 4 capture units pending (background); compiling them takes about ")
        assert "2 without a compile at " in text and "the mean of 2 here" in text
        assert "served eager meanwhile" in text
        assert graphs_eta(q, 2, earlier_check_s=30.0)["basis"] == "measured"  # this run's units come first
    finally:
        release.set()
    assert w.capture.stop(30)


def test_before_any_unit_ran_the_estimate_is_from_earlier_runs(make_worker):
    from draftgraph.runtime.commands.cli import _ready_text
    from draftgraph.runtime.engine.report import graphs_eta

    w = make_worker(SPEC, bs=(1, 2), backend=None)
    q = w.capture.queue
    eta = graphs_eta(q, 2, compiles=1, earlier_compile_s=7.5, earlier_check_s=0.5)
    assert eta == {"pending": 2, "compiles": 1, "checks": 1, "per_compile_s": 7.5, "per_check_s": 0.5,
                   "compile_basis": "earlier runs", "check_basis": "earlier runs", "seconds": 8.0,
                   "basis": "earlier runs", "units_measured": 0, "compiles_measured": 0,
                   "paced_s": None}  # nothing queued: nothing paced
    assert graphs_eta(q, 2)["basis"] == "unknown"
    report = {"graphs_ready_s": None, "capture": "background", "graphs_eta": eta,
              "states": [{"sizes_ready": [], "sizes_pending": [1, 2], "sizes_failed": []}]}
    text = _ready_text(report)
    assert text.startswith("not yet: 2 of 2 capture units pending (background); compiling them takes about 8 s "
                           "(1 that compile at 7.5 s each, measured by earlier runs (none finished here); "
                           "1 without a compile at 0.5 s each, measured by earlier runs (none finished here)")
    assert "served eager meanwhile" in text


class _Queue:
    """A capture queue's figures as `graphs_eta` reads them (set by hand)."""

    def __init__(self, units_run=0, unit_s=0.0, compile_units=0, compile_unit_s=0.0, unfinished_s=0.0,
                 running_s=None):
        self.units_run, self.unit_s = units_run, unit_s
        self.compile_units, self.compile_unit_s = compile_units, compile_unit_s
        self.unfinished_s, self._running_s = unfinished_s, running_s
        self.max_wait_s = 10.0

    def running_s(self):
        return self._running_s

    def paced(self):
        return False


@pytest.mark.parametrize("queue_figures,pending,compiles,earlier,want", [
    # one symbolic compile per state, cold: 5 states x 8 sizes, the first unit running 4 s: the 5
    # compiles are at least 4 s each, the 35 checks have no figure (0 s): at least 20 s
    ({"running_s": 4.0}, 40, 5, (None, None), (20.0, "at least", 4.0, None)),
    # 2 states compiled (20 s), 8 checks (4 s) ran: 3 compiles x 10 s + 27 checks x 0.5 s
    ({"units_run": 10, "unit_s": 24.0, "compile_units": 2, "compile_unit_s": 20.0}, 30, 3, (None, None),
     (43.5, "measured", 10.0, 0.5)),
    # nothing ran here: the store's figures of earlier runs, 5 x 12 s + 35 x 0.4 s
    ({}, 40, 5, (12.0, 0.4), (74.0, "earlier runs", 12.0, 0.4)),
    # one compile measured (8 s), no check yet nor an earlier figure: 4 x 8 s, a lower bound
    ({"units_run": 1, "unit_s": 8.0, "compile_units": 1, "compile_unit_s": 8.0, "running_s": 0.2}, 39, 4,
     (None, None), (32.0, "at least", 8.0, None)),
    # compiles measured here, checks from earlier runs: 2 x 6 s + 10 x 0.25 s; the weaker basis
    ({"units_run": 3, "unit_s": 18.0, "compile_units": 3, "compile_unit_s": 18.0}, 12, 2, (30.0, 0.25),
     (14.5, "earlier runs", 6.0, 0.25)),
    # per size (DRAFTGRAPH_COMPILE_SYMBOLIC=0): every unit compiles, 37 x 10 s
    ({"units_run": 3, "unit_s": 30.0, "compile_units": 3, "compile_unit_s": 30.0}, 37, 37, (None, None),
     (370.0, "measured", 10.0, None)),
    # every state compiled: only checks left, 6 x 0.5 s
    ({"units_run": 34, "unit_s": 27.0, "compile_units": 5, "compile_unit_s": 12.5}, 6, 0, (9.0, 0.1),
     (3.0, "measured", 2.5, 0.5)),
    # trace (nothing compiles): a unit cut off after 2.5 s bounds the 2 pending ones
    ({"unfinished_s": 2.5}, 2, 0, (None, None), (5.0, "at least", None, 2.5)),
    # nothing ran, nothing runs, no earlier figure: no estimate
    ({}, 8, 1, (None, None), (None, "unknown", None, None)),
])
def test_the_estimate_counts_compiles_and_checks_apart(queue_figures, pending, compiles, earlier, want):
    from draftgraph.runtime.engine.report import graphs_eta

    eta = graphs_eta(_Queue(**queue_figures), pending, compiles, *earlier)
    seconds, basis, per_compile, per_check = want
    assert (eta["pending"], eta["compiles"], eta["checks"]) == (pending, compiles, pending - compiles)
    assert eta["basis"] == basis
    assert eta["seconds"] == (None if seconds is None else pytest.approx(seconds))
    assert eta["per_compile_s"] == (None if per_compile is None else pytest.approx(per_compile))
    assert eta["per_check_s"] == (None if per_check is None else pytest.approx(per_check))


def test_the_ready_line_names_each_kind_and_a_missing_figure():
    from draftgraph.runtime.commands.cli import _ready_text
    from draftgraph.runtime.engine.report import graphs_eta

    eta = graphs_eta(_Queue(running_s=4.0), 40, 5)
    report = {"graphs_ready_s": None, "capture": "background", "graphs_eta": eta,
              "states": [{"sizes_ready": [], "sizes_pending": list(range(1, 9)), "sizes_failed": []}] * 5}
    assert _ready_text(report).startswith(
        "not yet: 40 of 40 capture units pending (background); compiling them takes at least 20 s more "
        "(5 that compile at 4.0 s or more each (none finished here; the longest unfinished unit ran 4.0 s); "
        "35 without a compile: no figure yet, counted 0 s); those steps were served eager meanwhile")


def test_engine_close_reports_a_capture_still_running():
    target, head = models("eagle")
    args = RuntimeArgs(SpeculativeConfig(3, 1), CudaGraphConfig(PhaseGraphConfig(bs=(1, 2))), max_running_requests=2)
    engine = SpecDecodeEngine(args, target, head, backend="trace", capture="background")
    release, entered = threading.Event(), threading.Event()

    def hang():
        entered.set()
        release.wait(60)

    _inject(engine.worker.state.graphs, {1: hang, 2: hang})
    try:
        assert entered.wait(30)
        assert engine.close(timeout_s=0.3) is False
        assert engine.generate([list(prompts()[0])[:10]], 4)  # still serving, eager
    finally:
        release.set()
    assert engine.close(timeout_s=30) is True
