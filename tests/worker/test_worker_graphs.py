"""EagleDraftWorker with captured graphs (trace backend on the CPU, cuda where present)."""

from __future__ import annotations

import pytest
import torch
from draft_support import assert_same
from engine_support import tiny_worker
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftgraph.graphs import GraphCaptureManager, record_spans
from draftgraph.runtime import EagleDraftWorker, SpeculativeConfig
from draftgraph.runtime.testing import TinyDraftModel, make_draft_input

MODEL = TinyDraftModel(vocab_size=64, hidden_size=32, seed=0)
SIZES = (1, 2, 4, 8, 12)
MAX_REQUESTS = 20  # chain capacity above the largest graph: eager fallbacks still take the fast path


def captured_worker(k: int, s: int = 3, n: int | None = None, device: str = "cpu",
                    backend: str = "trace") -> EagleDraftWorker:
    return tiny_worker(SpeculativeConfig(s, k, n), bs=SIZES, running=MAX_REQUESTS, device=device, backend=backend)


@pytest.fixture(scope="module")
def chain_worker() -> EagleDraftWorker:
    return captured_worker(1)


@pytest.fixture(scope="module")
def tree_worker() -> EagleDraftWorker:
    return captured_worker(4, 3, 8)


def eager(w: EagleDraftWorker, inp):
    return w.drafting.step(w.state, inp.topk_p, inp.topk_index, inp.hidden_states, count=False)


def checksum(w: EagleDraftWorker) -> list[torch.Tensor]:
    return [t.clone() for t in w.state.graphs.static_inputs.values()]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(b=st.integers(1, 2 * MAX_REQUESTS), seed=st.integers(0, 999))
def test_chain_graph_equals_eager(chain_worker, b, seed):
    check_graph_equals_eager(chain_worker, b, seed)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(b=st.integers(1, 2 * MAX_REQUESTS), seed=st.integers(0, 999))
def test_tree_graph_equals_eager(tree_worker, b, seed):
    check_graph_equals_eager(tree_worker, b, seed)


def check_graph_equals_eager(w: EagleDraftWorker, b: int, seed: int) -> None:
    inp = make_draft_input(b, w.spec.topk, seed=seed, device=w.args.device)
    before_replays = w.counters.graph_replays
    before_static = checksum(w)
    result = w.draft_forward(inp)
    got = [t.clone() for t in result]
    want = eager(w, inp)
    assert result.layout is want.layout  # the chain's constants, or None for a dynamic tree
    for j in range(3):
        assert_same(got[j], want[j], f"output {j} at b={b}")
    if b <= SIZES[-1]:
        assert w.counters.graph_replays == before_replays + 1
    else:  # above the largest size: eager, static buffers untouched
        assert w.counters.graph_replays == before_replays
        for a, c in zip(before_static, checksum(w)):
            assert torch.equal(a, c)


def test_chain_graph_returns_chain_buffer_views(chain_worker):
    inp = make_draft_input(3, 1, seed=4)
    parents, score_indices, _ = chain_worker.draft_forward(inp)
    buf = chain_worker.state.chain_buffers
    assert parents.untyped_storage().data_ptr() == buf.parents.untyped_storage().data_ptr()
    assert score_indices.untyped_storage().data_ptr() == buf.score_indices.untyped_storage().data_ptr()


def test_node_counts_chain_organize_adds_nothing(chain_worker, tree_worker):
    st_chain = chain_worker.state
    step, static, pads = chain_worker.drafting.graph_step(st_chain, SIZES[-1], "cpu", organize=False)[:3]
    bare = GraphCaptureManager(step, static, SIZES, backend="trace", pad_values=pads)
    bare.capture()
    for s in SIZES:
        chain_nodes = st_chain.graphs.node_count(s)
        assert chain_nodes == bare.node_count(s) and chain_nodes > 0
        assert tree_worker.state.graphs.node_count(s) > chain_nodes
    assert st_chain.stats.nodes[SIZES[0]] == st_chain.graphs.node_count(SIZES[0])
    bare.release()


def test_graphs_refused_after_raw_step_change():
    w = captured_worker(1, s=3)
    w.state.spec = w.spec.with_steps(4)  # a raw write: no rebuild, no recapture
    inp = make_draft_input(2, 1, seed=1)
    replays = w.counters.graph_replays
    got = w.draft_forward(inp)
    assert w.counters.graph_replays == replays  # the S=3 graphs are not replayed
    assert got[2].shape == (2, 4)
    assert w.counters.fast_path_hits == 0  # S=3 buffers refused as well


def test_capture_under_profiler_keeps_node_counts(chain_worker):
    """Spans are host-side only: capturing while a profiler runs records none into the graph."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        w = captured_worker(1)
    assert w.state.stats.nodes == chain_worker.state.stats.nodes


def test_spans_emitted_by_worker():
    w = captured_worker(1)
    with record_spans() as spans:
        w.draft_forward(make_draft_input(3, 1))
        w.draft_forward(make_draft_input(20, 1))
    names = [name for name, _ in spans]
    assert "replay" in names
    replay_attrs = dict(spans[names.index("replay")][1])
    assert replay_attrs["bs"] == 3 and replay_attrs["padded"] == 4
    assert "organize_fast" in names  # the eager step above the largest size, within capacity
    assert dict(spans[names.index("eager_fallback")][1]) == {"bs": 20, "reason": "above_max"}
    with record_spans() as spans, w.override_worker_state(3, capture_bs=[]):
        pass
    assert [n for n, _ in spans] == ["rebuild"]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("k,n", [(1, None), (4, 8)])
def test_cuda_graph_equals_eager(k, n):
    w = captured_worker(k, 3, n, device="cuda", backend="cuda")
    for b in (1, 3, 8, 12, 13, 40):
        check_graph_equals_eager(w, b, seed=b)
    nodes = w.state.stats.nodes
    assert set(nodes) == set(w.state.capture_sizes)  # a count (or None: not readable here) per size
    assert all(v is None or v > 0 for v in nodes.values())  # a captured draft step launches kernels


@pytest.mark.parametrize("k,n", [(1, None), (4, 8)])
def test_jit_replay_engine_keeps_semantics(monkeypatch, k, n):
    """DRAFTGRAPH_TRACE_REPLAY=jit replays through TorchScript: same results, same aliasing."""
    monkeypatch.setenv("DRAFTGRAPH_TRACE_REPLAY", "jit")
    w = captured_worker(k, 3, n)
    engines = {g.engine for g in w.state.graphs._graphs.values()}
    assert engines == {"jit"}
    for b in (1, 3, 12, 30):
        check_graph_equals_eager(w, b, seed=b)
    if k == 1:
        test_chain_graph_returns_chain_buffer_views(w)


def test_bad_replay_engine_is_rejected(monkeypatch):
    monkeypatch.setenv("DRAFTGRAPH_TRACE_REPLAY", "python")
    with pytest.raises(ValueError, match="DRAFTGRAPH_TRACE_REPLAY='python'"):
        captured_worker(1)


@pytest.mark.parametrize("k,n", [(1, None), (4, 8)])
def test_debug_mode_checks_every_replay_of_the_worker(monkeypatch, k, n):
    """DRAFTGRAPH_DEBUG=1, every replay compared with eager inside the manager: no mismatch."""
    monkeypatch.setenv("DRAFTGRAPH_DEBUG", "1")
    monkeypatch.setenv("DRAFTGRAPH_DEBUG_EVERY", "1")
    w = captured_worker(k, 3, n)
    for b in (1, 3, 5, 12):
        w.draft_forward(make_draft_input(b, k, seed=b))
    assert w.state.graphs.stats.debug_checks == 4
