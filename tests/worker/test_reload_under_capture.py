"""A reload requested while background capture units are pending lands within a bounded number
of steps (`boundary.MAX_PREPARE_STEPS`), counted."""

from __future__ import annotations

from engine_support import MAX_NEW, engine_args, models, prompts, reference

from draftgraph.runtime import SpeculativeConfig
from draftgraph.runtime.engine import SpecDecodeEngine
from draftgraph.runtime.engine.boundary import MAX_PREPARE_STEPS

EVERY = 10  # steps between two reload requests


def _engine() -> SpecDecodeEngine:
    target, head = models()
    return SpecDecodeEngine(engine_args(SpeculativeConfig(3, 1), running=4), target, head, backend="trace",
                            capture="background", adaptive_steps=(2, 3, 4))


def _serve(engine: SpecDecodeEngine, steps: int, ids: list[int]) -> None:
    """``steps`` steps with the batch kept full (a new prompt whenever one ends)."""
    ps = prompts()
    for _ in range(steps):
        if len(ids) < 400 and engine.next_batch_size() < 4:
            ids.append(engine.add_request(list(ps[len(ids) % len(ps)]), MAX_NEW))
        for rid in engine.step():
            engine.pop_result(rid)


def test_reloads_requested_every_10_steps_under_background_capture_all_land():
    """Before: each reload waited for graphs queued behind the old state's own pending units,
    the next request superseded it, and none of them was ever applied."""
    engine = _engine()
    try:
        ids: list[int] = []
        for i in range(8):
            engine.request_reload(engine_args(SpeculativeConfig(2 + i % 3, 1), running=4))
            _serve(engine, EVERY, ids)
        r = engine.stats()["reloads"]
        assert r["requested"] == 8 and r["applied"] == 8 and r["superseded"] == 0, r
        assert engine.stats()["reloads_landed_unready"] >= 1  # some landed before their graphs
        check = [engine.add_request(list(p), MAX_NEW) for p in prompts()[:4]]
        while engine.has_work():
            for rid in engine.step():
                if rid in check:
                    continue
                engine.pop_result(rid)
        assert [engine.pop_result(rid) for rid in check] == reference()[:4]
    finally:
        engine.close()


def test_a_reload_lands_within_the_bound():
    engine = _engine()
    try:
        ids: list[int] = []
        _serve(engine, 2, ids)
        generation = engine.worker.generation
        engine.request_reload(engine_args(SpeculativeConfig(4, 1), running=4))
        steps = 0
        while engine.worker.generation == generation and steps <= MAX_PREPARE_STEPS:
            _serve(engine, 1, ids)
            steps += 1
        assert engine.worker.generation == generation + 1, f"not applied after {steps} steps"
        assert engine.args.speculative.num_steps == 4
    finally:
        engine.close()
