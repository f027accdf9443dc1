"""Every reload lands whole: refused when asked if it cannot be served, captured again after any
failure, never dropped unseen, and however it reaches an engine's worker, taken at a step
boundary with the engine following it."""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import threading

import pytest
from engine_support import MAX_NEW, engine_args, models, prompts, reference
from test_reload import FailingModel, args_for, captured

from draftgraph.runtime import (
    EagleDraftWorker,
    ReloadError,
    RuntimeArgs,
    SpeculativeConfig,
    install_reload_signal,
)
from draftgraph.runtime.engine import SpecDecodeEngine
from draftgraph.runtime.testing import TinyDraftModel, make_draft_input

_args = functools.partial(engine_args, running=6)  # graphs up to 4, six request slots


# ---- 1. checked when asked ------------------------------------------------------------------------
def test_multi_layer_engine_refuses_more_steps_than_layers_when_asked():
    target, draft = models("multi_layer")
    engine = SpecDecodeEngine(_args(SpeculativeConfig(3, 1)), target, draft, backend="eager")
    ids = [engine.add_request(list(p), MAX_NEW) for p in prompts()[:4]]
    engine.step()
    layers = draft.max_steps
    too_many = _args(SpeculativeConfig(layers + 1, 1))
    for ask in (engine.request_reload, engine.worker.request_reload):  # both ways in
        with pytest.raises(ValueError, match=rf"num_steps={layers + 1}: the multi-layer draft has {layers} layers"):
            ask(too_many)
        assert engine.worker.slot.pending is None  # nothing left pending
    with pytest.raises(ValueError, match="topk must be 1"):
        engine.request_reload(_args(SpeculativeConfig(2, 2, 4)))
    engine.request_reload(_args(SpeculativeConfig(layers, 1)))  # the limit itself is served
    while engine.has_work():
        engine.step()
    assert [engine.pop_result(i) for i in ids] == reference()[:4]
    assert engine.worker.spec.num_steps == layers and engine.args.speculative.num_steps == layers
    assert engine.stats()["reloads"]["applied"] == 1


def test_engine_limits_are_checked_on_the_worker_path_too():
    target, head = models()
    engine = SpecDecodeEngine(_args(SpeculativeConfig(2, 1)), target, head, backend="eager")
    with pytest.raises(ValueError, match="num_draft_tokens=40: the engine verifies at most 32"):
        engine.worker.request_reload(_args(SpeculativeConfig(3, 8, 40)))
    with pytest.raises(ValueError, match="topk=9: the engine keeps 8"):
        engine.worker.reloads.check(_args(SpeculativeConfig(2, 9, 10)))
    assert engine.worker.slot.pending is None and engine.worker.reloads.log.requested == 0


# ---- 2. the backend belongs to the worker -----------------------------------------------------------
@pytest.mark.parametrize("policy", ["swap", "release_first"])
def test_reload_after_a_failed_capture_captures_again(policy):
    model = FailingModel()
    w = captured(args_for(3), model)  # set up with the trace backend
    model.armed = True
    with pytest.raises(ReloadError, match="injected draft model failure"):
        w.reload(args_for(4), policy=policy)
    model.armed = False
    assert w.state.has_graphs == (policy == "swap")  # release_first: eager meanwhile
    w.reload(args_for(2), policy=policy)  # no backend given: the worker's own
    assert w.state.has_graphs and w.state.graphs.backend_name == "trace"
    assert w.reloads.history[-1]["ok"] and w.reloads.history[-1]["capture_s"] > 0
    replays = w.counters.graph_replays
    w.draft_forward(make_draft_input(2, 1, seed=1))
    assert w.counters.graph_replays == replays + 1


