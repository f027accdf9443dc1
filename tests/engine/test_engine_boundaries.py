"""Bad ids stop at the boundary; pad rows never touch a live request's KV; acceptance is real."""

from __future__ import annotations

import pytest
import torch
from engine_support import models

from draftgraph.runtime import RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.engine import SpecDecodeEngine
from draftgraph.runtime.engine.slot_state import StepBatch
from draftgraph.runtime.models import greedy_generate
from draftgraph.runtime.models.corpus import held_out_prompts


@pytest.mark.parametrize("bad,frag", [([1, 2, 300], r"prompt_ids\[2\]=300"),
                                      ([-1], r"prompt_ids\[0\]=-1"),
                                      ([1, 2.0], r"prompt_ids\[1\]=2.0"),
                                      ([], "at least one token")])
def test_bad_prompt_ids_rejected_at_add_request(bad, frag, make_engine):
    engine = make_engine(bs=(4, 8), running=8)
    with pytest.raises(ValueError, match=frag):
        engine.add_request(bad, 4)
    assert not engine.has_work()


def test_too_long_request_rejected(make_engine):
    engine = make_engine(bs=(4, 8), running=8)
    with pytest.raises(ValueError, match="max_len"):
        engine.add_request([65] * 400, 200)


def test_pad_rows_never_touch_live_kv(make_engine):
    engine = make_engine(backend="trace", bs=(4, 8), running=8)
    for p in held_out_prompts(3, seed=9):
        engine.add_request(list(p), 40)
    engine.step()  # admit and run one step: 3 live requests, replayed at padded size 4
    reqs = engine.running
    assert len(reqs) == 3
    draft_cache = engine.drafter.head.cache
    before = [[t[r.slot].clone() for t in (*draft_cache.k, *draft_cache.v, *engine.cache.k, *engine.cache.v)]
              for r in reqs]
    replays = engine.worker.counters.graph_replays
    batch = StepBatch.gather(engine.slot_state, [r.slot for r in reqs], [r.seq_len for r in reqs])
    for _ in range(3):
        engine.drafter.draft(engine.slot_state, batch)
    assert engine.worker.counters.graph_replays == replays + 3
    assert engine.worker.state.stats.pad_rows >= 3
    after = [[t[r.slot] for t in (*draft_cache.k, *draft_cache.v, *engine.cache.k, *engine.cache.v)]
             for r in reqs]
    for b, a in zip(before, after):
        assert all(torch.equal(x, y) for x, y in zip(b, a))


@pytest.mark.slow  # the slow tier: 8 prompts of 48 tokens against greedy
def test_acceptance_on_held_out_prompts():
    target, head = models("eagle")
    prompts = [list(p) for p in held_out_prompts(8, seed=21)]
    args = RuntimeArgs(SpeculativeConfig(3, 1), max_running_requests=8)
    engine = SpecDecodeEngine(args, target, head, backend="eager")
    out = engine.generate(prompts, 48)
    assert out == greedy_generate(target, prompts, 48)
    assert engine.stats()["accept_length_mean"] >= 2.5


def test_reset_stats_starts_the_counters_afresh(make_engine):
    """After a warm-up and reset_stats, stats() describe only what ran since: the same figures
    as a fresh engine serving the same requests (the engine is deterministic)."""
    target, head = models("eagle")
    prompts = [list(p) for p in held_out_prompts(2, seed=33)]
    warmed = make_engine(bs=(4, 8), running=8)
    warmed.generate([p[:8] for p in prompts], 4)
    assert warmed.stats()["tokens_generated"] == 8
    warmed.reset_stats()
    zero = warmed.stats()
    assert (zero["tokens_generated"], zero["steps"], zero["request_verifies"]) == (0, 0, 0)
    assert zero["accept_length_mean"] == 0.0
    out = warmed.generate(prompts, 16)
    fresh = make_engine(bs=(4, 8), running=8)
    assert out == fresh.generate(prompts, 16)
    keys = ("tokens_generated", "committed", "request_verifies", "verify_steps", "accept_length_mean")
    assert {k: warmed.stats()[k] for k in keys} == {k: fresh.stats()[k] for k in keys}
    assert warmed.stats()["tokens_generated"] == 32
