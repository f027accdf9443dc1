"""``cuda`` backend: torch.cuda.CUDAGraph per size, one capture stream and one shared memory pool.

Warm-up runs on the capture stream (a side stream), then every size is captured into
the pool from ``torch.cuda.graph_pool_handle()``; the manager captures largest first so
smaller graphs reuse the larger one's blocks. Features differ across torch versions
(2.11 was seen on GPU machines), so they are detected, never assumed: node counts need
``raw_cuda_graph`` plus cuda-python (``cuda.bindings`` or the older ``cuda.cudart``),
read in a capture-end hook when torch has one, else from ``CUDAGraph(keep_graph=True)``;
``retain_object`` (when present) ties the static views and outputs to the graph's life.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .core.hostsync import HostSyncGuard
from .core.protocol import CompilesNothing, FlatStep, check_outputs

__all__ = ["CudaBackend", "CudaGraph", "count_graph_nodes"]

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def _graph_runtime() -> Any | None:
    """The cuda-python runtime module, or None when cuda-python is not installed."""
    try:
        from cuda.bindings import runtime

        return runtime
    except ImportError:
        pass
    try:
        from cuda import cudart

        return cudart
    except ImportError:
        return None


def count_graph_nodes(raw_graph: int) -> int | None:
    """Node count of a raw ``cudaGraph_t`` via ``cudaGraphGetNodes``; None when it cannot be read."""
    runtime = _graph_runtime()
    if runtime is None:
        return None
    try:
        err, _, num = runtime.cudaGraphGetNodes(raw_graph, numNodes=0)
    except Exception:  # binding differences across cuda-python versions
        logger.debug("cudaGraphGetNodes failed", exc_info=True)
        return None
    if err != runtime.cudaError_t.cudaSuccess:
        logger.debug("cudaGraphGetNodes returned %s", err)
        return None
    return int(num)


def _new_graph() -> tuple[torch.cuda.CUDAGraph, str]:
    """A fresh CUDAGraph and how its nodes get counted: "hook", "keep" or "none"."""
    cls = torch.cuda.CUDAGraph
    if _graph_runtime() is None or not hasattr(cls, "raw_cuda_graph"):
        return cls(), "none"
    if hasattr(cls, "register_capture_end_hook"):
        return cls(), "hook"
    try:
        return cls(keep_graph=True), "keep"
    except TypeError:
        return cls(), "none"


def _capture_into(
    graph: torch.cuda.CUDAGraph, pool: Any, stream: torch.cuda.Stream, device: torch.device,
    fn: Callable[[], tuple[Tensor, ...]], size: int,
) -> tuple[Tensor, ...]:
    """Capture ``fn()`` into ``graph`` on ``stream`` in ``pool`` with host syncs rejected.

    thread_local error mode: a reload may capture from a side thread while other threads of
    the process keep issuing CUDA work (they wait on the worker's lock, but an engine has more).
    """
    with torch.cuda.device(device), torch.cuda.graph(graph, pool=pool, stream=stream,
                                                     **_capture_mode()), HostSyncGuard(size):
        outs = fn()
    torch.cuda.synchronize(device)
    return outs


@functools.lru_cache(maxsize=1)
def _capture_mode() -> dict[str, str]:
    """``capture_error_mode="thread_local"`` where this torch's ``torch.cuda.graph`` takes it."""
    try:
        params = inspect.signature(torch.cuda.graph.__init__).parameters
    except (TypeError, ValueError):
        return {}
    return {"capture_error_mode": "thread_local"} if "capture_error_mode" in params else {}


class CudaGraph:
    """One captured size: the CUDAGraph and the output tensors it writes on replay."""

    def __init__(
        self, graph: torch.cuda.CUDAGraph, outs: tuple[Tensor, ...], size: int,
        nodes: int | None, nbytes: int, device: torch.device,
    ) -> None:
        self.size = size
        self.nodes = nodes
        self.nbytes = nbytes
        self._graph: torch.cuda.CUDAGraph | None = graph
        self.outputs = outs
        self._device = device

    def replay(self) -> tuple[Tensor, ...]:
        """Replay on the current stream; the outputs are graph-pool memory."""
        if self._graph is None:
            raise RuntimeError(f"CUDA graph for size {self.size} was released")
        self._graph.replay()
        return self.outputs

    def release(self) -> None:
        """Wait for in-flight replays, then free the graph and its outputs; idempotent."""
        if self._graph is None:
            return
        torch.cuda.synchronize(self._device)
        self._graph.reset()
        self._graph = None
        self.outputs = ()


class CudaBackend(CompilesNothing):
    """Owner of the capture stream and the memory pool shared by all sizes of one capture."""

    name = "cuda"
    captures = True
    records_on_copies = False  # a CUDA graph bakes the addresses it records: capture on the live buffers
    replays_on_device = True

    def __init__(self, rows: int, device: torch.device, share: Any = None) -> None:
        if device.type != "cuda":
            raise ValueError(f"device={device}: the cuda backend needs CUDA static inputs")
        self._device = device if device.index is not None else torch.device("cuda", torch.cuda.current_device())
        self._rows = rows
        if share is not None:  # a `CaptureShare`: the pool and stream of the other managers of a state
            self._pool, self._stream = share.pool_and_stream(self._device)
        else:
            self._stream = torch.cuda.Stream(device=self._device)
            self._pool = torch.cuda.graph_pool_handle()

    def warmup(self, fn: FlatStep, args: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        """Run ``fn`` eagerly on the capture stream (lazy init, cuBLAS handles) and wait for it."""
        current = torch.cuda.current_stream(self._device)
        self._stream.wait_stream(current)
        with torch.cuda.stream(self._stream):
            outs = fn(*args)
        current.wait_stream(self._stream)
        torch.cuda.synchronize(self._device)
        return outs

    def capture(self, size: int, fn: FlatStep, args: tuple[Tensor, ...]) -> CudaGraph:
        """Capture ``fn(*args)`` at ``size``; bytes = memory_allocated delta, nodes when readable."""
        graph, mode = _new_graph()
        counted: list[int | None] = []
        if mode == "hook":
            graph.register_capture_end_hook(lambda g: counted.append(count_graph_nodes(g.raw_cuda_graph())))
        torch.cuda.synchronize(self._device)
        before = torch.cuda.memory_allocated(self._device)
        try:
            outs = check_outputs(_capture_into(graph, self._pool, self._stream, self._device,
                                               lambda: fn(*args), size), size)
            nodes = counted[-1] if counted else None
            if mode == "keep":
                nodes = count_graph_nodes(graph.raw_cuda_graph())
                graph.instantiate()
        except BaseException:
            _reset_quietly(graph)
            raise
        nbytes = torch.cuda.memory_allocated(self._device) - before
        if hasattr(graph, "retain_object"):
            graph.retain_object((args, outs))
        return CudaGraph(graph, outs, size, nodes, nbytes, self._device)

    def release(self) -> None:
        """Drop the pool handle and the capture stream (the pool frees once its graphs are gone)."""
        self._pool = None
        self._stream = None


def _reset_quietly(graph: torch.cuda.CUDAGraph) -> None:
    """Reset a graph whose capture failed, logging (not raising) a second failure."""
    try:
        graph.reset()
    except Exception:
        logger.debug("CUDAGraph.reset() after a failed capture raised", exc_info=True)
