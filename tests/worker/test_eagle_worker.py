"""EagleDraftWorker eager behaviour: chain fast path == general path, tree == SGLang loop."""

from __future__ import annotations

import pytest
from draft_support import assert_same, draft_loop, tree_lists
from hypothesis import given, settings
from hypothesis import strategies as st

from draftgraph.runtime import (
    CudaGraphConfig,
    DraftInput,
    EagleDraftWorker,
    PhaseGraphConfig,
    RuntimeArgs,
    SpeculativeConfig,
)
from draftgraph.runtime.config import max_tree_candidates
from draftgraph.runtime.testing import TinyDraftModel, make_draft_input

MODEL = TinyDraftModel(vocab_size=64, hidden_size=32, seed=0)
CAPACITY = 8


def worker(s, k=1, n=None, capacity=CAPACITY):
    args = RuntimeArgs(SpeculativeConfig(s, k, n), CudaGraphConfig(PhaseGraphConfig(max_bs=capacity)))
    return EagleDraftWorker(args, MODEL)


def reference_step(ref, inp, s, k, n):
    """SGLang's draft loop shape, built from SGLang's own select/organize and the same model."""
    steps = draft_loop(ref.select_top_k_tokens, MODEL, inp.topk_p, inp.topk_index,
                       inp.hidden_states, s, k)
    return ref.organize_draft_results(*tree_lists(steps), n)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 2 * CAPACITY), st.integers(1, 6), st.integers(0, 999))
def test_chain_fast_path_equals_general(b, s, seed):
    w = worker(s)
    inp = make_draft_input(b, 1, seed=seed)
    state = w.state
    fast = w.drafting.step(state, inp.topk_p, inp.topk_index, inp.hidden_states)
    lists = w.drafting.tree_lists(s, 1, inp.topk_p, inp.topk_index, inp.hidden_states)
    from draftgraph.runtime import organize_draft_results
    general = organize_draft_results(*lists, s + 1)
    for j in range(3):
        assert_same(fast[j], general[j], f"output {j}")
    if b <= CAPACITY:
        assert w.counters.fast_path_hits == 1
        assert fast[1].untyped_storage().data_ptr() == w.state.chain_buffers.score_indices.untyped_storage().data_ptr()
    else:
        assert w.counters.capacity_fallbacks == 1 and w.counters.tree_path_calls == 1


@st.composite
def tree_shapes(draw):
    k = draw(st.integers(1, 6))
    s = draw(st.integers(1, 5))
    n = s + 1 if k == 1 else draw(st.integers(2, max_tree_candidates(s, k) + 1))
    return draw(st.integers(1, 12)), k, s, n, draw(st.integers(0, 999))


@settings(max_examples=40, deadline=None)
@given(tree_shapes())
def test_worker_step_matches_sglang_loop(sglang_ref, shape):
    b, k, s, n, seed = shape
    w = worker(s, k, n)
    inp = make_draft_input(b, k, seed=seed)
    got = w.draft_forward(inp)
    want = reference_step(sglang_ref, inp, s, k, n)
    for j in range(3):
        assert_same(got[j], want[j], f"output {j}")


def test_input_validation():
    w = worker(3, 2, 5)
    inp = make_draft_input(2, 2)
    with pytest.raises(ValueError, match="topk=2 needs 2"):
        w.draft_forward(DraftInput(inp.topk_p[:, :1], inp.topk_index[:, :1], inp.hidden_states))
    with pytest.raises(ValueError, match=r"hidden_states=\(2, 31\)"):
        w.draft_forward(DraftInput(inp.topk_p, inp.topk_index, inp.hidden_states[:, :31]))
    with pytest.raises(TypeError, match="hidden_size"):
        EagleDraftWorker(RuntimeArgs(SpeculativeConfig(2, 1)), lambda ids, h: (ids, h))
    with pytest.raises(TypeError, match="must be a RuntimeArgs"):
        EagleDraftWorker({"num_steps": 2}, MODEL)


def test_counters_for_tree():
    w = worker(3, 4, 8)
    w.draft_forward(make_draft_input(3, 4))
    assert w.counters.tree_path_calls == 1 and w.counters.fast_path_hits == 0
    assert w.state.chain_buffers is None
