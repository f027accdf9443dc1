"""An aten graph as plain data, so another process rebuilds the same graph node for node.

Pickling an `fx.GraphModule` keeps only its generated code, and unpickling traces that code
again with `torch.fx.symbolic_trace`. That second trace is not the same graph: an op whose
arguments are all constants (``aten.arange(512)`` in the draft step's position ids) runs
during the trace and becomes a ``_tensor_constant`` buffer of the module. Inductor's
``standalone_compile`` then lifts those buffers as extra leading inputs, and the artifact
loaded from bytes no longer passes them (measured on the default EAGLE head: the loaded code
indexed ``args[31]`` of 27 arguments, an IndexError in AOT autograd's runtime wrapper).

`graph_to_wire` writes every node instead: its op, name, target (an op overload by its
qualified name, a Python function by module and name) and arguments, with node references
as `NodeRef`; `graph_from_wire` rebuilds the graph with the default (positional) code.
Only placeholder, call_function and output nodes travel: a graph with anything else (a
get_attr constant, a submodule) raises ValueError, and the caller compiles it in-process.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

__all__ = ["NodeRef", "graph_from_wire", "graph_to_wire"]

_OPS = ("placeholder", "call_function", "output")
_OP_OVERLOAD = type(torch.ops.aten.add.default)  # torch's OpOverload
_LEAVES = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


@dataclass(frozen=True)
class NodeRef:
    """A reference to an earlier node by name."""

    name: str


def _target_to_wire(target: Any) -> tuple[str, str]:
    if isinstance(target, _OP_OVERLOAD):
        return "op", str(target)  # "aten.add_.Tensor": namespace, packet, overload
    module, name = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    if callable(target) and module and name and "<" not in name:
        return "py", f"{module}:{name}"
    raise ValueError(f"graph node target {target!r}: not an op overload or an importable function")


def _target_from_wire(kind: str, text: str) -> Any:
    if kind == "op":
        parts = text.split(".")
        if len(parts) != 3:
            raise ValueError(f"op {text!r}: expected namespace.op.overload")
        ns, packet, overload = parts
        return getattr(getattr(getattr(torch.ops, ns), packet), overload)
    if kind == "py":
        module, _, name = text.partition(":")
        obj: Any = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
        return obj
    raise ValueError(f"target kind {kind!r}: must be 'op' or 'py'")


def _arg_to_wire(value: Any) -> Any:
    if isinstance(value, fx.Node):
        return NodeRef(value.name)
    if isinstance(value, (list, tuple)):
        out = [_arg_to_wire(v) for v in value]
        return out if isinstance(value, list) else tuple(out)
    if isinstance(value, dict):
        return {k: _arg_to_wire(v) for k, v in value.items()}
    if isinstance(value, slice):
        return slice(_arg_to_wire(value.start), _arg_to_wire(value.stop), _arg_to_wire(value.step))
    if isinstance(value, _LEAVES):
        return value
    raise ValueError(f"graph argument of type {type(value).__name__}: not plain data (a constant tensor?)")


def _arg_from_wire(value: Any, nodes: dict[str, fx.Node]) -> Any:
    if isinstance(value, NodeRef):
        return nodes[value.name]
    if isinstance(value, list):
        return [_arg_from_wire(v, nodes) for v in value]
    if isinstance(value, tuple):
        return tuple(_arg_from_wire(v, nodes) for v in value)
    if isinstance(value, dict):
        return {k: _arg_from_wire(v, nodes) for k, v in value.items()}
    if isinstance(value, slice):
        return slice(*(_arg_from_wire(v, nodes) for v in (value.start, value.stop, value.step)))
    return value


def graph_to_wire(gm: fx.GraphModule) -> list[tuple[Any, ...]]:
    """``gm``'s nodes as (op, name, target, args, kwargs) of plain data (ValueError for a node
    that cannot travel: see the module docstring)."""
    out: list[tuple[Any, ...]] = []
    for node in gm.graph.nodes:
        if node.op not in _OPS:
            raise ValueError(f"graph node {node.name}: op {node.op!r} cannot travel (only {_OPS})")
        target = _target_to_wire(node.target) if node.op == "call_function" else ("name", str(node.target))
        out.append((node.op, node.name, target, _arg_to_wire(node.args), _arg_to_wire(node.kwargs)))
    return out


def graph_from_wire(wire: list[tuple[Any, ...]]) -> fx.GraphModule:
    """The graph `graph_to_wire` wrote, as a module with positional code and no attributes."""
    graph = fx.Graph()
    nodes: dict[str, fx.Node] = {}
    for op, name, (kind, text), args, kwargs in wire:
        if op not in _OPS:
            raise ValueError(f"graph node {name}: op {op!r} (only {_OPS})")
        target = _target_from_wire(kind, text) if op == "call_function" else text
        node = graph.create_node(op, target, _arg_from_wire(args, nodes), _arg_from_wire(kwargs, nodes), name=name)
        nodes[name] = node
    graph.lint()
    return fx.GraphModule(torch.nn.Module(), graph)
