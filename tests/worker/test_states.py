"""Runtime states: override_worker_state, build/apply switching, adaptive steps."""

from __future__ import annotations

import pytest
import torch
from draft_support import assert_same

from draftgraph.runtime import (
    AdaptiveStepController,
    CudaGraphConfig,
    EagleDraftWorker,
    MultiLayerEagleDraftWorker,
    PhaseGraphConfig,
    RuntimeArgs,
    SpeculativeConfig,
)
from draftgraph.runtime.testing import TinyDraftModel, make_draft_input

MODEL = TinyDraftModel(vocab_size=64, hidden_size=32, seed=0)
SIZES = (1, 2, 4, 8)


def make_worker(s=3, k=1, n=None, capture=True):
    args = RuntimeArgs(SpeculativeConfig(s, k, n), CudaGraphConfig(PhaseGraphConfig(bs=SIZES)))
    w = EagleDraftWorker(args, MODEL)
    if capture:
        w.capture_graphs("trace")
    return w


def check_replays_match_eager(w, bs=(1, 3, 8), seed=0):
    state = w.state
    for b in bs:
        inp = make_draft_input(b, w.spec.topk, seed=seed + b)
        replays = w.counters.graph_replays
        got = [t.clone() for t in w.draft_forward(inp)]
        assert w.counters.graph_replays == replays + 1, "expected a graph replay"
        want = w.drafting.step(state, inp.topk_p, inp.topk_index, inp.hidden_states, count=False)
        for j in range(3):
            assert_same(got[j], want[j], f"S={state.num_steps} b={b} output {j}")


def churn(nbytes_like: torch.Tensor, rounds: int = 200) -> None:
    """Allocate and free many tensors of the buffers' size (allocator reuse bait)."""
    keep = []
    for i in range(rounds):
        t = torch.full_like(nbytes_like, 7 + i)
        if i % 3 == 0:
            keep.append(t)
    del keep


def test_override_restores_same_buffers_and_graphs():
    w = make_worker(3)
    original = w.state
    buf = w.state.chain_buffers
    ptrs = (buf.parents.data_ptr(), buf.score_indices.data_ptr())
    contents = (buf.parents.clone(), buf.score_indices.clone())
    with w.override_worker_state(5, 6) as temp:
        assert w.state is temp and w.spec.num_steps == 5
        assert w.state.chain_buffers.num_steps == 5 and w.state.chain_buffers is not buf
        w.capture_graphs("trace")
        check_replays_match_eager(w)
        churn(buf.parents)
    churn(buf.score_indices)
    assert w.state is original and w.spec.num_steps == 3
    assert w.state.chain_buffers is buf
    assert (buf.parents.data_ptr(), buf.score_indices.data_ptr()) == ptrs
    assert torch.equal(buf.parents, contents[0]) and torch.equal(buf.score_indices, contents[1])
    check_replays_match_eager(w)


def test_override_restores_on_exception_and_nests():
    w = make_worker(3, capture=False)
    original = w.state
    with pytest.raises(RuntimeError, match="boom"):
        with w.override_worker_state(4, 5):
            with w.override_worker_state(2, 3, capture_bs=[]):
                assert w.spec.num_steps == 2 and w.state.capture_sizes == ()
            assert w.spec.num_steps == 4
            raise RuntimeError("boom")
    assert w.state is original and w.spec.num_steps == 3


def test_override_validates_before_changing_anything():
    w = make_worker(3, capture=False)
    original = w.state
    with pytest.raises(ValueError, match="num_steps \\+ 1"):
        with w.override_worker_state(5, 7):
            pass
    with pytest.raises(ValueError, match="capture_bs=\\[4, 2\\]"):
        with w.override_worker_state(4, 5, capture_bs=[4, 2]):
            pass
    assert w.state is original and w.counters.rebuilds == 0


