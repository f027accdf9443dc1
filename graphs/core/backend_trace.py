"""CPU ``trace`` backend: an aten graph recorded once per size with make_fx and replayed over static views.

It has CUDA-graph semantics without a GPU: Python control flow and scalars are baked
at capture, host syncs (``.item()``, ``.tolist()``, ``bool(t)``) and data-dependent
shapes (``nonzero``, boolean indexing, ...) fail the capture, captured constants stay
the very same tensors, in-place writes into inputs replay onto the static tensors, and
fresh outputs land in static output buffers allocated once at the largest size and
shared by every size (size s uses the first s rows), like a graph's memory pool.
Replay runs the GraphModule from Python, so it is slower than eager on small steps: it
is for capture semantics and node counts, not speed.
"""

from __future__ import annotations

import linecache
import logging
import threading
import warnings
import weakref
from typing import Any

import torch
from torch import Tensor, fx
from torch.fx.experimental.proxy_tensor import make_fx

from .cancel import check_cancelled
from .errors import GraphCaptureError
from .hostsync import HOST_SYNC_OP, HostSyncGuard, host_sync_message
from .protocol import CompilesNothing, FlatStep, check_outputs
from .settings import trace_replay

__all__ = ["RECORD_LOCK", "TraceBackend", "TraceGraph", "count_kernel_nodes", "evict_fx_sources", "fx_source_keys",
           "record_graph"]

logger = logging.getLogger(__name__)

# Ops that launch nothing on a GPU even though fx records them as call_function nodes.
_METADATA_OPS = frozenset(
    f"aten::{op}"
    for op in (
        "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "detach", "alias", "_unsafe_view",
        "t", "view", "expand", "slice", "select", "unsqueeze", "squeeze", "permute", "transpose",
        "as_strided", "reshape",
    )
)
# Ops whose output shape depends on tensor values: a GPU must sync with the host to size them.
_DATA_DEPENDENT_OPS = frozenset(
    f"aten::{op}"
    for op in ("nonzero", "masked_select", "_unique", "_unique2", "unique_dim", "unique_consecutive")
)


def _qualified(target: object) -> str | None:
    """``aten::name`` of an OpOverload target, None for anything else (operator.getitem, ...)."""
    if isinstance(target, torch._ops.OpOverload):  # noqa: SLF001  # torch's operator type
        return target.overloadpacket._qualified_op_name  # noqa: SLF001  # its aten:: name
    return None


def count_kernel_nodes(gm: fx.GraphModule) -> int:
    """call_function nodes that would launch a kernel: aten ops that are not views or metadata."""
    count = 0
    for node in gm.graph.nodes:
        name = _qualified(node.target) if node.op == "call_function" else None
        if name is None or name in _METADATA_OPS or node.target.is_view:
            continue
        count += 1
    return count


def _has_bool_index(node: fx.Node) -> bool:
    """True for ``aten.index.Tensor`` with a boolean mask (its output size depends on the mask)."""
    indices = node.args[1] if len(node.args) > 1 else ()
    for idx in indices or ():
        val = idx.meta.get("val") if isinstance(idx, fx.Node) else None
        if isinstance(val, Tensor) and val.dtype in (torch.bool, torch.uint8):
            return True
    return False


def _reject_data_dependent(gm: fx.GraphModule, size: int) -> None:
    """Raise GraphCaptureError for ops whose output shape depends on values (host sync on GPU)."""
    for node in gm.graph.nodes:
        name = _qualified(node.target) if node.op == "call_function" else None
        bad = name in _DATA_DEPENDENT_OPS or (
            name == "aten::repeat_interleave" and node.kwargs.get("output_size") is None
        ) or (name == "aten::index" and _has_bool_index(node))
        if bad:
            raise GraphCaptureError(
                f"data-dependent shape op `{name}` inside a captured step at size {size}: "
                "its output size needs a host sync on a GPU, so it cannot be captured; "
                "use fixed-size ops (masks, torch.where, topk, nonzero_static)",
                size=size,
            )


