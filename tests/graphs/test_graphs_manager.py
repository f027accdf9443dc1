"""GraphCaptureManager on the CPU trace backend: replay == eager, padding, fallback, errors."""

from __future__ import annotations

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings
from hypothesis import strategies as st

from draftgraph.graphs import (
    GraphCaptureError,
    GraphCaptureManager,
    ManagerStats,
    resolve_backend,
)

H, K, V = 16, 4, 12
SIZES = (1, 2, 4, 8)
MAX = SIZES[-1]
# Integer-valued weights and inputs keep the matmul exact, so results cannot depend on
# the batch size the kernel saw (graph at padded size vs eager at b).
W = ((torch.arange(H * H) % 7) - 3).float().reshape(H, H)


def mlp_step(x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [B, H] float, ids [B, V] int64 -> (probs [B, H], top-k probs [B, K], tokens [B, K])."""
    h = torch.relu(x @ W)
    p = torch.softmax(h / 8, dim=-1)
    v, i = torch.topk(p, K, dim=-1)
    return p, v, torch.gather(ids, 1, i % V)


def _static() -> dict[str, torch.Tensor]:
    return {"x": torch.zeros(MAX, H), "ids": torch.zeros(MAX, V, dtype=torch.long)}


def _batch(b: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "x": torch.randint(-3, 4, (b, H), generator=g).float(),
        "ids": torch.randint(0, 1000, (b, V), generator=g),
    }


@pytest.fixture(scope="module")
def manager() -> GraphCaptureManager:
    m = GraphCaptureManager(mlp_step, _static(), SIZES, backend="trace")
    m.capture()
    return m


def _equal(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> bool:
    return len(a) == len(b) and all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b))


def test_capture_state_and_stats(manager: GraphCaptureManager) -> None:
    assert manager.backend_name == "trace"
    assert manager.is_captured and manager.captured_sizes == SIZES and manager.max_size == MAX
    stats = manager.stats
    assert isinstance(stats, ManagerStats) and stats.captures == 1
    assert set(stats.sizes) == set(SIZES)
    assert all(s.capture_s > 0 and s.nodes and s.nodes > 0 for s in stats.sizes.values())
    # fresh outputs live in buffers allocated once, at the largest size
    assert stats.sizes[MAX].capture_bytes == MAX * (H * 4 + K * 4 + K * 8)
    assert all(stats.sizes[s].capture_bytes == 0 for s in SIZES[:-1])
    assert stats.as_dict()["sizes"][str(MAX)]["nodes"] == manager.node_count(MAX)


@pytest.mark.parametrize("size", SIZES)
def test_graph_equals_eager_at_captured_sizes(manager: GraphCaptureManager, size: int) -> None:
    batch = _batch(size, seed=size)
    assert _equal(manager.run(batch), mlp_step(**batch))


@settings(max_examples=30, deadline=None)
@given(st.integers(1, MAX + 4), st.integers(0, 2**16))
def test_graph_equals_eager_between_sizes(manager: GraphCaptureManager, b: int, seed: int) -> None:
    batch = _batch(b, seed)
    out = manager.run(batch)
    assert all(o.shape[0] == b for o in out)
    assert _equal(out, mlp_step(**batch))


def test_pad_rows_filled_and_counted() -> None:
    static = _static()
    m = GraphCaptureManager(mlp_step, static, SIZES, backend="trace", pad_values={"ids": 7, "x": 1.5})
    m.capture()
    m.run(_batch(3))
    assert torch.equal(static["ids"][3:4], torch.full((1, V), 7))
    assert torch.equal(static["x"][3:4], torch.full((1, H), 1.5))
    assert m.padded_size(3) == 4 and m.padded_size(MAX + 1) is None
    assert m.stats.sizes[4].pad_rows == 1 and m.stats.sizes[4].replays == 1 and m.stats.replays == 1


def test_above_largest_runs_eager_and_leaves_static_untouched(manager: GraphCaptureManager) -> None:
    before = {n: t.clone() for n, t in manager.static_inputs.items()}
    fallbacks = manager.stats.eager_fallbacks
    batch = _batch(MAX + 5, seed=3)
    assert _equal(manager.run(batch), mlp_step(**batch))
    assert all(torch.equal(before[n], t) for n, t in manager.static_inputs.items())
    assert manager.stats.eager_fallbacks == fallbacks + 1


def test_clone_false_outputs_are_overwritten_by_next_replay(manager: GraphCaptureManager) -> None:
    first, second = _batch(3, seed=1), _batch(2, seed=2)
    views = manager.run(first)
    kept = manager.run(first, clone=True)
    expected_first = mlp_step(**first)
    assert _equal(kept, expected_first)
    manager.run(second)  # size 2 shares the size-4 graph's output rows
    assert not torch.equal(views[0][:2], expected_first[0][:2])
    assert torch.equal(views[0][:2], mlp_step(**second)[0])
    assert _equal(kept, expected_first)


def test_single_tensor_step_and_in_place_write_into_static_input() -> None:
    def step(state: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return state.mul_(2).add_(x)

    static = {"state": torch.zeros(4, 3), "x": torch.zeros(4, 3)}
    m = GraphCaptureManager(step, static, [2, 4], backend="trace")
    m.capture()
    s0, x0 = torch.arange(9.0).reshape(3, 3), torch.ones(3, 3)
    out = m.run({"state": s0, "x": x0})
    assert isinstance(out, torch.Tensor)
    assert torch.equal(static["state"][:3], s0 * 2 + 1)  # the replay wrote into the static tensor
    assert out.data_ptr() == static["state"].data_ptr()  # and returned a view of it
    assert m.node_count(4) == 2


def test_release_and_recapture() -> None:
    m = GraphCaptureManager(mlp_step, _static(), SIZES, backend="trace")
    m.capture()
    with pytest.raises(RuntimeError, match="already captured"):
        m.capture()
    m.release()
    m.release()
    assert not m.is_captured and m.captured_sizes == () and m.node_count(4) is None
    m.capture()
    batch = _batch(5)
    assert _equal(m.run(batch), mlp_step(**batch)) and m.stats.captures == 2


def test_failed_capture_releases_and_leaves_manager_uncaptured() -> None:
    fail_at = {"size": 2}

    def step(x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == fail_at["size"]:
            raise ValueError("boom at two")
        return x + 1

    m = GraphCaptureManager(step, {"x": torch.zeros(8, 2)}, [1, 2, 4, 8], backend="trace")
    with pytest.raises(GraphCaptureError, match="size 2") as info:
        m.capture()
    assert isinstance(info.value.__cause__, ValueError) and info.value.size == 2
    assert not m.is_captured and m.captured_sizes == () and m.stats.captures == 0
    with pytest.raises(RuntimeError, match="capture"):
        m.run({"x": torch.zeros(1, 2)})
    fail_at["size"] = -1
    m.capture()
    assert torch.equal(m.run({"x": torch.ones(3, 2)}), torch.full((3, 2), 2.0))


def test_output_structure_must_be_batch_major() -> None:
    m = GraphCaptureManager(lambda x: x.sum(0), {"x": torch.zeros(4, 2)}, [2, 4], backend="trace")
    with pytest.raises(GraphCaptureError, match="output 0"):
        m.capture()
    m = GraphCaptureManager(lambda x: [x], {"x": torch.zeros(4, 2)}, [4], backend="trace")
    with pytest.raises(GraphCaptureError, match="tuple of tensors"):
        m.capture()


def test_eager_backend_runs_directly() -> None:
    m = GraphCaptureManager(mlp_step, _static(), SIZES, backend="eager")
    batch = _batch(3)
    assert _equal(m.run(batch), mlp_step(**batch))
    m.capture()
    assert m.is_captured and m.captured_sizes == () and m.padded_size(3) is None
    m.run(_batch(50))
    assert m.stats.eager_runs == 2 and m.stats.replays == 0 and m.stats.eager_fallbacks == 0
    assert GraphCaptureManager(mlp_step, _static(), [], backend="eager").max_size == 0


@pytest.mark.parametrize(
    ("batch", "exc", "match"),
    [
        ({"x": torch.zeros(0, H), "ids": torch.zeros(0, V, dtype=torch.long)}, ValueError, "b=0"),
        ({"x": torch.zeros(2, H)}, ValueError, r"missing \['ids'\]"),
        ({**_batch(2), "y": torch.zeros(2)}, ValueError, r"unexpected \['y'\]"),
        ({"x": torch.zeros(2, H), "ids": torch.zeros(3, V, dtype=torch.long)}, ValueError, "differ"),
        ({"x": torch.zeros(2, H + 1), "ids": torch.zeros(2, V, dtype=torch.long)}, ValueError, r"inputs\['x'\]"),
        ({"x": torch.zeros(2, H, dtype=torch.float64), "ids": torch.zeros(2, V, dtype=torch.long)}, TypeError, "dtype"),
        ({"x": torch.zeros(2, H, device="meta"), "ids": torch.zeros(2, V, dtype=torch.long)}, ValueError, "meta"),
        ({"x": [[0.0] * H], "ids": torch.zeros(1, V, dtype=torch.long)}, TypeError, "Tensor"),
    ],
)
def test_run_rejects_bad_batches(manager: GraphCaptureManager, batch: dict, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        manager.run(batch)


def test_run_before_capture_raises() -> None:
    m = GraphCaptureManager(mlp_step, _static(), SIZES, backend="trace")
    with pytest.raises(RuntimeError, match="capture"):
        m.run(_batch(2))


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"static_inputs": {"x": torch.zeros(3, H), "ids": torch.zeros(8, V)}}, ValueError, "largest capture size 8"),
        ({"static_inputs": {"x": [1.0]}}, TypeError, r"static_inputs\['x'\]"),
        ({"static_inputs": {}}, ValueError, "non-empty"),
        ({"capture_sizes": [0, 4]}, ValueError, "capture_sizes"),
        ({"capture_sizes": []}, ValueError, "empty"),
        ({"pad_values": {"nope": 1}}, ValueError, "nope"),
        ({"pad_values": {"x": "1"}}, TypeError, r"pad_values\['x'\]"),
        ({"backend": "tpu"}, ValueError, "cuda, compile, trace, eager"),
        ({"step": 3}, TypeError, "callable"),
        ({"debug_every": 0}, ValueError, "debug_every"),
    ],
)
def test_constructor_validation(kwargs: dict, exc: type, match: str) -> None:
    args = {"step": mlp_step, "static_inputs": _static(), "capture_sizes": SIZES, "backend": "trace"}
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        GraphCaptureManager(**args)


def test_resolve_backend(monkeypatch) -> None:
    import draftgraph.graphs.backends as backends

    cpu = "compile" if backends.compiler_available() else "trace"
    expected = "cuda" if torch.cuda.is_available() else cpu
    assert resolve_backend("auto") == expected
    assert resolve_backend("auto", device="cpu") == cpu
    monkeypatch.setattr(backends, "compiler_available", lambda: False)  # no C++ compiler
    assert resolve_backend("auto", device="cpu") == "trace"
    with pytest.raises(ValueError, match="no C\\+\\+ compiler"):
        resolve_backend("compile")
    monkeypatch.undo()
    assert resolve_backend("trace") == "trace" and resolve_backend("eager") == "eager"
    with pytest.raises(ValueError, match="auto, cuda, compile, trace, eager"):
        resolve_backend("graph")
    with pytest.raises(TypeError):
        resolve_backend(None)  # type: ignore[arg-type]
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cuda"):
            resolve_backend("cuda")
