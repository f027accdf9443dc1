"""`PayoffGate` (adaptive candidate 0): plain steps while speculation is measured slower, the
speculative ones while it pays, a probe of the other kind now and then, and never a changed
token. The clock is a fake one the test advances by what each kind of step "costs"."""

from __future__ import annotations

import pytest
from engine_support import MAX_NEW, engine_args, models, prompts, reference

from draftgraph.runtime import SpeculativeConfig
from draftgraph.runtime.engine import SpecDecodeEngine
from draftgraph.runtime.engine.payoff import PayoffGate
from draftgraph.runtime.engine.policy import build_policy


class Inner:
    """A fixed S = 3 policy that records what it observed."""

    def __init__(self) -> None:
        self.seen: list[float] = []

    def begin(self, batch_size: int) -> int:
        return 3

    def observe(self, accepted: float) -> None:
        self.seen.append(accepted)

    def states(self) -> list:
        return []

    def release(self) -> None:
        return None

    def as_dict(self) -> dict:
        return {"steps_per_state": {}, "schedule": None}


def _drive(spec_cost: float, accepted: float, steps: int = 200, probe_every: int = 16) -> list[int]:
    """The S the gate served per step when a speculative step costs ``spec_cost`` time units and
    accepts ``accepted`` drafts, and a plain step costs 1."""
    now = [0.0]
    inner = Inner()
    gate = PayoffGate(inner, probe_every=probe_every, clock=lambda: now[0])
    served = []
    for _ in range(steps):
        s = gate.begin(4)
        served.append(s)
        now[0] += spec_cost if s else 1.0
        if s:
            gate.observe(accepted)
    assert inner.seen == [accepted] * sum(1 for s in served if s)  # every speculative step reached it
    return served


def test_a_head_that_does_not_pay_gets_plain_steps_and_a_probe_now_and_then():
    served = _drive(spec_cost=2.0, accepted=0.3)  # 0.65 tokens / unit against 1
    late = served[20:]
    assert late.count(0) >= 0.9 * len(late)
    assert 0 < late.count(3) <= len(late) / 16 + 1  # the probes
    assert served[:3] == [3, 3, 3] and served[3:6] == [0, 0, 0]  # warm-up: both kinds measured


def test_a_head_that_pays_keeps_speculating():
    served = _drive(spec_cost=1.5, accepted=2.0)  # 2 tokens / unit against 1
    late = served[20:]
    assert late.count(3) >= 0.9 * len(late) and late.count(0) >= 1


def test_the_gate_follows_a_change():
    now = [0.0]
    gate = PayoffGate(Inner(), probe_every=8, clock=lambda: now[0])
    served = []
    for i in range(300):
        s = gate.begin(1)
        served.append(s)
        good = i >= 150  # the head starts to pay half way
        now[0] += (1.2 if good else 3.0) if s else 1.0
        if s:
            gate.observe(3.0 if good else 0.0)
    assert served[100:150].count(0) >= 40 and served[250:].count(3) >= 40


def test_each_batch_band_decides_for_itself():
    """Speculation pays at batch 1 (2 tokens / unit against 1) and not at batch 8 (0.5 against
    1): the gate speculates at one and decodes plainly at the other, in one interleaved run."""
    now = [0.0]
    gate = PayoffGate(Inner(), probe_every=16, clock=lambda: now[0])
    by_batch: dict[int, list[int]] = {1: [], 8: []}
    for i in range(400):
        b = 1 if i % 2 else 8
        s = gate.begin(b)
        by_batch[b].append(s)
        now[0] += (1.5 if b == 1 else 2.0) if s else 1.0
        if s:
            gate.observe(2.0 if b == 1 else 0.0)
    assert by_batch[1][20:].count(3) >= 0.9 * len(by_batch[1][20:])
    assert by_batch[8][20:].count(0) >= 0.9 * len(by_batch[8][20:])
    assert set(gate.as_dict()["payoff"]["bands"]) == {"1-1", "8-15"}


