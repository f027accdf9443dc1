"""CUDA backend: replay == eager, node counts, clean host-sync failures, memory back to baseline."""

from __future__ import annotations

import gc

import pytest
import torch

from draftgraph.graphs import GraphCaptureError, GraphCaptureManager, record_spans

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

H, K, V = 32, 4, 16
SIZES = (1, 2, 4, 8, 16)
MAX = SIZES[-1]


def _weights() -> torch.Tensor:
    return ((torch.arange(H * H, device="cuda") % 7) - 3).float().reshape(H, H)


def _make_step(w: torch.Tensor):
    def step(x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, H], ids [B, V] -> (probs [B, H], top-k probs [B, K], tokens [B, K])."""
        p = torch.softmax(torch.relu(x @ w) / 8, dim=-1)
        v, i = torch.topk(p, K, dim=-1)
        return p, v, torch.gather(ids, 1, i % V)

    return step


def _static() -> dict[str, torch.Tensor]:
    return {"x": torch.zeros(MAX, H, device="cuda"), "ids": torch.zeros(MAX, V, dtype=torch.long, device="cuda")}


def _batch(b: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return {
        "x": torch.randint(-3, 4, (b, H), generator=g, device="cuda").float(),
        "ids": torch.randint(0, 1000, (b, V), generator=g, device="cuda"),
    }


def _node_introspection() -> bool:
    try:
        from cuda.bindings import runtime  # noqa: F401
    except ImportError:
        try:
            from cuda import cudart  # noqa: F401
        except ImportError:
            return False
    return hasattr(torch.cuda.CUDAGraph, "raw_cuda_graph")


@pytest.fixture(scope="module")
def manager() -> GraphCaptureManager:
    m = GraphCaptureManager(_make_step(_weights()), _static(), SIZES, backend="auto")
    m.capture()
    yield m
    m.release()


def test_backend_and_sizes(manager: GraphCaptureManager) -> None:
    assert manager.backend_name == "cuda" and manager.captured_sizes == SIZES
    # the largest size is captured first into the fresh pool: its outputs are allocated there
    assert manager.stats.sizes[MAX].capture_bytes > 0


@pytest.mark.parametrize("b", [1, 2, 3, 5, 8, 11, 16])
def test_graph_equals_eager(manager: GraphCaptureManager, b: int) -> None:
    batch = _batch(b, seed=b)
    step = _make_step(_weights())
    got = manager.run(batch, clone=True)
    want = step(**batch)
    torch.cuda.synchronize()
    for g, w in zip(got, want):
        assert g.shape == w.shape and torch.equal(g, w)


def test_above_largest_is_eager_and_static_untouched(manager: GraphCaptureManager) -> None:
    before = {n: t.clone() for n, t in manager.static_inputs.items()}
    batch = _batch(MAX + 3, seed=7)
    out = manager.run(batch)
    want = _make_step(_weights())(**batch)
    assert all(torch.equal(g, w) for g, w in zip(out, want))
    assert all(torch.equal(before[n], t) for n, t in manager.static_inputs.items())
    assert manager.stats.eager_fallbacks >= 1


def test_clone_false_is_overwritten(manager: GraphCaptureManager) -> None:
    first, second = _batch(4, seed=1), _batch(4, seed=2)
    views = manager.run(first)
    kept = manager.run(first, clone=True)
    manager.run(second)
    torch.cuda.synchronize()
    assert torch.equal(kept[0], _make_step(_weights())(**first)[0])
    assert torch.equal(views[0], _make_step(_weights())(**second)[0])


def test_node_counts(manager: GraphCaptureManager) -> None:
    if not _node_introspection():
        pytest.skip("needs cuda-python (cuda.bindings) and CUDAGraph.raw_cuda_graph for node counts")
    assert all(manager.node_count(s) is not None and manager.node_count(s) > 0 for s in SIZES)


def test_constant_slices_return_the_constant() -> None:
    const = torch.arange(MAX * 3, device="cuda").reshape(MAX, 3)
    m = GraphCaptureManager(lambda x: const[: x.shape[0]], {"x": torch.zeros(MAX, 2, device="cuda")}, [4, MAX])
    m.capture()
    out = m.run({"x": torch.zeros(3, 2, device="cuda")})
    assert out.data_ptr() == const.data_ptr() and torch.equal(out, const[:3])
    m.release()


def test_host_sync_fails_cleanly_and_manager_recovers() -> None:
    sync = {"on": True}

    def step(x: torch.Tensor) -> torch.Tensor:
        return x * (x.sum().item() if sync["on"] else 1.0)

    m = GraphCaptureManager(step, {"x": torch.ones(8, 4, device="cuda")}, [4, 8])
    with pytest.raises(GraphCaptureError, match="aten._local_scalar_dense"):
        m.capture()
    assert not m.is_captured
    sync["on"] = False
    m.capture()
    assert torch.equal(m.run({"x": torch.ones(3, 4, device="cuda")}), torch.ones(3, 4, device="cuda"))
    m.release()


def test_spans_and_release_returns_memory() -> None:
    m = GraphCaptureManager(_make_step(_weights()), _static(), SIZES)
    batch = _batch(3)
    gc.collect()
    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()
    for _ in range(5):
        with record_spans() as records:
            m.capture()
            m.run(batch)
        m.release()
        assert ("replay", {"bs": 3, "padded": 4}) in records
    gc.collect()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == baseline


def test_managers_sharing_one_pool_replay_in_any_order() -> None:
    """Two managers (a state's draft step and a phase) captured into one `CaptureShare`: each
    replay equals eager in either order, and one's replay never overwrites the other's outputs."""
    from draftgraph.graphs.capture_share import CaptureShare

    share = CaptureShare()
    steps = {"first": _make_step(_weights()), "second": _make_step(_weights() * 2)}
    managers = {name: GraphCaptureManager(step, _static(), SIZES, backend="cuda", share=share)
                for name, step in steps.items()}
    for manager in managers.values():
        manager.capture()
    assert share.device is not None and share.device.type == "cuda"
    for order in (("first", "second"), ("second", "first")):
        got = {}
        for seed, name in enumerate(order):
            batch = _batch(4, seed=seed)
            got[name] = (managers[name].run(batch), batch)  # views of graph memory, both still live
        for name, (outs, batch) in got.items():
            for g, e in zip(outs, steps[name](**batch)):
                assert torch.equal(g, e), (order, name)
    for manager in managers.values():
        manager.release()