# make_fx keeps its tracer in module globals (torch.fx's CURRENT_PATCHER, proxy_tensor's current
# tracer): two recordings at once in two threads break each other (measured: "CURRENT_PATCHER is
# None in finally block"). Recordings of every manager in the process take turns on this lock;
# serving never records, so it never waits on it.
RECORD_LOCK = threading.Lock()


def record_graph(fn: FlatStep, args: tuple[Tensor, ...], size: int) -> tuple[fx.GraphModule, tuple[Tensor, ...]]:
    """make_fx ``fn`` over ``args`` in real mode under the host-sync guard; (graph, real outputs)."""
    with RECORD_LOCK:
        check_cancelled(size)  # the wait for the lock may have outlived the capture's thread
        return _trace_locked(fn, args, size)


def _trace_locked(fn: FlatStep, args: tuple[Tensor, ...], size: int) -> tuple[fx.GraphModule, tuple[Tensor, ...]]:
    """`record_graph` while holding the recording lock."""
    seen: list[tuple[Tensor, ...]] = []

    def traced(*static: Tensor) -> tuple[Tensor, ...]:
        with HostSyncGuard(size):
            outs = fn(*static)
        seen.append(outs)
        return outs

    before = fx_source_keys()
    try:
        with _one_fake_mode():
            gm = make_fx(traced, tracing_mode="real")(*args)
    except GraphCaptureError:
        evict_fx_sources(fx_source_keys() - before)
        raise
    except RuntimeError as exc:
        evict_fx_sources(fx_source_keys() - before)
        if HOST_SYNC_OP in str(exc):
            raise GraphCaptureError(host_sync_message(HOST_SYNC_OP, size), size=size) from exc
        raise
    keys = fx_source_keys() - before
    gm.meta["draftgraph_fx_sources"] = keys
    # released graphs evict these at once (`TraceGraph.release`); one that is only dropped, by
    # whatever path, takes them along when it is collected
    weakref.finalize(gm, evict_fx_sources, frozenset(keys)).atexit = False
    return gm, check_outputs(seen[-1], size)


def _one_fake_mode() -> Any:
    """A tracing context holding one fake mode for a real-mode recording.

    make_fx stores a fake copy of every value it records in the node's meta; without a fake
    mode in reach it builds a new `FakeTensorMode` per value, and each one walks the Python
    stack (`traceback.extract_stack`) on construction. One mode for the whole recording keeps
    the same graph and cuts a recording of the default draft step from 0.26-0.77 s to
    0.15-0.30 s (chain S=3 and S=5 at b=4). The context is thread-local."""
    from torch._guards import TracingContext, tracing
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_fallback_kernels=True)
    mode.cache_enabled = False  # its dispatch cache is process-wide (see `compile.symbolic.record_symbolic`)
    return tracing(TracingContext(mode))


def fx_source_keys() -> set[str]:
    """Keys of the generated-source cache FX keeps for every GraphModule it compiles."""
    loader = getattr(fx.graph_module, "_loader", None)
    cache = getattr(loader, "eval_cache", None)
    return set(cache) if isinstance(cache, dict) else set()


def evict_fx_sources(keys: set[str]) -> None:
    """Drop generated sources of released graphs: FX never frees them, so recapturing in a
    long-running process would grow memory by a few KB per graph."""
    loader = getattr(fx.graph_module, "_loader", None)
    cache = getattr(loader, "eval_cache", None)
    for key in keys:
        if isinstance(cache, dict):
            cache.pop(key, None)
        linecache.cache.pop(key, None)


def _storage_key(t: Tensor) -> int:
    """Identity of a tensor's storage (0 for storage-less or empty tensors)."""
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0


def _constant_storages(gm: fx.GraphModule) -> set[int]:
    """Storages of the tensors the graph closes over (get_attr nodes)."""
    keys: set[int] = set()
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = getattr(gm, str(node.target), None)
            if isinstance(value, Tensor):
                keys.add(_storage_key(value))
    return keys