def test_bad_arguments_are_refused():
    for kw in ({"probe_every": 0}, {"warmup": -1}, {"alpha": 0.0}, {"probe_every": True}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            PayoffGate(Inner(), **kw)


def test_the_engine_behind_the_gate_still_emits_greedy_tokens():
    target, head = models("eagle")
    engine = SpecDecodeEngine(engine_args(SpeculativeConfig(3, 1), running=6), target, head, backend="eager",
                              adaptive_steps=(0, 1, 2, 3))
    try:
        assert engine.generate([list(p) for p in prompts()], MAX_NEW) == reference()
        st = engine.stats()
        with pytest.raises(ValueError, match="s=5: not one of the candidate step counts"):
            engine.policy.inner.serve(5)
    finally:
        engine.close()
    payoff = st["payoff"]
    # the real `AdaptivePolicy` behind the gate: every kind served, each S counted where it ran
    by_s = payoff["steps_by_s"]
    assert set(by_s) == {"0", "1", "2", "3"} and all(n >= 3 for n in by_s.values())  # warm-up of each
    assert st["steps_per_state"] == {s: by_s[str(s)] for s in (1, 2, 3)}
    assert payoff["speculative_steps"] >= 3 and payoff["plain_steps"] >= 3  # both kinds served
    assert sum(b["speculative_steps"] + b["plain_steps"] for b in payoff["bands"].values()) == st["verify_steps"]
    assert any(b["speculative_tokens_per_s"] and b["plain_tokens_per_s"] for b in payoff["bands"].values())


def test_a_rank_group_cannot_take_the_clock_driven_choice():
    target, head = models("eagle")
    engine = SpecDecodeEngine(engine_args(SpeculativeConfig(3, 1)), target, head, backend="eager")
    try:
        with pytest.raises(ValueError, match="rank group"):
            build_policy(engine.worker, engine_args(SpeculativeConfig(3, 1)), None, (0, 1, 2), "eager", False,
                         coordinator=object())
    finally:
        engine.close()


class Servable(Inner):
    """An inner policy that serves the S it is told (as `AdaptivePolicy` does), recording it."""

    candidate_steps = (1, 2, 3, 4)

    def __init__(self) -> None:
        super().__init__()
        self.told: list[int] = []

    def serve(self, s: int) -> int:
        self.told.append(s)
        return s


def test_the_gate_measures_each_step_count_and_serves_the_best():
    """A verify row costs 0.3 of a decode and the head accepts each next draft with p = 0.5: per
    unit of time S = 1 delivers 1.15 tokens, S = 2 1.09, S = 3 0.99, S = 4 0.88, plain 1. The
    acceptance rule (S >= expected + 1) would pick 2; the gate serves 1, and probes the rest."""
    now = [0.0]
    inner = Servable()
    gate = PayoffGate(inner, probe_every=16, clock=lambda: now[0])
    served = []
    for _ in range(400):
        s = gate.begin(1)
        served.append(s)
        now[0] += 1.0 + 0.3 * s
        if s:
            gate.observe(sum(0.5 ** k for k in range(1, s + 1)))
    assert served[:12] == [4, 4, 4, 3, 3, 3, 2, 2, 2, 1, 1, 1] and served[12:15] == [0, 0, 0]  # warm-up
    late = served[40:]
    assert late.count(1) >= 0.85 * len(late)
    assert all(late.count(k) >= 1 for k in (0, 2, 3, 4))  # every other kind probed in turn
    assert inner.told == [s for s in served if s]  # each speculative step served through the inner policy
    payoff = gate.as_dict()["payoff"]
    assert payoff["steps_by_s"]["1"] == served.count(1) and payoff["plain_steps"] == served.count(0)
    rates = payoff["bands"]["1-1"]["tokens_per_s_by_s"]
    assert max(rates, key=lambda k: rates[k]) == "1"