def test_engine_release_first_failure_then_success_captures_again():
    target, head = models()
    engine = SpecDecodeEngine(_args(SpeculativeConfig(3, 1)), target, head, backend="trace",
                              capture="blocking")
    ids = [engine.add_request(list(p), MAX_NEW) for p in prompts()[:4]]
    engine.step()
    capture = engine.worker.capture
    real = capture.capture

    def failing(state, backend):
        raise RuntimeError("injected capture failure")

    capture.capture = failing
    engine.request_reload(_args(SpeculativeConfig(2, 1)), policy="release_first")
    engine.step()  # the reload fails; the old configuration serves eager
    assert engine.worker.state.graphs is None and engine.stats()["reloads"]["failed"] == 1
    capture.capture = real
    engine.request_reload(_args(SpeculativeConfig(4, 1)), policy="release_first")
    engine.step()
    assert engine.worker.state.has_graphs and engine.worker.spec.num_steps == 4
    replays = engine.worker.counters.graph_replays
    while engine.has_work():
        engine.step()
    assert engine.worker.counters.graph_replays > replays
    assert [engine.pop_result(i) for i in ids] == reference()[:4]


# ---- 3. nothing dropped unseen ------------------------------------------------------------------
def test_superseded_requests_are_counted_and_logged(caplog):
    target, head = models()
    engine = SpecDecodeEngine(_args(SpeculativeConfig(3, 1)), target, head, backend="eager")
    ids = [engine.add_request(list(p), MAX_NEW) for p in prompts()[:2]]
    for i in range(100):
        engine.request_reload(_args(SpeculativeConfig(1 + i % 5, 1)))  # the last asks S=5
    with caplog.at_level(logging.WARNING, logger="draftgraph.runtime.worker.reload"):
        engine.step()
    r = engine.stats()["reloads"]
    assert (r["requested"], r["applied"], r["failed"], r["superseded"]) == (100, 1, 0, 99)
    assert engine.worker.spec.num_steps == 5 and engine.args.speculative.num_steps == 5
    lines = [rec.getMessage() for rec in caplog.records if "superseded by" in rec.getMessage()]
    assert len(lines) == 64  # the latest 64 by name, the rest in one line
    assert any("35 more reload requests were superseded" in rec.getMessage() for rec in caplog.records)
    assert "num_steps=4" in lines[-1].split("superseded by")[0]  # the 99th asked S=4...
    assert "num_steps=5" in lines[-1].split("superseded by")[1]  # ...the 100th S=5 replaced it
    while engine.has_work():
        engine.step()
    assert [engine.pop_result(i) for i in ids] == reference()[:2]


@pytest.mark.slow  # the slow tier: 200 steps with a reload at each
def test_reload_records_are_bounded_totals_are_not():
    target, head = models()
    engine = SpecDecodeEngine(_args(SpeculativeConfig(3, 1)), target, head, backend="eager")
    sizes = []
    done = 0
    for step in range(200):
        if not engine.has_work():
            for p in prompts()[:2]:
                engine.add_request(list(p), MAX_NEW)
        engine.request_reload(_args(SpeculativeConfig(2 + step % 2, 1)))
        done += len(engine.step())
        if step in (99, 199):
            sizes.append(len(json.dumps(engine.stats()["reloads"])))
    r = engine.stats()["reloads"]
    assert r["requested"] == r["applied"] == 200 and r["failed"] == r["superseded"] == 0
    assert len(r["recent"]) == 64 and len(engine.worker.reloads.history) == 64
    assert sizes[1] <= sizes[0] * 1.05  # 100 more reloads do not grow the stats
    assert done > 0


def test_superseded_while_preparing_is_counted_as_superseded():
    target, head = models()
    engine = SpecDecodeEngine(_args(SpeculativeConfig(3, 1)), target, head, backend="trace",
                              capture="background")
    engine.close()  # no capture thread: a prepared reload stays pending
    ids = [engine.add_request(list(p), MAX_NEW) for p in prompts()[:2]]
    engine.request_reload(_args(SpeculativeConfig(2, 1)))
    engine.step()  # prepared aside, waiting for its graphs
    engine.request_reload(_args(SpeculativeConfig(4, 1)))
    engine.step()  # replaces the one being prepared
    r = engine.stats()["reloads"]
    assert r["requested"] == 2 and r["superseded"] == 1 and r["failed"] == 0
    while engine.has_work():
        engine.step()
    assert [engine.pop_result(i) for i in ids] == reference()[:2]


