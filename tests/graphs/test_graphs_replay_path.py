"""The prepared replay path: exact-type fast checks, the full check as fallback, fixed outputs,
and the one-way imports of the backend modules."""

from __future__ import annotations

import ast
import pathlib
from collections import OrderedDict

import pytest
import torch

from draftgraph.graphs import GraphCaptureManager

W = torch.arange(12.0).reshape(4, 3) - 5


def step(x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [B, 4] float, ids [B, 2] int64 -> (x @ W [B, 3], ids + 1 [B, 2])."""
    return x @ W, ids + 1


def _manager() -> GraphCaptureManager:
    static = {"x": torch.zeros(4, 4), "ids": torch.zeros(4, 2, dtype=torch.long)}
    m = GraphCaptureManager(step, static, [2, 4], backend="trace", pad_values={"ids": 3})
    m.capture()
    return m


def _batch(b: int) -> dict[str, torch.Tensor]:
    return {"x": torch.arange(b * 4.0).reshape(b, 4), "ids": torch.arange(b * 2).reshape(b, 2)}


def _expected(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return batch["x"] @ W, batch["ids"] + 1


class _Sub(torch.Tensor):
    """A tensor subclass: not the exact type the fast check accepts, still a valid input."""


def test_repeated_runs_return_the_same_views_with_fresh_values() -> None:
    m = _manager()
    first = m.run(_batch(3))
    assert all(torch.equal(a, e) for a, e in zip(first, _expected(_batch(3))))
    other = {"x": -_batch(3)["x"], "ids": _batch(3)["ids"] * 2}
    second = m.run(other)
    assert all(a is b for a, b in zip(first, second))  # prepared once per b
    assert all(torch.equal(a, e) for a, e in zip(second, _expected(other)))
    assert m.static_inputs["ids"][3].tolist() == [3, 3]  # pad row filled on every run
    assert m.stats.replays == 2 and m.stats.sizes[4].pad_rows == 2


def test_unusual_but_valid_batches_take_the_full_check() -> None:
    m = _manager()
    m.run(_batch(2))  # prepares b=2
    batch = _batch(2)
    as_ordered = OrderedDict(batch)
    as_sub = {"x": batch["x"].as_subclass(_Sub), "ids": batch["ids"]}
    for inputs in (as_ordered, as_sub):
        out = m.run(inputs, clone=True)
        assert all(torch.equal(a, e) for a, e in zip(out, _expected(batch)))


@pytest.mark.parametrize(
    "bad, error, match",
    [
        ({"x": torch.zeros(2, 4, dtype=torch.float64), "ids": torch.zeros(2, 2, dtype=torch.long)},
         TypeError, "dtype"),
        ({"x": torch.zeros(2, 5), "ids": torch.zeros(2, 2, dtype=torch.long)}, ValueError, "shape"),
        ({"x": torch.zeros(2, 4), "ids": torch.zeros(3, 2, dtype=torch.long)}, ValueError, "differ"),
        ({"x": torch.zeros(2, 4)}, ValueError, "missing"),
        ({"x": torch.zeros(2, 4), "ids": torch.zeros(2, 2, dtype=torch.long), "y": torch.zeros(2)},
         ValueError, "unexpected"),
    ],
)
def test_bad_batches_are_still_rejected_after_the_size_is_prepared(bad, error, match) -> None:
    m = _manager()
    m.run(_batch(2))
    before = {n: t.clone() for n, t in m.static_inputs.items()}
    with pytest.raises(error, match=match):
        m.run(bad)
    assert all(torch.equal(before[n], t) for n, t in m.static_inputs.items())


def test_trace_graph_outputs_are_fixed_and_release_clears_them() -> None:
    m = _manager()
    graph = m.captured_graph(4)
    assert graph.replay() is graph.outputs and graph.replay() is graph.outputs
    assert all(o.shape[0] == 4 for o in graph.outputs)
    m.release()
    assert graph.outputs == () and m.captured_graph(4) is None


def test_release_and_recapture_drops_prepared_sizes() -> None:
    m = _manager()
    m.run(_batch(3))
    m.release()
    m.capture()
    out = m.run(_batch(3))
    assert all(torch.equal(a, e) for a, e in zip(out, _expected(_batch(3))))


def _relative_imports(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.module for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module}


def test_backend_imports_run_one_way() -> None:
    graphs = pathlib.Path(__import__("draftgraph.graphs", fromlist=["x"]).__file__).parent
    assert "backends" not in _relative_imports(graphs / "core" / "protocol.py")
    for name in ("backend_cuda", "backend_eager"):
        imports = _relative_imports(graphs / f"{name}.py")
        assert "backends" not in imports and "core.protocol" in imports, name
    imports = _relative_imports(graphs / "core" / "backend_trace.py")  # graphs/core/: beside protocol
    assert "backends" not in imports and "protocol" in imports
    assert {"backend_cuda", "backend_eager", "core.backend_trace", "core.protocol"} <= _relative_imports(
        graphs / "backends.py")
