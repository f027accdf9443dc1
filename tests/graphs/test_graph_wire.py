"""An aten graph sent to the compile process as plain data (`graphs.core.graph_wire`): rebuilt node for
node, with no constants a second trace would add; what cannot travel is refused."""

from __future__ import annotations

import pickle

import pytest
import torch
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx

from draftgraph.graphs.core.graph_wire import graph_from_wire, graph_to_wire


def _step(x: torch.Tensor, cache: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """In-place write, a constant-only op (arange), a tuple-returning op, a view of an input."""
    cache.add_(1)
    values, index = torch.topk(x, 2, dim=-1)
    pos = torch.arange(x.shape[-1], dtype=x.dtype).unsqueeze(0)
    return values + pos[:, :2], index, x[:, 1:3], cache


def _nodes(gm: fx.GraphModule) -> list[tuple[str, str, str, str]]:
    return [(n.op, n.name, str(n.target), str(n.args) + str(n.kwargs)) for n in gm.graph.nodes]


def test_the_rebuilt_graph_is_the_recorded_one_without_constants():
    x, cache = torch.randn(3, 5), torch.zeros(4)
    gm = make_fx(_step)(x, cache)
    rebuilt = graph_from_wire(pickle.loads(pickle.dumps(graph_to_wire(gm))))
    assert _nodes(rebuilt) == _nodes(gm)
    assert "arange" in rebuilt.code and "getitem" in rebuilt.code
    # what FX's own pickling does instead: it traces the code again and the constant-only op
    # becomes a buffer (the cause of the IndexError the compile process's code raised)
    assert [n for n, _ in pickle.loads(pickle.dumps(gm)).named_buffers()] == ["_tensor_constant0"]
    assert list(rebuilt.named_buffers()) == [] and list(rebuilt.named_parameters()) == []
    c1, c2 = cache.clone(), cache.clone()
    want, got = gm(x, c1), rebuilt(x, c2)  # positional code: the same call
    assert all(torch.equal(a, b) for a, b in zip(want, got)) and torch.equal(c1, c2)


def test_a_graph_that_cannot_travel_is_refused():
    class WithConstant(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("scale", torch.ones(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.scale

    traced = fx.symbolic_trace(WithConstant())  # a get_attr node
    with pytest.raises(ValueError, match="op 'get_attr' cannot travel"):
        graph_to_wire(traced)
    lam = make_fx(lambda x: x + 1)(torch.ones(2))
    node = next(n for n in lam.graph.nodes if n.op == "call_function")
    node.target = lambda a, b: a + b  # not importable by name
    with pytest.raises(ValueError, match="not an op overload or an importable function"):
        graph_to_wire(lam)
    with pytest.raises(ValueError, match="expected namespace.op.overload"):
        graph_from_wire([("call_function", "a", ("op", "aten.add"), (), {})])
