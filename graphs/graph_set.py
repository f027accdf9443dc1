"""GraphSet: the graphs one manager captured, and how they come to be (all at once or size by size).

`capture_all` warms the step up at the largest size, then captures every size largest first
into one backend (one pool: smaller graphs reuse the blocks of larger ones); on failure it
releases all it made. Incremental capture (`begin`, then `capture_size` per size, possibly on
another thread) publishes one size at a time under a lock that is never held while recording:
a concurrent reader of ``graphs`` sees a whole graph or none. `release` bumps an epoch, so a
capture that began before it discards its graph instead of publishing it.

Every warm-up, recording and load runs under `torch.no_grad`, whatever the calling thread's
grad mode (a background capture thread starts with grad enabled): a replay never records
autograd history, and a recording that did kept the step's activations and its parameters'
saved views alive from C++, never collected (about 5 MB per reload of the default models
under background capture, 44 tensors per reload of a tiny worker whose weights require grad).

Recording one size is the ``record`` callable the caller passes (the manager's hook, usually
`GraphSet.record`). The owner reads the public attributes; only this class writes them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

import torch

from .backends import backend_class, capabilities, make_backend
from .capture_share import CaptureShare
from .compile.entry import StoredCode
from .core.errors import GraphCaptureError
from .core.protocol import CapturedGraph, GraphBackend, check_outputs
from .spans import span, suppress_spans
from .static import StaticInputs
from .stats import CaptureRecord
from .step_calls import StepCalls

__all__ = ["GraphSet", "Record"]

logger = logging.getLogger(__name__)

Record = Callable[..., "tuple[CapturedGraph | None, CaptureRecord | None]"]
"""``record(backend, size, copies=False, load_only=False)``: capture (or load) one size, timed."""


def _discard(graphs: Mapping[int, CapturedGraph], backend: GraphBackend) -> None:
    """Release graphs and the backend of a failed capture."""
    for graph in graphs.values():
        graph.release()
    backend.release()


def _capture_error(exc: BaseException, size: int) -> BaseException:
    """What a failed capture at ``size`` raises: GraphCaptureError naming the size (``exc`` as is
    when it already is one, or not an Exception)."""
    if isinstance(exc, Exception) and not isinstance(exc, GraphCaptureError):
        return GraphCaptureError(f"capture failed at size {size}: {type(exc).__name__}: {exc}", size=size)
    return exc


class GraphSet:
    """Live graphs (``graphs``, size -> graph, with their ``records``), the ``backend`` that made
    them, and the incremental capture's state: ``pending`` sizes, ``failed`` ones (size -> error),
    ``started``, ``captured`` (every size live), ``captures`` (completed captures, eager included)
    and ``captured_ptrs`` (the static inputs' data pointers at capture, for the debug check)."""

    def __init__(self, backend_name: str, sizes: tuple[int, ...], static: StaticInputs, calls: StepCalls, *,
                 auto: bool, stored: StoredCode | None, share: CaptureShare | None) -> None:
        self.backend_name = backend_name
        self.captures_graphs = capabilities(backend_name).captures
        self.sizes = sizes
        self._static = static
        self._calls = calls
        self._auto = auto  # compile then keeps a size's graph only when faster than eager
        self._stored = stored
        self._share = share
        self.backend: GraphBackend | None = None
        self.graphs: dict[int, CapturedGraph] = {}
        self.records: dict[int, CaptureRecord] = {}
        self.captured_ptrs: dict[str, int] = {}
        self.captured = False
        self.captures = 0
        self._lock = threading.Lock()  # publication and release; never held while recording
        self.started = False
        self._epoch = 0  # bumped by release(): a capture that began before it is discarded
        self.pending: set[int] = set()
        self.failed: dict[int, str] = {}

    @property
    def max_size(self) -> int:
        """The largest capture size (0 without sizes)."""
        return self.sizes[-1] if self.sizes else 0

    def _make_backend(self) -> GraphBackend:
        return make_backend(self.backend_name, self.max_size, self._static.device, auto=self._auto,
                            stored=self._stored, share=self._share)

    @torch.no_grad()
    def capture_all(self, record: Record) -> None:
        """Warm up at the largest size, then capture every size largest first (see the module
        docstring); on failure release what this call made and raise GraphCaptureError."""
        if self.captured:
            raise RuntimeError("capture(): already captured; call release() before capturing again")
        if not self.captures_graphs:
            self.captured = True
            self.captures += 1
            return
        backend = self._make_backend()
        graphs: dict[int, CapturedGraph] = {}
        records: dict[int, CaptureRecord] = {}
        size = self.max_size
        try:
            with span("warmup", size=size, backend=self.backend_name):
                check_outputs(backend.warmup(self._calls.warm, self._static.views(size)), size)
            for size in reversed(self.sizes):
                graphs[size], records[size] = record(backend, size)
        except BaseException as exc:
            _discard(graphs, backend)
            error = _capture_error(exc, size)
            if error is exc:
                raise
            raise error from exc
        self.backend, self.graphs, self.records = backend, graphs, records
        self.captured_ptrs = self._static.data_ptrs()
        self.captured = True
        self.captures += 1
        logger.debug("captured sizes %s with backend %s", tuple(sorted(graphs)), self.backend_name)

    def record(self, backend: GraphBackend, size: int, copies: bool = False, load_only: bool = False
               ) -> tuple[CapturedGraph | None, CaptureRecord | None]:
        """Capture one size and time it (``copies``: record over stand-ins of the static rows;
        ``load_only``: only the backend's stored code, (None, None) when it has none)."""
        with span("capture", size=size, backend=self.backend_name):
            start = time.perf_counter()
            with suppress_spans():  # spans in the step would not replay / would become graph ops
                args = (size, self._calls.flat, self._static.views(size))
                if copies:
                    args += (self._static.shadow_views(size),)
                if load_only:
                    loader = getattr(backend, "load", None)
                    graph = loader(*args) if loader is not None else None
                    if graph is None:
                        return None, None
                else:
                    graph = backend.capture(*args)
            elapsed = time.perf_counter() - start
        return graph, CaptureRecord(capture_s=elapsed, capture_bytes=graph.nbytes, nodes=graph.nodes,
                                    compile_s=float(getattr(graph, "compile_s", 0.0)),
                                    engine="eager" if getattr(graph, "prefer_eager", False)
                                    else str(getattr(graph, "engine", backend.name)),
                                    fallback=getattr(graph, "fallback_reason", None),
                                    source=str(getattr(graph, "source", "recorded")),
                                    compiles=int(getattr(graph, "compiles", 0)))

    def begin(self) -> None:
        """Start an incremental capture: every size becomes pending. Idempotent while started."""
        with self._lock:
            if self.started:
                return
            if self.captured:
                raise RuntimeError("begin(): already captured; call release() first")
            if not self.captures_graphs:
                self.captured = True
                self.captures += 1
                return
            self.started = True
            self.pending = set(self.sizes)
            self.captured_ptrs = self._static.data_ptrs()
        backend_class(self.backend_name).prepare_background()  # before any thread compiles

    @torch.no_grad()
    def capture_size(self, size: int, record: Record) -> float:
        """Capture one pending size and publish it; the seconds it took. On failure the size goes
        to ``failed`` and GraphCaptureError (cause chained) propagates."""
        with self._lock:
            if size not in self.pending:
                raise ValueError(f"capture_size({size!r}): not pending (pending: {tuple(sorted(self.pending))})")
            epoch = self._epoch
        start = time.perf_counter()
        try:
            backend = self._incremental_backend(epoch)
            graph, rec = record(backend, size, copies=backend.records_on_copies)
        except BaseException as exc:
            with self._lock:
                if self._epoch == epoch:
                    self.pending.discard(size)
                    self.failed[size] = f"{type(exc).__name__}: {exc}"
            error = _capture_error(exc, size)
            if error is exc:
                raise
            raise error from exc
        self._publish(size, graph, rec, epoch)
        return time.perf_counter() - start

    def _publish(self, size: int, graph: CapturedGraph, record: CaptureRecord, epoch: int) -> None:
        """Make ``graph`` the one readers see for ``size`` (discarded when released meanwhile)."""
        with self._lock:
            if self._epoch != epoch:  # released meanwhile
                graph.release()
                return
            self.records[size] = record
            self.graphs[size] = graph
            self.pending.discard(size)
            if not self.pending and not self.failed:
                self.captured = True
                self.captures += 1

    @torch.no_grad()
    def load_stored(self, record: Record) -> int:
        """Publish every pending size whose compiled code the backend loads from its store; how many."""
        if self._stored is None or not backend_class(self.backend_name).compiles_code:
            return 0
        with self._lock:
            epoch = self._epoch
            pending = sorted(self.pending, reverse=True)
        if not pending:
            return 0
        backend = self._incremental_backend(epoch)
        published = 0
        for size in pending:
            try:
                graph, rec = record(backend, size, copies=backend.records_on_copies, load_only=True)
            except Exception as exc:  # a load that fails leaves the size to capture_size
                logger.warning("loading stored code for size %d failed: %s: %s", size, type(exc).__name__, exc)
                continue
            if graph is not None and rec is not None:
                self._publish(size, graph, rec, epoch)
                published += 1
        return published

    def _incremental_backend(self, epoch: int) -> GraphBackend:
        """The backend of this incremental capture, made and warmed up on first use."""
        backend = self.backend
        if backend is not None:
            return backend
        backend = self._make_backend()
        size = self.max_size
        args = self._static.shadow_views(size) if backend.records_on_copies else self._static.views(size)
        with span("warmup", size=size, backend=self.backend_name):
            check_outputs(backend.warmup(self._calls.warm, args), size)
        with self._lock:
            if self._epoch != epoch:
                backend.release()
                raise RuntimeError("the manager was released during its capture")
            if self.backend is None:
                self.backend = backend
            return self.backend

    def pending_compiles(self) -> int:
        """How many pending sizes will run a compile when captured (see the manager's property)."""
        with self._lock:
            pending, backend = len(self.pending), self.backend
        kind = backend_class(self.backend_name)
        if not kind.compiles_code or not pending:
            return 0
        if backend is None:  # no unit began yet: the backend will start as the default says
            try:
                return kind.expected_compiles(pending)
            except ValueError:  # a bad setting: making the backend fails and says so, not a report
                return pending
        ahead = getattr(backend, "compiles_ahead", None)
        return pending if ahead is None else int(ahead(pending))

    def release(self) -> None:
        """Free every graph and the backend; a capture still running discards its graph instead of
        publishing it."""
        with self._lock:
            self._epoch += 1
            if self.backend is not None:
                _discard(self.graphs, self.backend)
            self.backend = None
            self.graphs = {}
            self.records = {}
            self.captured_ptrs = {}
            self.captured = False
            self.started = False
            self.pending = set()
            self.failed = {}
