"""Chain fast path == general path bitwise; views of the buffers within capacity."""

from __future__ import annotations

import pytest
import torch
from draft_support import assert_same
from hypothesis import given, settings
from hypothesis import strategies as st

from draftgraph.runtime import (
    CudaGraphConfig,
    DraftInput,
    MultiLayerEagleDraftWorker,
    PhaseGraphConfig,
    RuntimeArgs,
    SpeculativeConfig,
)
from draftgraph.runtime.topology.chain import ChainBuffers
from draftgraph.runtime.topology.organize import organize_chain_steps

CAPACITY = 12


def make_worker(s: int, capacity: int = CAPACITY) -> MultiLayerEagleDraftWorker:
    args = RuntimeArgs(SpeculativeConfig(s, 1), CudaGraphConfig(PhaseGraphConfig(max_bs=capacity)))
    return MultiLayerEagleDraftWorker(args)


def chain_input(b: int, s: int, seed: int) -> DraftInput:
    gen = torch.Generator().manual_seed(seed)
    return DraftInput(torch.rand(b, s, generator=gen), torch.randint(0, 500, (b, s), generator=gen),
                      torch.randn(b, 8, generator=gen))


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 2 * CAPACITY), st.integers(1, 8), st.integers(0, 10_000))
def test_fast_path_equals_general_path(b, s, seed):
    worker = make_worker(s)
    inp = chain_input(b, s, seed)
    got = worker.draft_forward(inp)
    want = organize_chain_steps(inp.topk_p, inp.topk_index, inp.hidden_states, s, s + 1)
    for j in range(3):
        assert_same(got[j], want[j], f"output {j}")
    buf = worker.state.chain_buffers
    if b <= CAPACITY:
        assert worker.counters.fast_path_hits == 1 and worker.counters.tree_path_calls == 0
        assert got[0].untyped_storage().data_ptr() == buf.parents.untyped_storage().data_ptr()
        assert got[1].untyped_storage().data_ptr() == buf.score_indices.untyped_storage().data_ptr()
        assert got[2] is inp.topk_index
        assert got.layout is buf.layout  # the chain's constants travel with the views
    else:
        assert worker.counters.capacity_fallbacks == 1 and worker.counters.tree_path_calls == 1
        assert got.layout is None  # SGLang's general organize: decoded with topk 1
        assert got[1].untyped_storage().data_ptr() != buf.score_indices.untyped_storage().data_ptr()


def test_closed_form_constants():
    for s in range(1, 7):
        buf = ChainBuffers(s, 5)
        width = s if s > 1 else 0
        assert buf.parents.shape == (5, width) and buf.score_indices.shape == (5, s)
        assert buf.parents.dtype == torch.long and buf.parents.is_contiguous()
        assert buf.score_indices.is_contiguous()
        for row in buf.parents.tolist():
            assert row == list(range(-1, width - 1))
        for row in buf.score_indices.tolist():
            assert row == list(range(s))


def test_rebuild_same_key_returns_same_tensors():
    w = make_worker(3)
    first = w.state.chain_buffers
    with w.override_worker_state(3) as state:  # a new state for the same S: the same tensors
        again = state.chain_buffers
    assert state is not w.state and again is first and again.parents is first.parents
    assert (first.num_steps, first.capacity, str(first.device)) == (3, CAPACITY, "cpu")


def test_view_validation():
    buf = ChainBuffers(3, 4)
    with pytest.raises(ValueError, match=r"bs=5: must be an int in \[1, capacity=4\]"):
        buf.view(5)
    with pytest.raises(ValueError, match="bs=0"):
        buf.view(0)
    p, s = buf.view(3)
    assert p.shape == (3, 3) and s.shape == (3, 3)


def test_stale_steps_do_not_take_fast_path():
    """S changed without a rebuild: the key check refuses the old buffers, results stay right."""
    w = make_worker(3)
    w.state.spec = w.spec.with_steps(5)  # raw write, no rebuild
    inp = chain_input(4, 5, seed=1)
    got = w.draft_forward(inp)
    assert w.counters.fast_path_hits == 0 and w.counters.tree_path_calls == 1
    want = organize_chain_steps(inp.topk_p, inp.topk_index, None, 5, 6)
    for j in range(3):
        assert_same(got[j], want[j], f"output {j}")
    w.apply_runtime_state(w.build_runtime_state(5, capture_bs=[]))  # a state with buffers for S=5
    got = w.draft_forward(inp)
    assert w.counters.fast_path_hits == 1
    for j in range(3):
        assert_same(got[j], want[j], f"output {j} after rebuild")


def test_wrong_width_takes_general_path_or_errors():
    w = make_worker(3)
    with pytest.raises(ValueError, match="needs 3"):
        w.draft_forward(chain_input(2, 4, seed=0))
    assert w.counters.fast_path_hits == 0


def test_multi_layer_requires_topk_1_and_checks_input():
    with pytest.raises(ValueError, match="topk must be 1"):
        MultiLayerEagleDraftWorker(RuntimeArgs(SpeculativeConfig(2, 2, 4)))
    w = make_worker(2)
    with pytest.raises(TypeError, match="needs attributes topk_p, topk_index"):
        w.draft_forward(object())
    with pytest.raises(ValueError, match="must have the same shape"):
        w.draft_forward(DraftInput(torch.rand(2, 2), torch.zeros(2, 3, dtype=torch.long)))
    with pytest.raises(ValueError, match="batch size 0"):
        w.draft_forward(DraftInput(torch.rand(0, 2), torch.zeros(0, 2, dtype=torch.long)))


def test_sglang_style_input_object_works():
    class EagleDraftInputLike:  # any object with the three attributes
        def __init__(self, inp):
            self.topk_p, self.topk_index, self.hidden_states = inp.topk_p, inp.topk_index, None

    w = make_worker(4)
    inp = chain_input(3, 4, seed=2)
    got = w.draft_forward(EagleDraftInputLike(inp))
    assert got[2] is inp.topk_index


def test_fast_path_span_only_when_listened_to():
    from draftgraph.graphs import record_spans, spans_active

    w = make_worker(3)
    inp = chain_input(2, 3, seed=0)
    assert not spans_active()
    with record_spans() as spans:
        assert spans_active()
        w.draft_forward(inp)
        w.draft_forward(chain_input(2 * CAPACITY, 3, seed=0))
    assert spans == [("organize_fast", {"bs": 2, "num_steps": 3}),
                     ("organize_tree", {"bs": 2 * CAPACITY, "num_steps": 3})]


def test_tensor_subclass_inputs_are_accepted():
    """The hot-path check is by exact type; a tensor subclass takes the full check and passes."""

    class Tagged(torch.Tensor):
        pass

    w = make_worker(3)
    inp = chain_input(2, 3, seed=0)
    sub = DraftInput(inp.topk_p.as_subclass(Tagged), inp.topk_index.as_subclass(Tagged))
    out = w.draft_forward(sub)
    assert out[2] is sub.topk_index and w.counters.fast_path_hits == 1
    with pytest.raises(TypeError, match=r"draft_input.topk_index=list: must be a 2-D tensor"):
        w.draft_forward(DraftInput(inp.topk_p, [[1, 2, 3]]))
    with pytest.raises(TypeError, match=r"topk_index=\(6,\): must be a 2-D tensor"):
        w.draft_forward(DraftInput(inp.topk_p, torch.zeros(6, dtype=torch.long)))
