"""Serving for a long time: results are taken (`pop_result`) and forgotten, requests can be
aborted, a failure while admitting one request fails that request alone (its slot comes back),
and a fault inside the batched step loses nothing (issue 25)."""

from __future__ import annotations

import pytest
import torch
from engine_support import MAX_NEW, prompts, reference

import draftgraph.runtime.engine.pipeline as engine_mod
from draftgraph.runtime.engine import RequestFailed, SpecDecodeEngine


def _prompts(n: int = 16) -> list[list[int]]:
    return [list(p) for p in prompts()[:n]]


def _drain(engine: SpecDecodeEngine, ids: list[int]) -> list[list[int]]:
    """Step until idle, then take every result."""
    while engine.has_work():
        engine.step()
    return [engine.pop_result(i) for i in ids]


class _FailingPrefill:
    """Wraps the target prefill (or the drafter's): raises ``exc`` for the listed prompts' ids."""

    def __init__(self, inner, fail_rids: set[int], exc: BaseException, rid_of) -> None:
        self.inner, self.fail, self.exc, self.rid_of = inner, fail_rids, exc, rid_of
        self.raised = 0

    def __call__(self, *args):
        rid = self.rid_of(args)
        if rid in self.fail:
            self.fail.discard(rid)
            self.raised += 1
            raise self.exc
        return self.inner(*args)


class _Target:
    """The target model seen through ``fault`` for verify forwards only."""

    def __init__(self, inner, fault) -> None:
        self._inner = inner
        self._faulty = fault(inner)

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def __call__(self, *args):
        if args[1] is args[2]:  # prefill passes the positions as the write positions
            return self._inner(*args)
        return self._faulty(*args)


def test_pop_result_takes_a_result_once(make_engine):
    engine = make_engine()
    ids = [engine.add_request(p, MAX_NEW) for p in _prompts(6)]
    assert engine.pop_result(ids[5]) is None  # waiting (4 slots)
    engine.step()
    assert engine.pop_result(ids[0]) is None  # running
    outs = _drain(engine, ids)
    assert outs == reference()[:6]
    for rid in ids:
        with pytest.raises(KeyError, match=f"request id {rid}"):
            engine.pop_result(rid)
        with pytest.raises(KeyError, match=f"request id {rid}"):
            engine.result(rid)
    with pytest.raises(KeyError, match="request id 99"):
        engine.pop_result(99)
    assert not engine.has_work()


def test_result_keeps_its_meaning_until_taken(make_engine):
    engine = make_engine()
    rid = engine.add_request(_prompts(1)[0], MAX_NEW)
    assert engine.result(rid) == []
    engine.step()
    partial = engine.result(rid)
    assert 1 <= len(partial) < MAX_NEW and partial == reference()[0][:len(partial)]
    while engine.has_work():
        engine.step()
    assert engine.result(rid) == reference()[0]
    assert engine.result(rid) == reference()[0]  # reading does not take it
    assert engine.pop_result(rid) == reference()[0]
    with pytest.raises(KeyError):  # taking does
        engine.result(rid)


def test_step_returns_the_ids_that_ended(make_engine):
    engine = make_engine()
    ids = [engine.add_request(p, MAX_NEW) for p in _prompts(6)]
    ended: list[int] = []
    while engine.has_work():
        ended += engine.step()
    assert sorted(ended) == ids


def test_finished_requests_hold_no_tensors(make_engine):
    """Results left untaken keep their tokens only: the live tensor count does not grow with
    the number of finished requests (each used to keep its draft tensors)."""
    import gc
    import warnings

    def live_tensors() -> int:
        gc.collect()
        with warnings.catch_warnings():  # isinstance on some torch module objects warns
            warnings.simplefilter("ignore")
            return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))

    engine = make_engine()
    ps = _prompts(8)
    for p in ps:  # warm up every batch size and path once
        engine.add_request(p[:12], 6)
    while engine.has_work():
        engine.step()
    before = live_tensors()
    for _ in range(5):
        for p in ps:
            engine.add_request(p[:12], 6)
        while engine.has_work():
            engine.step()
    assert engine.stats()["requests_finished"] == 48
    assert live_tensors() - before < 8  # 40 more finished requests; before the fix: ~3 each


def test_abort_waiting_and_running_requests(make_engine):
    engine = make_engine(running=2)
    ids = [engine.add_request(p, MAX_NEW) for p in _prompts(4)]
    engine.step()
    engine.step()  # ids[0], ids[1] running, ids[2], ids[3] waiting
    assert engine.abort_request(ids[1]) is True
    assert engine.abort_request(ids[2]) is True
    so_far = engine.result(ids[1])
    engine.step()  # the boundary: both end, ids[3] takes the freed slot
    assert engine.pop_result(ids[2]) == []
    taken = engine.pop_result(ids[1])
    assert taken == so_far and 1 <= len(taken) < MAX_NEW and taken == reference()[1][:len(taken)]
    rest = _drain(engine, [ids[0], ids[3]])
    assert rest == [reference()[0], reference()[3]]
    assert engine.abort_request(engine.add_request(_prompts(1)[0], 1)) is True
    done = engine.add_request(_prompts(1)[0], MAX_NEW)
    while engine.has_work():
        engine.step()
    assert engine.abort_request(done) is False  # already ended: nothing to stop
    assert engine.pop_result(done) == reference()[0]
    with pytest.raises(KeyError, match=f"request id {done}"):
        engine.abort_request(done)
    st = engine.stats()
    assert (st["requests_aborted"], st["requests_failed"]) == (3, 0)


