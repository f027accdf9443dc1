"""The engine under other threads (issue 32): `stats()` and metrics scrapes while it serves and
reloads, counters that never go down (also across `reset_stats`), and `abort_request` at the
moment a request ends."""

from __future__ import annotations

import sys
import threading

import pytest
from engine_support import engine_args, prompts
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from draftgraph.runtime import SpeculativeConfig
from draftgraph.runtime.engine import SpecDecodeEngine
from draftgraph.runtime.engine.metrics import register_engine_metrics


@pytest.fixture
def fast_switching():
    """Switch threads every few microseconds: the races show in a short test."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def _serve(engine: SpecDecodeEngine, rounds: int, reload: bool = False, reset_every: int = 0) -> int:
    """Serve ``rounds`` batches of short requests, reloading (S 2 <-> 3) at every step when
    asked and resetting the stats between some batches; returns the steps run."""
    steps = 0
    ps = [list(p)[:12] for p in prompts()]
    for i in range(rounds):
        ids = [engine.add_request(ps[(i + j) % len(ps)], 6 + j) for j in range(6)]
        while engine.has_work():
            engine.step()
            steps += 1
            if reload:
                engine.request_reload(engine_args(SpeculativeConfig(2 + steps % 2, 1)))
        for rid in ids:
            engine.pop_result(rid)
        if reset_every and i % reset_every == reset_every - 1:
            engine.reset_stats()
    return steps


def _hammer(work, read) -> tuple[int, list[BaseException]]:
    """Run ``read`` in a loop on another thread while ``work()`` runs here; (reads, errors)."""
    stop, errors, reads = threading.Event(), [], [0]

    def loop():
        while not stop.is_set():
            try:
                read()
                reads[0] += 1
            except Exception as exc:  # noqa: BLE001 (reported by the test thread)
                errors.append(exc)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        work()
    finally:
        stop.set()
        t.join(timeout=30)
    assert not t.is_alive(), "the reading thread did not stop"
    return reads[0], errors


@pytest.mark.slow  # the slow tier: reads under a 1 us switch interval while reloading
def test_stats_from_another_thread_while_serving_and_reloading(fast_switching, make_engine):
    engine = make_engine()
    reads, errors = _hammer(lambda: _serve(engine, 8, reload=True), engine.stats)
    assert reads > 100
    assert not errors, f"{len(errors)} of {reads} stats() calls raised: {errors[:3]}"
    st = engine.stats()
    assert st["reloads"]["recent"] and st["accepted"] == sum(st["accepted_per_pos"].values())


def _counters(registry) -> dict[tuple, float]:
    out = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        if fam.type == "counter":
            for s in fam.samples:
                if s.name.endswith("_total"):
                    out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.mark.slow  # the slow tier: thousands of scrapes under a 1 us switch interval
def test_counters_never_go_down_between_scrapes_even_across_reset_stats(fast_switching, make_engine):
    engine = make_engine()
    registry = CollectorRegistry()
    register_engine_metrics(engine, registry)
    last: dict[tuple, float] = {}
    drops: list[str] = []
    per_pos_sums: list[tuple[float, float]] = []

    def read():
        now = _counters(registry)
        drops.extend(f"{k}: {last[k]} -> {v}" for k, v in now.items() if k in last and v < last[k])
        last.update(now)
        acc = now.get(("draftgraph_spec_decode_accepted_tokens_total", ()), 0.0)
        pos = sum(v for (n, _), v in now.items() if n == "draftgraph_spec_decode_accepted_tokens_per_pos_total")
        per_pos_sums.append((acc, pos))

    reads, errors = _hammer(lambda: _serve(engine, 18, reset_every=4), read)
    assert not errors, errors[:3]
    assert reads > 20
    assert not drops, f"{len(drops)} counter samples went down, e.g. {drops[:5]}"
    assert all(a == p for a, p in per_pos_sums), "accepted tokens and their positions read from two steps"
    final = _counters(registry)
    assert final[("draftgraph_spec_decode_accepted_tokens_total", ())] >= engine.stats()["accepted"] > 0
    assert engine.stats()["tokens_generated"] < final[("draftgraph_tokens_generated_total", ())]  # reset


def test_reset_stats_restarts_stats_not_the_exported_totals(make_engine):
    engine = make_engine()
    registry = CollectorRegistry()
    register_engine_metrics(engine, registry)
    _serve(engine, 2)
    before = _counters(registry)
    engine.reset_stats()
    assert _counters(registry) == before
    zero = engine.stats()
    assert (zero["tokens_generated"], zero["accepted"], zero["accepted_per_pos"], zero["batch_sizes"]) == (0, 0, {}, {})


class _EndHook(dict):
    """A request table whose ``pop`` (a request ending) then lets another thread call
    ``abort_request`` for that request and waits a little for it: the moment a request ends."""

    def __init__(self, engine: SpecDecodeEngine, data: dict) -> None:
        super().__init__(data)
        self.engine, self.results, self.threads = engine, [], []

    def pop(self, rid, *default):
        out = super().pop(rid, *default)

        def abort():
            try:
                self.results.append(self.engine.abort_request(rid))
            except Exception as exc:  # noqa: BLE001 (checked by the test)
                self.results.append(exc)

        t = threading.Thread(target=abort, daemon=True)
        t.start()
        t.join(timeout=0.2)  # with the fix it waits for the move to finish: it cannot end here
        self.threads.append(t)
        return out


def test_abort_of_a_request_ending_at_that_moment_reports_already_finished(make_engine):
    engine = make_engine()
    ids = [engine.add_request(list(p)[:10], 3) for p in prompts()[:4]]
    hook = engine.requests._live = _EndHook(engine, engine.requests._live)  # noqa: SLF001 (the moment a request ends)
    while engine.has_work():
        engine.step()
    for t in hook.threads:
        t.join(timeout=10)
        assert not t.is_alive()
    assert len(hook.results) == len(ids)
    assert all(r is False for r in hook.results), hook.results  # "already finished", never KeyError
    assert [len(engine.pop_result(i)) for i in ids] == [3] * len(ids)
