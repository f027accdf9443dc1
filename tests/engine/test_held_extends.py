"""Plain steps hold the head's extend (`HeldExtends`) and run it once before the next draft: the
draft then proposes from the context one-row extends would have given it, outputs stay greedy,
and a slot never holds more than its cap. The comparison is against the same engine with the
hold switched off (an extend after every plain step, as before)."""

from __future__ import annotations

import pytest
import torch
from engine_support import build_engine, engine_args, prompts, reference

from draftgraph.runtime import SpeculativeConfig
from draftgraph.runtime.engine.held_extends import HeldExtends
from draftgraph.runtime.schedule import SpeculationSchedule

SCHEDULE = "1:0,2:3"  # one request: plain steps; two or more: S = 3


def _engine(held: bool, cap: int | None = None):
    args = engine_args(SpeculativeConfig(3, 1), max_bs=4, schedule=SpeculationSchedule.parse(SCHEDULE))
    eng = build_engine(args=args, backend="eager")
    if not held:
        eng.pipeline.held = None
    elif cap is not None:
        eng.pipeline.held = HeldExtends(len(eng.pipeline.held.count), cap=cap)
    return eng


def _draft_inputs(eng, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
    st = eng.pipeline.slots
    return st.feature[slot].clone(), st.draft_ids[slot].clone()


@pytest.mark.parametrize("cap,plain_steps", [(16, 7), (3, 8)])
def test_held_rows_give_the_draft_the_one_row_context(cap, plain_steps):
    prompt = list(prompts()[0])
    got = {}
    for held in (True, False):
        eng = _engine(held, cap)
        try:
            rid = eng.add_request(prompt, 40)
            for _ in range(plain_steps):  # one request: plain steps only
                eng.step()
            slot = eng.running[0].slot
            if held:
                h = eng.pipeline.held
                assert h.count[slot] == plain_steps % cap  # released at the cap, then held again
                h.release(eng.pipeline.drafter, eng.pipeline.slots, [slot])
                assert h.count[slot] == 0
            got[held] = _draft_inputs(eng, slot)
            eng.add_request(list(prompts()[1]), 40)
            while eng.has_work():
                eng.step()
            got[(held, "out")] = eng.result(rid)
        finally:
            eng.close()
    feature, ids = got[True]
    feature_b, ids_b = got[False]
    assert torch.allclose(feature, feature_b, rtol=1e-5, atol=1e-6)
    assert torch.equal(ids, ids_b)
    assert got[(True, "out")] == got[(False, "out")]


def test_a_plain_stretch_then_speculation_stays_greedy():
    want = reference()[:4]
    eng = _engine(True)
    try:
        rid = eng.add_request(list(prompts()[0]), len(want[0]))
        for _ in range(6):
            eng.step()
        rids = [rid] + [eng.add_request(list(p), len(w)) for p, w in zip(prompts()[1:4], want[1:])]
        while eng.has_work():
            eng.step()
        assert [eng.result(r) for r in rids] == want
        assert all(c == 0 for c in eng.pipeline.held.count)  # finished requests hold nothing
    finally:
        eng.close()


def test_hold_and_release_by_slot():
    h = HeldExtends(4, cap=2)
    hidden = torch.arange(2 * 1 * 3, dtype=torch.float64).view(2, 1, 3)
    assert h.hold([1, 3], [10, 20], hidden, torch.tensor([7, 8]), [True, False]) == []
    assert h.count == [0, 1, 0, 0] and h.start[1] == 10
    assert h.hold([1, 3], [11, 21], hidden + 100, torch.tensor([9, 5]), [True, True]) == [1]  # slot 1 is full
    assert h.count == [0, 2, 0, 1] and h.start[3] == 21

    calls = []

    class Recorder:
        def extend_rows(self, state, slots, hidden, tokens, length, lens, lk):
            calls.append((slots.tolist(), hidden.clone(), tokens.tolist(), length.tolist(), lens.tolist(), lk))

    assert h.release(Recorder(), None, [0, 1, 3]) == 2
    slots, rows, tokens, length, lens, lk = calls[0]
    assert slots == [1, 3] and tokens == [[7, 9], [5, 0]] and length == [2, 1] and lens == [10, 21] and lk == 23
    assert torch.equal(rows[0, 0], hidden[0, 0]) and torch.equal(rows[0, 1], hidden[0, 0] + 100)
    assert torch.equal(rows[1, 0], hidden[1, 0] + 100)
    assert h.count == [0, 0, 0, 0] and h.release(Recorder(), None, [1, 3]) == 0 and len(calls) == 1
    h.hold([2], [5], hidden[:1], torch.tensor([1]), [True])
    h.forget(2)
    assert h.holding(range(4)) == []


@pytest.mark.parametrize("cap", [0, -1, 2.0, True])
def test_a_bad_cap_is_refused(cap):
    with pytest.raises(ValueError, match=f"cap={cap!r}: rows held per slot must be an int >= 1"):
        HeldExtends(2, cap=cap)


def test_held_rows_meet_the_phase_graphs():
    """Behind the payoff gate with the verify / extend graphs: a plain step under a drafting state
    holds its rows (its extend would be eager), and they are released (before a draft, or before
    a target-only state's extend graph reads the head's cache); every output stays greedy's."""
    from engine_support import models

    from draftgraph.runtime.engine import SpecDecodeEngine

    target, head = models("eagle")
    engine = SpecDecodeEngine(engine_args(SpeculativeConfig(3, 1), bs=(1, 2, 4), running=4), target, head,
                              backend="trace", capture="blocking", graph_phases=("verify", "extend"),
                              kv_tiers=(512,), adaptive_steps=(0, 2, 3))
    released = []
    real = engine.pipeline.held.release

    def spy(drafter, state, slots):
        n = real(drafter, state, slots)
        released.append(n)
        return n

    engine.pipeline.held.release = spy
    try:
        out = engine.generate([list(p) for p in prompts()[:8]], 24)
        assert out == [w[:24] for w in reference()[:8]]
        assert sum(released) > 0
    finally:
        engine.close()