# ---- 4. one way in ------------------------------------------------------------------------------
def test_request_on_the_worker_during_a_step_lands_at_the_next_boundary():
    target, head = models()
    engine = SpecDecodeEngine(_args(SpeculativeConfig(3, 1)), target, head, backend="trace",
                              capture="blocking")
    ids = [engine.add_request(list(p), MAX_NEW) for p in prompts()[:4]]
    engine.step()
    head_copy = engine.drafter.head
    real = head_copy.initial_state
    fired = []

    def interrupting(*a, **k):  # a SIGHUP handler running in the middle of the draft stage
        if not fired:
            fired.append(True)
            engine.worker.request_reload(_args(SpeculativeConfig(2, 2, 4)))
        return real(*a, **k)

    head_copy.initial_state = interrupting
    engine.step()  # built for topk=1; the reload must not land inside it
    assert fired and engine.worker.spec.topk == 1
    engine.step()
    assert engine.worker.spec.topk == 2 and engine.args.speculative.topk == 2
    while engine.has_work():
        engine.step()
    assert [engine.pop_result(i) for i in ids] == reference()[:4]


def test_direct_reload_of_an_engine_worker_is_refused_naming_request_reload():
    target, head = models()
    engine = SpecDecodeEngine(_args(SpeculativeConfig(3, 1)), target, head, backend="eager")
    ids = [engine.add_request(list(p), MAX_NEW) for p in prompts()[:2]]
    engine.step()
    with pytest.raises(ReloadError, match="request_reload"):
        engine.worker.reload(_args(SpeculativeConfig(2, 1)))
    with pytest.raises(ReloadError, match="request_reload"):
        engine.worker.reloads.prepare(_args(SpeculativeConfig(2, 1)))
    with pytest.raises(ReloadError, match="request_reload"):
        with engine.worker.override_worker_state(2):
            pass
    errors = []

    def other_thread():
        try:
            engine.worker.reload(_args(SpeculativeConfig(2, 1)))
        except ReloadError as exc:
            errors.append(exc)

    t = threading.Thread(target=other_thread)
    t.start()
    t.join(timeout=30)
    assert not t.is_alive() and len(errors) == 1
    assert engine.worker.generation == 0 and engine.worker.spec.num_steps == 3
    while engine.has_work():
        engine.step()
    assert [engine.pop_result(i) for i in ids] == reference()[:2]


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="needs SIGHUP (POSIX)")
def test_sighup_on_the_engine_worker_reaches_the_engine(tmp_path):
    target, head = models()
    engine = SpecDecodeEngine(_args(SpeculativeConfig(3, 1)), target, head, backend="eager")
    path = tmp_path / "args.json"
    path.write_text('{"speculative": {"num_steps": 2, "topk": 2, "num_draft_tokens": 4},'
                    ' "max_running_requests": 6, "cuda_graph_config": {"decode": {"max_bs": 4}}}')
    ids = [engine.add_request(list(p), MAX_NEW) for p in prompts()[:4]]
    engine.step()
    uninstall = install_reload_signal(engine.worker, path)
    try:
        os.kill(os.getpid(), signal.SIGHUP)
        engine.step()
    finally:
        uninstall()
    assert engine.args.speculative.topk == 2 and engine.worker.spec.topk == 2
    while engine.has_work():
        engine.step()
    assert [engine.pop_result(i) for i in ids] == reference()[:4]


def test_bare_worker_still_applies_its_own_requests():
    w = EagleDraftWorker(RuntimeArgs(SpeculativeConfig(3, 1)), TinyDraftModel())
    w.request_reload(RuntimeArgs(SpeculativeConfig(2, 1)))
    w.request_reload(RuntimeArgs(SpeculativeConfig(4, 1)))
    w.draft_forward(make_draft_input(2, 1, seed=0))
    assert w.spec.num_steps == 4
    assert w.reloads.log.totals() == {"requested": 2, "applied": 1, "failed": 0, "superseded": 1}