def test_override_on_multi_layer_worker():
    w = MultiLayerEagleDraftWorker(RuntimeArgs(SpeculativeConfig(3, 1),
                                               CudaGraphConfig(PhaseGraphConfig(max_bs=8))))
    buf = w.state.chain_buffers
    with w.override_worker_state(5, 6):
        inp = make_draft_input(4, 1)
        wide = type(inp)(torch.rand(4, 5), torch.zeros(4, 5, dtype=torch.long))
        out = w.draft_forward(wide)
        assert out[1].shape == (4, 5) and w.counters.fast_path_hits == 1
    assert w.state.chain_buffers is buf


def test_switching_among_built_states():
    w = make_worker(3, capture=False)
    states = [w.build_runtime_state(s, backend="trace") for s in (2, 3, 5)]
    assert w.state not in states  # building does not change the active state
    order = [0, 2, 1, 1, 0, 2, 0, 1, 2, 2, 0]
    for rounds, i in enumerate(order * 3):
        w.apply_runtime_state(states[i])
        assert w.spec.num_steps == states[i].num_steps
        check_replays_match_eager(w, bs=(1 + rounds % 8,), seed=rounds)
    assert w.counters.switches == len(order) * 3


def test_apply_rejects_foreign_state():
    a, b = make_worker(2, capture=False), make_worker(2, capture=False)
    with pytest.raises(ValueError, match="not a state built by this worker"):
        a.apply_runtime_state(b.state)
    with pytest.raises(ValueError, match="not a state built by this worker"):
        a.apply_runtime_state("state")


def test_tree_states_switch():
    w = make_worker(2, 2, 4, capture=False)
    s3 = w.build_runtime_state(3, 6, backend="trace")
    s4 = w.build_runtime_state(4, 8, backend="trace")
    for st in (s3, s4, s3):
        w.apply_runtime_state(st)
        check_replays_match_eager(w)


def test_adaptive_controller_follows_acceptance():
    w = make_worker(3, capture=False)
    ctl = AdaptiveStepController(w, [1, 2, 4, 6], alpha=0.5, capture_bs=[1, 2, 4], backend="trace")
    assert set(ctl.states) == {1, 2, 4, 6}
    assert ctl.step() == 6  # no observation yet: the largest
    for _ in range(10):
        s = ctl.step(0.2)  # poor acceptance: step down
    assert s == 2 and w.spec.num_steps == 2  # smallest S >= ema + 1 (ema -> 0.2)
    for _ in range(10):
        s = ctl.step(5.5)
    assert s == 6
    for _ in range(10):
        s = ctl.step(2.6)
    assert s == 4
    # every replay under the controller matches eager for the state it ran under
    check_replays_match_eager(w, bs=(1, 4))
    with pytest.raises(ValueError, match="ascending and unique"):
        AdaptiveStepController(w, [3, 2])
    with pytest.raises(ValueError, match="accepted_tokens=-1"):
        ctl.observe(-1)


def test_adaptive_controller_rebuilds_after_reload_and_releases_old_states():
    w = make_worker(3, capture=False)
    ctl = AdaptiveStepController(w, [2, 3], capture_bs=[1, 2], backend="trace")
    old = ctl.states
    ctl.step(1.5)
    w.reload(RuntimeArgs(SpeculativeConfig(4, 1), CudaGraphConfig(PhaseGraphConfig(bs=(1, 2, 4)))))
    assert ctl.step(1.5) == 3
    assert all(st.graphs is None for st in old.values())  # released, not left to the GC
    new = ctl.states
    assert w.state is new[3] and new[3].capture_sizes == (1, 2)
    assert new[3].generation == 1 and new[3].has_graphs
    check_replays_match_eager(w, bs=(1, 2))


def test_the_controller_reuses_the_active_state_for_its_own_configuration():
    from draftgraph.runtime import AdaptiveStepController

    w = EagleDraftWorker(RuntimeArgs(SpeculativeConfig(3, 1), CudaGraphConfig(PhaseGraphConfig(bs=(1, 2)))),
                         TinyDraftModel())
    w.capture_graphs("trace")
    active = w.state
    ctl = AdaptiveStepController(w, [2, 3], backend="trace")
    assert ctl.states[3] is active and ctl.states[2] is not active  # S=3 is not captured twice
    assert ctl.step() == 3 and w.state is active and ctl.switches == 0
