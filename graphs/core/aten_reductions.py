"""Reductions kept on ATen's own kernels inside a compiled graph, so that the compiled replay
computes the FX replay's bits on every input, not only on the capture inputs.

Inductor writes its own loops for sums, means and softmax, and their summation order is not
ATen's: measured on this CPU (torch 2.14, AVX512), ``x.sum(-1)``, ``x.pow(2).mean(-1)`` and
``softmax(x, -1)`` compiled differ from eager in the last bits for float32 and float64 at
every shape tried, with ``cpp.simdlen`` None, 256 or 0 (scalar loops), and softmax also
divides where ATen multiplies by the reciprocal. Everything else in the default models
(matmuls, which inductor leaves to ATen; pow, rsqrt, silu, rope's mul/sub/cat, masks,
gathers, index_put) compiled equals eager bitwise. Two elementwise functions do not: ``cos``
and ``sin`` compiled differ from ATen's in the last bit (float32, a transformers model's RoPE
table computed in its forward: measured on SmolLM2's positions), so they are kept on ATen too.

`keep_aten_reductions` returns a copy of an aten graph in which those reductions call
operators of the ``draftgraph_aten`` library instead: each one runs the very ATen kernel the
FX replay runs, and inductor calls them as extern kernels (with eager's strides; a direct
ATen call once `register_inductor_lowerings` ran) and fuses everything around them. The verify forward of the default
target (float64, N=4, b 1-16, KV window 64-512) stays bit-equal to eager and runs 1.22-1.55x
faster than it, as fast as raw ``torch.compile`` (scripts/bench_verify.py, one thread); with
inductor's own reductions it was never bit-equal, so the compile backend kept the FX replay.

Only ``dtype=None`` forms are rewritten (a dtype argument changes the kernel's accumulation).
Reductions inductor introduces itself (a 1 x K x 1 matrix product it turns into a sum, layer
norm's decomposition) are not covered: they still fail the backend's bitwise check, which keeps
the FX replay for that size as before.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import torch
from torch import Tensor, fx

__all__ = ["REWRITE_TAG", "keep_aten_reductions", "register_inductor_lowerings"]

REWRITE_TAG = "aten-reductions-2"  # part of a stored entry's key: code compiled without it is not reused

_aten = torch.ops.aten
_SOFTMAX = _aten._softmax.default  # noqa: SLF001  # ATen's operator names, not private members
_LOG_SOFTMAX = _aten._log_softmax.default  # noqa: SLF001


def _defined() -> bool:
    """True when this process already holds the library (an earlier import of this module, e.g.
    one dropped from ``sys.modules`` and imported again: its registrations stay with torch)."""
    try:
        torch.ops.draftgraph_aten.sum.default  # noqa: B018  # the lookup is the test
    except (AttributeError, RuntimeError):
        return False
    return True


_LIB = None if _defined() else torch.library.Library("draftgraph_aten", "DEF")  # once per process


def _define(schema: str, impl: Callable[..., Tensor]) -> None:
    if _LIB is None:  # defined by an earlier import: the same schemas and kernels
        return
    name = schema.split("(", 1)[0]
    _LIB.define(schema)
    # CompositeExplicitAutograd covers every backend key, Meta included, so fake tensors
    # (inductor's tracing) get shapes from the same ATen call
    _LIB.impl(name, impl, "CompositeExplicitAutograd")


_define("sum(Tensor x, int[]? dim, bool keepdim) -> Tensor",
        lambda x, dim, keepdim: _aten.sum.dim_IntList(x, dim, keepdim))
_define("mean(Tensor x, int[]? dim, bool keepdim) -> Tensor",
        lambda x, dim, keepdim: _aten.mean.dim(x, dim, keepdim))
_define("softmax(Tensor x, int dim) -> Tensor", lambda x, dim: _SOFTMAX(x, dim, False))
_define("log_softmax(Tensor x, int dim) -> Tensor", lambda x, dim: _LOG_SOFTMAX(x, dim, False))
_define("cos(Tensor x) -> Tensor", lambda x: _aten.cos.default(x))
_define("sin(Tensor x) -> Tensor", lambda x: _aten.sin.default(x))

_ops = torch.ops.draftgraph_aten

# each operator -> the ATen overload it runs and the constant arguments appended to its own
_KERNELS: dict[object, tuple[object, tuple]] = {
    _ops.sum.default: (_aten.sum.dim_IntList, ()),
    _ops.mean.default: (_aten.mean.dim, ()),
    _ops.softmax.default: (_SOFTMAX, (False,)),
    _ops.log_softmax.default: (_LOG_SOFTMAX, (False,)),
    _ops.cos.default: (_aten.cos.default, ()),
    _ops.sin.default: (_aten.sin.default, ()),
}


@cache
def register_inductor_lowerings() -> None:
    """Teach inductor to emit each operator as a direct call of its ATen kernel, so compiled code
    skips the Python kernels above (measured on the compiled EAGLE draft step, S=3: 11% slower
    at b=1 through them; this way 2-3% slower than inductor's own reductions at b=1 and 8). Runs once;
    imports inductor, so call it where inductor compiles. Without it the operators still run,
    through their Python kernels, with the same results."""
    from torch._inductor.lowering import fallback_handler, register_lowering

    for op, (kernel, extra) in _KERNELS.items():
        handler = fallback_handler(kernel, add_to_fallback_set=False)
        register_lowering(op)(lambda *args, h=handler, extra=extra: h(*args, *extra))


def _dim_args(args: tuple, kwargs: dict) -> tuple | None:
    """(x, dim, keepdim) of ``sum.dim_IntList`` / ``mean.dim``; None with a dtype."""
    if kwargs.get("dtype") is not None:
        return None
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    return (args[0], dim, keepdim)


def _all_args(args: tuple, kwargs: dict) -> tuple | None:
    """(x, None, False) of ``sum.default``; None with a dtype."""
    return None if kwargs.get("dtype") is not None else (args[0], None, False)


def _softmax(args: tuple, kwargs: dict) -> tuple | None:
    """(x, dim) of ``_softmax`` / ``_log_softmax``; None when it upcasts half to float."""
    x, dim, half_to_float = args
    return None if half_to_float else (x, dim)


# aten overload -> (its replacement, (args, kwargs) -> the replacement's args, or None: leave it)
_REWRITES: dict[object, tuple[object, Callable[[tuple, dict], tuple | None]]] = {
    _aten.sum.dim_IntList: (_ops.sum.default, _dim_args),
    _aten.sum.default: (_ops.sum.default, _all_args),
    _aten.mean.dim: (_ops.mean.default, _dim_args),
    _SOFTMAX: (_ops.softmax.default, _softmax),
    _LOG_SOFTMAX: (_ops.log_softmax.default, _softmax),
    _aten.cos.default: (_ops.cos.default, lambda args, kwargs: (args[0],)),
    _aten.sin.default: (_ops.sin.default, lambda args, kwargs: (args[0],)),
}


def keep_aten_reductions(gm: fx.GraphModule) -> tuple[fx.GraphModule, int]:
    """A copy of the aten graph ``gm`` whose sums, means, softmax, log-softmax, cos and sin call ATen's
    kernels opaquely (see the module docstring), and how many nodes were rewritten (0: the
    copy is ``gm`` itself)."""
    plan = []
    for node in gm.graph.nodes:
        rule = _REWRITES.get(node.target) if node.op == "call_function" else None
        args = rule[1](node.args, dict(node.kwargs)) if rule is not None else None
        if args is not None:
            plan.append((node.name, rule[0], args))
    if not plan:
        return gm, 0
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    todo = {name: (target, args) for name, target, args in plan}
    for node in gm.graph.nodes:
        if node.name in todo:
            target, args = todo[node.name]
            env[node] = graph.call_function(target, fx.map_arg(args, lambda n: env[n]))
        else:
            env[node] = graph.node_copy(node, lambda n: env[n])
    graph.lint()
    return fx.GraphModule(gm, graph), len(plan)