def test_admission_failures_lose_no_slot(monkeypatch, make_engine):
    """50 injected failures (target prefill and drafter prefill, half each) with 4 slots, then
    the normal requests: all served, equal to greedy, with the full capacity."""
    engine = make_engine(running=4)
    by_prompt: dict[tuple[int, ...], int] = {}
    fail_target = set(range(0, 50, 2))
    fail_draft = set(range(1, 50, 2))
    tprefill = _FailingPrefill(engine_mod.prefill, fail_target, RuntimeError("injected target"),
                               lambda a: by_prompt[tuple(a[3])])
    monkeypatch.setattr(engine_mod, "prefill", tprefill)
    dprefill = _FailingPrefill(engine.drafter.prefill, fail_draft, MemoryError("injected draft"),
                               lambda a: by_prompt[tuple(a[2])])
    monkeypatch.setattr(engine.drafter, "prefill", dprefill)
    bad = []
    for i in range(50):
        prompt = [1 + i % 50, 2 + i // 50, 3, 4, 5]
        rid = engine.add_request(prompt, 4)
        by_prompt[tuple(prompt)] = rid
        bad.append(rid)
    good_prompts = _prompts()
    good = []
    for p in good_prompts:
        good.append(engine.add_request(p, MAX_NEW))
        by_prompt[tuple(p)] = good[-1]
    widths = []
    while engine.has_work():
        engine.step()
        widths.append(len(engine.running))
    assert tprefill.raised == 25 and dprefill.raised == 25
    assert max(widths) == 4  # capacity intact: four requests ran together
    for rid in bad:
        with pytest.raises(RequestFailed, match=f"request id {rid}: failed") as info:
            engine.result(rid)
        assert isinstance(info.value.__cause__, (RuntimeError, MemoryError))
        assert "injected" in str(info.value.__cause__)
        with pytest.raises(RequestFailed):
            engine.pop_result(rid)
        with pytest.raises(KeyError):  # a failed result is taken once too
            engine.pop_result(rid)
    assert [engine.pop_result(rid) for rid in good] == reference()
    st = engine.stats()
    assert st["requests_failed"] == 50 and st["requests_finished"] == 16
    assert engine.generate(_prompts(4), MAX_NEW) == reference()[:4]


def test_generate_raises_request_failed_after_taking_every_result(monkeypatch, make_engine):
    engine = make_engine()
    calls = {"n": 0}
    real = engine_mod.prefill

    def flaky(*args):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected")
        return real(*args)

    monkeypatch.setattr(engine_mod, "prefill", flaky)
    with pytest.raises(RequestFailed, match="request id 1"):
        engine.generate(_prompts(3), 4)
    for rid in range(3):
        with pytest.raises(KeyError):
            engine.result(rid)  # all taken, none kept


def test_interrupt_while_admitting_keeps_the_request(monkeypatch, make_engine):
    engine = make_engine()
    real = engine_mod.prefill
    state = {"armed": True}

    def interrupted(*args):
        if state["armed"] and tuple(args[3]) == prompts()[2]:
            state["armed"] = False
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(engine_mod, "prefill", interrupted)
    ids = [engine.add_request(p, MAX_NEW) for p in _prompts(4)]
    with pytest.raises(KeyboardInterrupt):
        engine.step()
    assert engine.pop_result(ids[2]) is None  # still waiting, not lost
    assert _drain(engine, ids) == reference()[:4]
    assert engine.stats()["requests_failed"] == 0


@pytest.mark.parametrize("site,exc,backend", [
    ("draft", RuntimeError("injected draft fault"), "eager"),
    ("replay", KeyboardInterrupt(), "trace"),
    ("verify", MemoryError("injected verify fault"), "eager"),
    ("extend", KeyboardInterrupt(), "eager"),
])
def test_a_fault_inside_the_step_loses_nothing(site, exc, backend, monkeypatch, make_engine):
    """The step raises; the next steps serve every request, equal to greedy."""
    engine = make_engine(backend=backend, running=4)
    armed = {"left": 1, "calls": 0}

    def fault(inner):
        def wrapped(*args, **kwargs):
            armed["calls"] += 1
            if armed["calls"] == 3 and armed["left"]:
                armed["left"] = 0
                raise exc
            return inner(*args, **kwargs)
        return wrapped

    if site == "draft":
        monkeypatch.setattr(engine.drafter, "draft", fault(engine.drafter.draft))
    elif site == "replay":
        graphs = engine.worker.state.graphs  # the worker replays its checked input through it
        monkeypatch.setattr(graphs, "replay_trusted", fault(graphs.replay_trusted))
    elif site == "verify":  # the target's verify forward (not a prefill: there write is pos)
        engine.pipeline.target = _Target(engine.pipeline.target, fault)
    else:
        monkeypatch.setattr(engine.drafter, "extend", fault(engine.drafter.extend))
    ids = [engine.add_request(p, MAX_NEW) for p in _prompts()]
    raised = 0
    while engine.has_work():
        try:
            engine.step()
        except (RuntimeError, MemoryError, KeyboardInterrupt) as got:
            assert got is exc
            raised += 1
    assert raised == 1
    assert [engine.pop_result(i) for i in ids] == reference()
