"""A reload as one transaction (issue 50 item 1): checked once when requested, held by the
engine's step boundary, built and swapped by one `commit`, counted once in one log."""

from __future__ import annotations

import functools

import pytest
from engine_support import MAX_NEW, engine_args, models, prompts, reference
from test_reload import FailingModel, args_for, captured

from draftgraph.runtime import ReloadError, SpeculativeConfig
from draftgraph.runtime.engine import SpecDecodeEngine

_args = functools.partial(engine_args, running=6)


def _counting_check(worker):
    """A host check that counts its calls (it refuses nothing)."""
    calls = []
    worker.reloads.add_check(calls.append)
    return calls


def test_a_requested_reload_is_checked_once_from_request_to_swap():
    target, head = models()
    engine = SpecDecodeEngine(_args(SpeculativeConfig(3, 1)), target, head, backend="eager")
    calls = _counting_check(engine.worker)
    ids = [engine.add_request(list(p), MAX_NEW) for p in prompts()[:2]]
    engine.request_reload(_args(SpeculativeConfig(2, 1)))
    assert len(calls) == 1 and engine.worker.spec.num_steps == 3  # checked, held, not applied
    engine.step()
    assert len(calls) == 1 and engine.worker.spec.num_steps == 2  # applied without a second check
    while engine.has_work():
        engine.step()
    assert [engine.pop_result(i) for i in ids] == reference()[:2]


def test_the_boundary_holds_the_request_not_the_worker():
    target, head = models()
    engine = SpecDecodeEngine(_args(SpeculativeConfig(3, 1)), target, head, backend="eager")
    engine.worker.request_reload(_args(SpeculativeConfig(2, 1)))  # the worker's own way in
    assert engine.worker.slot.pending is None and engine.boundary.pending.request is not None
    engine.step()
    assert engine.boundary.pending.request is None and engine.worker.spec.num_steps == 2


def test_one_log_one_record_per_reload_counted_once():
    target, head = models()
    engine = SpecDecodeEngine(_args(SpeculativeConfig(3, 1)), target, head, backend="eager")
    engine.add_request(list(prompts()[0]), MAX_NEW)
    engine.request_reload(_args(SpeculativeConfig(2, 1)))
    assert engine.worker.reloads.log.totals()["requested"] == 0  # counted when it opens
    engine.step()
    engine.step()
    log = engine.worker.reloads.log
    assert log.totals() == {"requested": 1, "applied": 1, "failed": 0, "superseded": 0}
    assert len(log.history) == 1
    recent = engine.stats()["reloads"]["recent"]
    assert len(recent) == 1 and recent[0]["ok"] and recent[0]["step"] == 0
    engine.reset_stats()  # the engine's view starts afresh; the worker's log keeps its record
    assert engine.stats()["reloads"]["recent"] == [] and len(log.history) == 1


def test_a_failed_commit_of_a_request_leaves_the_previous_state_serving():
    model = FailingModel()
    w = captured(args_for(3), model)
    before = w.state
    request = w.reloads.check(args_for(2))
    model.armed = True
    with pytest.raises(ReloadError, match="old state keeps serving"):
        w.reloads.commit(request)
    model.armed = False
    assert w.state is before and w.spec.num_steps == 3 and w.generation == 0
    assert w.reloads.log.totals() == {"requested": 1, "applied": 0, "failed": 1, "superseded": 0}
    w.reloads.commit(request)  # the same checked request, built again
    assert w.spec.num_steps == 2 and w.generation == 1 and w.state.has_graphs


def test_a_stale_prepared_state_is_discarded_by_commit_and_recorded_once():
    w = captured(args_for(3))
    stale = w.reloads.prepare(args_for(2))
    w.reload(args_for(4))
    with pytest.raises(ReloadError, match="stale"):
        w.reloads.commit(stale)
    assert w.spec.num_steps == 4
    assert w.reloads.log.totals() == {"requested": 2, "applied": 1, "failed": 1, "superseded": 0}
    assert not stale.state.has_graphs  # released


def test_attach_host_refuses_an_object_that_is_not_a_reload_host():
    w = captured(args_for(3))
    with pytest.raises(TypeError, match=r"host=str: needs name \(a ReloadHost\)"):
        w.reloads.attach_host("an engine")


def test_under_a_coordinator_a_request_is_counted_once_and_a_failed_prepare_keeps_the_state():
    import torch.distributed as dist

    from draftgraph.runtime.ranks.coordinator import RankCoordinator

    if dist.is_initialized():
        pytest.skip("a process group exists already")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # one rank, in process
    try:
        target, head = models()
        engine = SpecDecodeEngine(_args(SpeculativeConfig(3, 1)), target, head, backend="eager")
        engine.attach_coordinator(RankCoordinator(engine.worker, poll_every=2, timeout_s=10.0))
        ids = [engine.add_request(list(p), MAX_NEW) for p in prompts()[:2]]
        engine.worker.request_reload(_args(SpeculativeConfig(2, 1)))  # the worker's own way in (a SIGHUP's)
        for _ in range(3):
            engine.step()
        log = engine.worker.reloads.log
        assert engine.worker.spec.num_steps == 2 and engine.args.speculative.num_steps == 2
        assert log.totals() == {"requested": 1, "applied": 1, "failed": 0, "superseded": 0}  # once, not twice
        before = engine.worker.state
        engine.coordinator.propose_reload(_args(SpeculativeConfig(2, 9, 10)))  # topk 9: refused in prepare
        for _ in range(3):
            engine.step()
        assert engine.worker.state is before and engine.worker.spec.num_steps == 2
        assert engine.coordinator.stats.aborted == 1 and "topk=9" in engine.coordinator.last_error
        assert log.totals()["requested"] == 1  # refused by the checks: nothing opened, nothing counted
        while engine.has_work():
            engine.step()
        assert [engine.pop_result(i) for i in ids] == reference()[:2]
    finally:
        dist.destroy_process_group()
