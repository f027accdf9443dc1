"""Trace backend semantics: baked constants, node counts, host-sync and data-dependent rejection."""

from __future__ import annotations

import pytest
import torch

from draftgraph.graphs import GraphCaptureError, GraphCaptureManager

SIZES = (1, 2, 4)


def _manager(step, static: dict[str, torch.Tensor] | None = None, sizes=SIZES) -> GraphCaptureManager:
    return GraphCaptureManager(step, static or {"x": torch.zeros(max(sizes), 3)}, sizes, backend="trace")


def test_constant_slices_are_views_of_the_constant_with_zero_nodes() -> None:
    parents = torch.arange(8 * 5).reshape(8, 5)
    scores = torch.arange(8 * 2, dtype=torch.float32).reshape(8, 2)

    def step(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b = x.shape[0]
        return parents[:b], scores[:b]

    m = _manager(step)
    m.capture()
    out = m.run({"x": torch.ones(3, 3)})
    assert out[0].untyped_storage().data_ptr() == parents.untyped_storage().data_ptr()
    assert out[1].untyped_storage().data_ptr() == scores.untyped_storage().data_ptr()
    assert torch.equal(out[0], parents[:3]) and torch.equal(out[1], scores[:3])
    assert all(m.node_count(s) == 0 for s in SIZES)
    assert all(s.nodes == 0 and s.capture_bytes == 0 for s in m.stats.sizes.values())
    parents[0, 0] = 99  # the very same tensor: a later write shows through
    assert m.run({"x": torch.ones(1, 3)})[0][0, 0].item() == 99


def test_node_count_counts_compute_ops_only() -> None:
    def step(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu((x + 1) * 2)  # three kernels
        return y, y.t().contiguous().t()[:, :2]  # views are free; contiguous is a copy kernel

    m = _manager(step)
    m.capture()
    assert m.node_count(4) == 4
    assert m.stats.sizes[2].nodes == 4
    assert m.node_count(3) is None


def test_fresh_outputs_share_one_buffer_across_sizes() -> None:
    m = _manager(lambda x: x * 3)
    m.capture()
    small = m.run({"x": torch.ones(1, 3)})
    large = m.run({"x": torch.full((4, 3), 2.0)})
    assert small.data_ptr() == large.data_ptr()  # the shared "pool": size s uses the first s rows
    assert torch.equal(small, torch.full((1, 3), 6.0))


def test_python_control_flow_is_baked_at_capture() -> None:
    flag = {"double": True}

    def step(x: torch.Tensor) -> torch.Tensor:
        return x * 2 if flag["double"] else x

    m = _manager(step)
    m.capture()
    flag["double"] = False
    assert torch.equal(m.run({"x": torch.ones(2, 3)}), torch.full((2, 3), 2.0))


@pytest.mark.parametrize(
    ("read", "op"),
    [
        (lambda x: x.sum().item(), "Tensor.item"),
        (lambda x: len(x.tolist()), "Tensor.tolist"),
        (lambda x: 1.0 if bool(x.sum() > 0) else 2.0, "Tensor.__bool__"),
        (lambda x: 1.0 if x.sum() > 0 else 2.0, "Tensor.__bool__"),
        (lambda x: float(x[0, 0]), "Tensor.__float__"),
    ],
)
def test_host_sync_fails_capture_and_manager_stays_usable(read, op: str) -> None:
    sync = {"on": True}

    def step(x: torch.Tensor) -> torch.Tensor:
        scale = read(x) if sync["on"] else 1.0
        return x * scale

    m = _manager(step)
    with pytest.raises(GraphCaptureError) as info:
        m.capture()
    message = str(info.value)
    assert "aten._local_scalar_dense" in message and op in message and "size 4" in message
    assert info.value.size == 4
    assert not m.is_captured and m.captured_sizes == ()
    sync["on"] = False
    m.capture()
    assert torch.equal(m.run({"x": torch.ones(3, 3)}), torch.ones(3, 3))


@pytest.mark.parametrize(
    ("step", "op"),
    [
        (lambda x: torch.nonzero(x)[:1].float().expand(x.shape[0], 2), "aten::nonzero"),
        (lambda x: x[x > 0][:1].expand(x.shape[0]), "aten::index"),
    ],
)
def test_data_dependent_shapes_fail_capture(step, op: str) -> None:
    m = _manager(step, {"x": torch.ones(4, 3)})
    with pytest.raises(GraphCaptureError, match=op):
        m.capture()
    assert not m.is_captured


def test_host_sync_at_a_smaller_size_releases_larger_graphs() -> None:
    def step(x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1:
            return x * x.max().item()
        return x * 2

    m = _manager(step)
    with pytest.raises(GraphCaptureError, match="size 1"):
        m.capture()
    assert m.captured_sizes == () and m.stats.sizes == {}
