"""One dispatch decision and one count per event (issue 16): the manager's `lookup` is the only
place that picks a padded size, a replay is counted once and every view agrees with that count,
and a worker's figures survive the states that produced them."""

from __future__ import annotations

import gc

import pytest
import torch

import draftgraph.graphs.manager as manager_module
from draftgraph.graphs import (
    MISS_REASONS,
    GraphCaptureError,
    GraphCaptureManager,
    Miss,
    ReplayCounters,
    ReplayPlan,
    record_spans,
)
from draftgraph.runtime import (
    CudaGraphConfig,
    DraftResult,
    EagleDraftWorker,
    PhaseGraphConfig,
    RuntimeArgs,
    SpeculativeConfig,
)
from draftgraph.runtime.testing import TinyDraftModel, make_draft_input
from draftgraph.runtime.worker.host_phases import GraphStep

SIZES = (1, 2, 4)


def worker(k: int = 1, s: int = 3, n: int | None = None, capacity: int = 8) -> EagleDraftWorker:
    args = RuntimeArgs(SpeculativeConfig(s, k, n), CudaGraphConfig(PhaseGraphConfig(bs=SIZES)),
                       max_running_requests=capacity)
    w = EagleDraftWorker(args, TinyDraftModel(vocab_size=64, hidden_size=32, seed=0))
    w.capture_graphs("trace")
    return w


def views(w: EagleDraftWorker) -> dict[str, int]:
    """Every view of the replay count a user can read."""
    m = w.state.graphs.stats
    return {"worker": w.counters.graph_replays, "state": w.state.stats.graph_replays,
            "manager": m.replays, "sizes": sum(v.replays for v in m.sizes.values())}


def test_one_replay_is_one_in_every_view_and_one_span():
    w = worker()
    assert set(views(w).values()) == {0}
    with record_spans() as spans:
        out = w.draft_forward(make_draft_input(3, 1))
    assert set(views(w).values()) == {1}
    assert [name for name, _ in spans] == ["replay"]
    assert w.state.stats.pad_rows == 1 and w.state.graphs.stats.sizes[4].pad_rows == 1
    assert w.state.stats.steps == 1 and w.state.stats.eager_steps == 0
    assert isinstance(out, DraftResult) and out.draft_tokens.shape == (3, 3)


def test_an_eager_fallback_is_counted_once_with_one_span():
    w = worker(capacity=8)
    with record_spans() as spans:
        w.draft_forward(make_draft_input(6, 1))  # above the largest size (4)
    names = [name for name, _ in spans]
    assert names.count("eager_fallback") == 1 and "replay" not in names
    c = w.counters
    assert (c.graph_eager_fallbacks, c.eager_steps, c.graph_replays) == (1, 1, 0)
    assert w.state.graphs.stats.eager_fallbacks == 0  # the worker ran it, not the manager
    assert c.fast_path_hits == 1  # b = 6 is within the chain buffers' capacity (8)


def test_padding_is_decided_once_per_batch_size(monkeypatch):
    w = worker()
    calls: list[int] = []
    real = manager_module.padded_size

    def counting(table, b):
        calls.append(b)
        return real(table, b)

    monkeypatch.setattr(manager_module, "padded_size", counting)
    for _ in range(3):
        w.draft_forward(make_draft_input(3, 1))
    assert calls == [3]  # decided on b's first step; later steps reuse the plan
    w.draft_forward(make_draft_input(6, 1))
    w.draft_forward(make_draft_input(6, 1))
    assert calls == [3, 6, 6]  # "no graph" is not cached, but still decided once per step


def test_lookup_answers_a_plan_or_a_miss_with_its_reason():
    static = {"x": torch.zeros(4, 2)}
    m = GraphCaptureManager(lambda x: x * 2, static, [2, 4], backend="trace")
    with pytest.raises(RuntimeError, match="capture"):
        m.lookup(1)
    m.capture()
    plan = m.lookup(3)
    assert isinstance(plan, ReplayPlan) and (plan.b, plan.padded) == (3, 4)
    assert m.lookup(3) is plan and m.lookup(5) == Miss("above_max")
    out = m.replay(plan, {"x": torch.ones(3, 2)})
    assert torch.equal(out, torch.full((3, 2), 2.0))
    with pytest.raises(ValueError, match="plan replays 3"):
        m.replay(plan, {"x": torch.ones(2, 2)})
    with pytest.raises(TypeError, match="must be a ReplayPlan"):
        m.replay(m.lookup(5), {"x": torch.ones(5, 2)})
    # the trusted entry (a caller that checked its inputs) replays the same graph
    assert torch.equal(m.replay_trusted(plan, (torch.full((3, 2), 3.0),)), torch.full((3, 2), 6.0))
    eager = GraphCaptureManager(lambda x: x * 2, static, [2, 4], backend="eager")
    eager.capture()
    assert eager.lookup(1) == Miss("eager_backend")