class TraceGraph:
    """One recorded size: the GraphModule, its static views and where each output lands.

    ``outputs`` are fixed: a fresh output's slot is its static buffer view, and an output
    that aliases a constant or a static input is the tensor seen at capture (replay runs
    the same view ops on the same tensors, so it returns that very memory again).
    """

    def __init__(
        self, gm: fx.GraphModule, args: tuple[Tensor, ...], size: int,
        outputs: tuple[Tensor, ...], fresh: tuple[int, ...], nodes: int, nbytes: int,
    ) -> None:
        self.size = size
        self.nodes: int | None = nodes
        self.nbytes = nbytes
        self.outputs = outputs
        self._gm: fx.GraphModule | None = gm
        self._args = args
        self._copies = tuple((i, outputs[i]) for i in fresh)
        self._runner: Any = gm
        self.engine = "fx"
        self.compile_s = 0.0  # seconds spent compiling a faster runner (compile backend)
        self.compiles = 0  # compiles this size's capture ran (compile backend: its own, or the symbolic one)
        self.fallback_reason: str | None = None  # why a compiled runner was not used
        self.replay_s: float | None = None  # timed at capture ("auto"), with eager_s
        self.eager_s: float | None = None
        self.prefer_eager = False  # "auto": the replay was not faster than the eager step
        self.release_hooks: list[Any] = []  # called once at release (a compiled runner's leftovers)

    @property
    def inputs(self) -> tuple[Tensor, ...]:
        """The static views the graph replays over."""
        return self._args

    @property
    def runner(self) -> Any:
        """What replays the graph: the GraphModule itself, or what `use_runner` installed (a
        TorchScript interpreter, the compile backend's `CompiledRunner`); None once released."""
        return self._runner

    @property
    def fresh(self) -> tuple[int, ...]:
        """Indices of the outputs copied into the shared static output buffers at each replay."""
        return tuple(i for i, _ in self._copies)

    @property
    def module(self) -> fx.GraphModule:
        """The recorded graph (RuntimeError once released)."""
        if self._gm is None:
            raise RuntimeError(f"trace graph for size {self.size} was released")
        return self._gm

    def use_runner(self, runner: Any, engine: str) -> None:
        """Replay through ``runner`` (same graph, e.g. a TorchScript interpreter) from now on."""
        self._runner, self.engine = runner, engine

    def replay(self) -> tuple[Tensor, ...]:
        """Run the recorded graph; fresh outputs are copied into the shared static output buffers."""
        if self._gm is None:
            raise RuntimeError(f"trace graph for size {self.size} was released")
        outs = self._runner(*self._args)
        for i, view in self._copies:
            view.copy_(outs[i])
        return self.outputs

    def release(self) -> None:
        """Drop the graph module, views and output buffers it referenced."""
        if self._gm is not None:
            evict_fx_sources(self._gm.meta.get("draftgraph_fx_sources", set()))
        hooks, self.release_hooks = self.release_hooks, []
        for hook in hooks:
            hook()
        self._gm = None
        self._runner = None
        self._args = ()
        self._copies = ()
        self.outputs = ()


