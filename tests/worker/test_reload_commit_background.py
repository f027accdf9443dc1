"""A reload under background capture crosses the engine/worker line twice (issue 50): the request,
then `Reloads.commit(request, background=True)`, the one call the boundary repeats until the
worker swaps the new state in (HOLDING while its graphs are captured aside)."""

from __future__ import annotations

import pytest
from engine_support import MAX_NEW, models, prompts, reference

from draftgraph.runtime import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.engine import SpecDecodeEngine
from draftgraph.runtime.validation import ConfigTypeError
from draftgraph.runtime.worker import CommitStatus

SIZES = (1, 2, 4, 8)
SPEC = SpeculativeConfig(3, 2, 6)


def _args(s: int, n: int) -> RuntimeArgs:
    return RuntimeArgs(SpeculativeConfig(s, 2, n), CudaGraphConfig(PhaseGraphConfig(bs=SIZES)))


def test_the_first_call_builds_aside_and_holds_then_the_same_call_commits(make_worker):
    w = make_worker(SPEC, bs=SIZES, backend=None)
    w.capture_graphs("trace")
    request = w.reloads.check(_args(2, 4))
    assert w.reloads.commit(request, backend="trace", background=True) is CommitStatus.HOLDING
    assert w.reloads.capturing_state is not None and w.spec.num_steps == 3  # the old state serves
    assert w.capture.wait(30)
    assert w.reloads.commit(request, backend="trace", background=True) is CommitStatus.COMMITTED
    assert w.spec.num_steps == 2 and w.state.graphs.is_captured and w.reloads.capturing_state is None
    assert w.reloads.log.totals() == {"requested": 1, "applied": 1, "failed": 0, "superseded": 0}


def test_a_newer_request_supersedes_the_one_capturing_and_land_swaps_it_in_unready(make_worker):
    w = make_worker(SPEC, bs=SIZES, backend=None)
    w.capture_graphs("trace")
    assert w.capture.stop(30)  # no capture thread: the graphs stay pending
    first, second = w.reloads.check(_args(2, 4)), w.reloads.check(_args(4, 6))
    assert w.reloads.commit(first, backend="trace", background=True) is CommitStatus.HOLDING
    assert w.reloads.commit(second, backend="trace", background=True) is CommitStatus.HOLDING
    assert w.reloads.log.totals()["superseded"] == 1 and w.spec.num_steps == 3
    status = w.reloads.commit(second, backend="trace", background=True, land=True)
    assert status is CommitStatus.LANDED_UNREADY and w.spec.num_steps == 4
    assert w.reloads.log.totals() == {"requested": 2, "applied": 1, "failed": 0, "superseded": 1}


def test_a_background_commit_takes_a_request_only(make_worker):
    w = make_worker(SPEC, bs=SIZES, backend=None)
    w.capture_graphs("trace")
    prepared = w.reloads.prepare(_args(2, 4), backend="trace")
    with pytest.raises(ConfigTypeError, match="prepared=PreparedState"):
        w.reloads.commit(prepared, background=True)
    assert w.spec.num_steps == 3
    w.reloads.discard(prepared, "not used")


def test_the_engine_boundary_calls_only_commit_under_background_capture(monkeypatch):
    target, head = models()
    args = RuntimeArgs(SpeculativeConfig(3, 1), CudaGraphConfig(PhaseGraphConfig(bs=(1, 2, 4))),
                       max_running_requests=4)
    engine = SpecDecodeEngine(args, target, head, backend="trace", capture="background")
    try:
        reloads, calls = engine.worker.reloads, []
        for name in ("prepare", "discard", "commit"):
            real = getattr(reloads, name)

            def spy(*a, _name=name, _real=real, **k):
                out = _real(*a, **k)
                calls.append((_name, a[0], out))
                return out

            monkeypatch.setattr(reloads, name, spy)
        ids = [engine.add_request(list(p), MAX_NEW) for p in prompts()[:3]]
        generation = engine.worker.generation
        engine.request_reload(RuntimeArgs(SpeculativeConfig(2, 1), CudaGraphConfig(PhaseGraphConfig(bs=(1, 2, 4))),
                                          max_running_requests=4))
        while engine.worker.generation == generation and len(calls) < 50:
            engine.step()
        assert engine.worker.generation == generation + 1 and engine.args.speculative.num_steps == 2
        assert {name for name, _, _ in calls} == {"commit"}  # no prepare, no ready poll, no discard
        assert len({id(request) for _, request, _ in calls}) == 1  # the one held request, each time
        statuses = [out for _, _, out in calls]
        assert set(statuses[:-1]) <= {CommitStatus.HOLDING}
        assert statuses[-1] in (CommitStatus.COMMITTED, CommitStatus.LANDED_UNREADY)
        while engine.has_work():
            engine.step()
        assert [engine.pop_result(i) for i in ids] == reference()[:3]
    finally:
        engine.close()