def test_every_miss_reason_is_answered_as_a_value():
    def step(x):
        if x.shape[0] == 2:
            raise RuntimeError("no recording at size 2")
        return x + 1

    m = GraphCaptureManager(step, {"x": torch.zeros(4, 2)}, [2, 4], backend="trace")
    m.begin()
    assert m.lookup(1) == Miss("not_ready") and m.lookup(5) == Miss("above_max")
    m.capture_size(4)
    with pytest.raises(GraphCaptureError):
        m.capture_size(2)
    assert m.lookup(1) == Miss("capture_failed") and isinstance(m.lookup(3), ReplayPlan)
    assert not hasattr(m, "last_miss")  # the reason travels in the answer only
    assert {Miss(r).reason for r in MISS_REASONS} == {
        "eager_backend", "above_max", "not_ready", "capture_failed", "eager_faster"}
    with pytest.raises(TypeError, match="reason"):
        Miss("")


def test_replay_counts_survive_release_and_a_shared_counter():
    counters = ReplayCounters()
    static = {"x": torch.zeros(4, 2)}
    first = GraphCaptureManager(lambda x: x + 1, static, [4], backend="trace", counters=counters)
    first.capture()
    first.run({"x": torch.ones(2, 2)})
    first.release()
    assert first.stats.replays == 1 and first.stats.sizes == {}
    second = GraphCaptureManager(lambda x: x + 1, static, [4], backend="trace", counters=counters)
    second.capture()
    second.run({"x": torch.ones(4, 2)})
    assert second.stats.replays == 2 and second.stats.sizes[4].replays == 2
    assert (counters.replays, counters.pad_rows) == (2, 2)
    with pytest.raises(TypeError, match="counters"):
        GraphCaptureManager(lambda x: x, static, [4], backend="trace", counters={})


def test_worker_figures_survive_reloads_and_collected_states():
    w = worker()
    for b in (1, 3, 6):
        w.draft_forward(make_draft_input(b, 1))
    before = w.counters
    old = w.state
    w.reload(RuntimeArgs(SpeculativeConfig(2, 1), CudaGraphConfig(PhaseGraphConfig(bs=SIZES)),
                         max_running_requests=8))
    del old
    gc.collect()
    after = w.counters
    assert (after.graph_replays, after.eager_steps, after.fast_path_hits) == (
        before.graph_replays, before.eager_steps, before.fast_path_hits) == (2, 1, 3)
    assert after.reloads == 1 and w.state.stats.steps == 0  # the new state starts afresh
    w.draft_forward(make_draft_input(2, 1))
    assert w.counters.graph_replays == 3


def test_counters_are_a_snapshot():
    w = worker()
    snap = w.counters
    snap.graph_replays = 99
    assert w.counters.graph_replays == 0


def test_tree_replays_count_as_tree_path_calls():
    w = worker(k=2, s=3, n=6)
    w.draft_forward(make_draft_input(2, 2, hidden_size=32))
    c = w.counters
    assert (c.graph_replays, c.tree_path_calls, c.fast_path_hits) == (1, 1, 0)


def test_draft_step_and_draft_tokens_have_fixed_types():
    w = worker(k=2, s=3, n=6)
    inp = make_draft_input(2, 2, hidden_size=32)
    result = w.drafting.step(w.state, inp.topk_p, inp.topk_index, inp.hidden_states)
    assert isinstance(result, DraftResult)
    parents, index, tokens = result
    assert index.shape == tokens.shape == (2, 5)
    all_tokens = w.drafting.tokens(w.state, inp.topk_p, inp.topk_index, inp.hidden_states)
    assert isinstance(all_tokens, torch.Tensor) and all_tokens.shape == (2, 2 + 2 * 4)
    assert torch.equal(tokens, all_tokens.gather(1, index))  # the organized tokens are chosen among them
    step = w.drafting.graph_step(w.state, 4, "cpu")
    assert isinstance(step, GraphStep) and set(step.static_inputs) == set(step.pad_values)