class TraceBackend(CompilesNothing):
    """make_fx recorder owning the static output buffers shared by all sizes (its "pool")."""

    name = "trace"
    captures = True
    records_on_copies = True  # capture(..., trace_args=stand-ins): recording beside serving is safe
    replays_on_device = False  # a Python (FX) replay of host-launched ops

    def __init__(self, rows: int) -> None:
        self._rows = rows
        # "fx" (default): the GraphModule's Python forward. "jit" (DRAFTGRAPH_TRACE_REPLAY=jit):
        # TorchScript's C++ interpreter, faster on small steps, but torch.jit.trace keeps about
        # 90 KB per capture that is never freed (measured, torch 2.14.1), so it is opt-in and not
        # for processes that recapture on every reload.
        self.replay_engine = _replay_engine()
        self._buffers: dict[int, Tensor] = {}

    def warmup(self, fn: FlatStep, args: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        """Run ``fn`` eagerly once."""
        return fn(*args)

    def capture(self, size: int, fn: FlatStep, args: tuple[Tensor, ...],
                trace_args: tuple[Tensor, ...] | None = None) -> TraceGraph:
        """Record ``fn`` at ``size`` and place its fresh outputs in the shared buffers.

        ``trace_args`` (same shapes and strides as ``args``): record over these stand-ins and
        replay over ``args``, so recording never touches the live static rows; an output that
        is a view of a stand-in becomes the same view of the live input."""
        rec_args = args if trace_args is None else trace_args
        gm, outs = record_graph(fn, rec_args, size)
        _reject_data_dependent(gm, size)
        constants = _constant_storages(gm)
        inputs = {_storage_key(a): i for i, a in enumerate(rec_args)}
        outputs: list[Tensor] = []
        fresh: list[int] = []
        nbytes = 0
        for i, out in enumerate(outs):
            key = _storage_key(out)
            if key != 0 and key in constants:
                outputs.append(out)  # a view of a constant: that very memory
                continue
            if key != 0 and key in inputs:  # a view of a static input: the same view of the live one
                j = inputs[key]
                offset = out.storage_offset() - rec_args[j].storage_offset() + args[j].storage_offset()
                outputs.append(args[j].as_strided(out.size(), out.stride(), offset))
                continue
            buffer, new_bytes = self.buffer_for(i, tuple(out.shape[1:]), out.dtype, out.device)
            nbytes += new_bytes
            outputs.append(buffer[:size])
            fresh.append(i)
        nodes = count_kernel_nodes(gm)
        graph = TraceGraph(gm, args, size, tuple(outputs), tuple(fresh), nodes, nbytes)
        runner = _script_replay(gm, args) if self.replay_engine == "jit" else None
        if runner is not None:
            graph.use_runner(runner, "jit")
        logger.debug("trace: captured size %d with %d kernel nodes (%s replay)", size, nodes, graph.engine)
        return graph

    def buffer_for(self, index: int, tail: tuple[int, ...], dtype: torch.dtype, device: torch.device
                   ) -> tuple[Tensor, int]:
        """Shared static buffer [rows, *tail] for output ``index``; (buffer, bytes newly allocated)."""
        buffer = self._buffers.get(index)
        if buffer is not None and (tuple(buffer.shape[1:]), buffer.dtype, buffer.device) == (
            tuple(tail), dtype, torch.device(device),
        ):
            return buffer, 0
        if buffer is not None:
            logger.debug("trace: output %d changed shape/dtype across sizes; new buffer", index)
        buffer = torch.empty((self._rows, *tail), dtype=dtype, device=device)
        self._buffers[index] = buffer
        return buffer, buffer.numel() * buffer.element_size()

    def release(self) -> None:
        """Drop the shared output buffers."""
        self._buffers.clear()


def _replay_engine() -> str:
    """Replay engine from DRAFTGRAPH_TRACE_REPLAY ("fx" or "jit"; default "fx")."""
    return trace_replay()


def _script_replay(gm: fx.GraphModule, args: tuple[Tensor, ...]) -> Any:
    """The recorded aten graph as a TorchScript module (its C++ interpreter replays small steps
    faster than FX's Python forward), or None when it does not reproduce the FX replay exactly.

    Checked on one run each: equal outputs, and every output that aliases a constant or a
    static input in FX aliases the same storage here. A step whose result depends on state it
    mutates (two runs differ) fails the check and keeps the FX replay.
    """
    trace = getattr(torch.jit, "trace", None)
    if trace is None:
        return None
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            scripted = trace(gm, args, check_trace=False, strict=False)
            want = gm(*args)
            got = scripted(*args)
    except Exception as exc:  # TorchScript cannot take every graph: FX replay stays
        logger.debug("trace: no TorchScript replay (%s)", exc)
        return None
    if not isinstance(got, tuple):
        got = (got,)
    if len(got) != len(want):
        return None
    for a, b in zip(want, got):
        if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
            return None
        if _storage_key(a) != _storage_key(b) and (_storage_key(a) in _arg_and_const_keys(gm, args)):
            return None
    return scripted


def _arg_and_const_keys(gm: fx.GraphModule, args: tuple[Tensor, ...]) -> set[int]:
    """Storages of the graph's constants and of the static inputs."""
    return _constant_storages(gm) | {_storage_key(a) for a in args}
