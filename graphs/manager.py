"""GraphCaptureManager: capture a step once per batch size over static buffers, then pad and replay.

The manager never sees a model: it gets a callable ``step(**inputs)`` and the static
input tensors it should read. Capture warms the step up eagerly at the largest size,
then captures every size largest first into one shared pool (so smaller graphs reuse
the larger one's memory). A batch of b rows is copied into the first b rows of the
static inputs, pad rows are filled, the graph for the smallest captured size >= b
replays, and outputs come back sliced to b rows. A batch above the largest size runs
the step eagerly on the inputs as given and never touches the static buffers.

One decision, one count (STYLE.md §6.13): `lookup(b)` is the only place that decides
whether b rows replay and at which padded size; it answers a value, a prepared `ReplayPlan` or
a `Miss` naming why no graph serves b ("run eager"), and `run` as well as a caller that
dispatches itself (a draft worker: `lookup`, then `replay_trusted` or its own eager path) trust
that answer. A plan (the load plan with its views and checks, the graph, the size's usage
counter) is built on b's first lookup and dropped on release, so a replay does one dict lookup,
the exact-type checks (none through `replay_trusted`), the copies, the replay and the output
slices. Each replay is counted once, in the `SizeUsage` of its padded size; the totals in
`stats` are sums of those.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch
from torch import Tensor

from .backends import backend_class, make_backend, resolve_backend
from .capture_share import CaptureShare
from .compile.entry import StoredCode
from .debug import DebugConfig, check_data_ptrs, compare_outputs
from .errors import GraphCaptureError
from .protocol import CapturedGraph, GraphBackend, check_outputs, flatten_outputs
from .sizes import padded_size, padding_table
from .spans import span, suppress_spans
from .static import LoadPlan, PadValue, StaticInputs
from .stats import CaptureRecord, ManagerStats, ReplayCounters, SizeStats, SizeUsage

__all__ = ["GraphCaptureManager", "MISS_REASONS", "Miss", "ReplayPlan", "StepOutput"]

logger = logging.getLogger(__name__)

StepOutput = Tensor | tuple[Tensor, ...]

MISS_REASONS = ("eager_backend", "above_max", "not_ready", "capture_failed", "eager_faster")
"""Why `lookup` finds no graph: the backend is eager, b is above the largest capture size, its
size's graph is still queued, its capture failed, or "auto" timed its replay slower than eager."""


@dataclass(frozen=True, slots=True)
class Miss:
    """`lookup`'s answer "no graph serves this batch: run the step eagerly", with the reason (one
    of `MISS_REASONS` from the manager; a caller may name its own, e.g. "no_graphs")."""

    reason: str

    def __post_init__(self) -> None:
        if not isinstance(self.reason, str) or not self.reason:
            raise TypeError(f"reason={self.reason!r}: must be a non-empty str")


_MISSES = {reason: Miss(reason) for reason in MISS_REASONS}  # one immutable value per reason


class ReplayPlan:
    """The manager's answer "replay b rows at size ``padded``", prepared on b's first lookup
    (see the module docstring); pass it back to `GraphCaptureManager.replay`.

    ``result`` is the step's structure over the graph's fixed outputs cut to b rows: the same
    view objects for every run of b, in memory the next replay overwrites.
    """

    __slots__ = ("graph", "load", "pad_rows", "result", "usage")

    def __init__(self, load: LoadPlan, graph: CapturedGraph, usage: SizeUsage, single: bool) -> None:
        self.load = load
        self.graph = graph
        self.usage = usage
        self.pad_rows = load.padded - load.b
        b = load.b
        cut = tuple([o[:b] for o in graph.outputs])
        self.result: StepOutput = cut[0] if single else cut

    @property
    def b(self) -> int:
        """Rows of the batch."""
        return self.load.b

    @property
    def padded(self) -> int:
        """The captured size that replays them."""
        return self.load.padded

    def cloned(self) -> StepOutput:
        """Copies of ``result`` (for ``run(clone=True)``)."""
        result = self.result
        if isinstance(result, Tensor):
            return result.clone()
        return tuple([o.clone() for o in result])


def _check_sizes(capture_sizes: Iterable[int]) -> tuple[int, ...]:
    """Sorted unique positive capture sizes."""
    if isinstance(capture_sizes, (str, bytes)) or not isinstance(capture_sizes, Iterable):
        raise TypeError(f"capture_sizes={capture_sizes!r}: must be an iterable of ints")
    sizes = list(capture_sizes)
    for s in sizes:
        if isinstance(s, bool) or not isinstance(s, int) or s < 1:
            raise ValueError(f"capture_sizes contains {s!r}: every size must be an int >= 1")
    return tuple(sorted(set(sizes)))


class GraphCaptureManager:
    """Captured graphs of one step, one per batch size, sharing static inputs and one pool.

    ``step(**inputs)`` returns a tensor or a tuple of tensors whose dim 0 is the batch.
    ``static_inputs`` (name -> tensor, dim 0 >= max(capture_sizes)) are owned by the
    manager's graphs: never rebind or free them while captured. ``pad_values`` gives the
    fill value of pad rows per input (default 0). ``backend`` is "auto", "cuda", "compile",
    "trace" or "eager" (see ``resolve_backend``; "auto" follows the static inputs' device).
    ``debug``/``debug_every`` switch on replay checks (default: DRAFTGRAPH_DEBUG and
    DRAFTGRAPH_DEBUG_EVERY, read here). The eager backend captures nothing; its runs are
    counted as ``eager_runs``. ``counters`` is where runs are counted (default: a new
    `ReplayCounters`); a caller that recaptures with a new manager may pass the old one's.
    ``stored`` (`StoredCode`): the compile backend stores each compiled size there and loads
    stored code instead of recording and compiling again (see `load_stored`). ``share`` (a
    `CaptureShare`): the cuda backend captures into its pool on its stream, with the other
    managers given the same share (a runtime state's draft step and phases).
    """

    def __init__(
        self,
        step: Callable[..., StepOutput],
        static_inputs: Mapping[str, Tensor],
        capture_sizes: Iterable[int],
        backend: str = "auto",
        pad_values: Mapping[str, PadValue] | None = None,
        *,
        debug: bool | None = None,
        debug_every: int | None = None,
        counters: ReplayCounters | None = None,
        stored: StoredCode | None = None,
        share: CaptureShare | None = None,
    ) -> None:
        if not callable(step):
            raise TypeError(f"step={step!r}: must be callable")
        sizes = _check_sizes(capture_sizes)
        self._static = StaticInputs(static_inputs, pad_values, rows=max(sizes, default=0))
        self._backend_name = resolve_backend(backend, device=self._static.device)
        self._auto = backend == "auto"  # compile then keeps a size's graph only when faster than eager
        if not sizes and self._backend_name != "eager":
            raise ValueError(f"capture_sizes is empty: backend {self._backend_name!r} needs at least one size")
        if self._backend_name == "cuda" and any(d.type != "cuda" for d in self._static.devices()):
            devices = sorted(map(str, self._static.devices()))
            raise ValueError(f"static_inputs on {devices}: backend 'cuda' needs CUDA tensors")
        self._step = step
        self._stored = stored
        self._share = share
        self._sizes = sizes
        self._table = padding_table(sizes) if self._backend_name != "eager" else ()
        self._debug = DebugConfig.resolve(debug, debug_every)
        self._backend: GraphBackend | None = None
        self._graphs: dict[int, CapturedGraph] = {}
        self._records: dict[int, CaptureRecord] = {}
        if counters is not None and not isinstance(counters, ReplayCounters):
            raise TypeError(f"counters={type(counters).__name__}: must be a ReplayCounters or None")
        self._counters = ReplayCounters() if counters is None else counters
        self._single_output = False
        self._n_outputs = 0
        self._captured_ptrs: dict[str, int] = {}
        self._captured = False
        self._first = self._static.names[0]
        self._plans: dict[int, ReplayPlan] = {}
        self._captures = 0
        # incremental capture (`begin` / `capture_size`): sizes publish one at a time
        self._lock = threading.Lock()  # publication and release; never held while recording
        self._started = False
        self._epoch = 0  # bumped by release(): a capture that began before it is discarded
        self._pending: set[int] = set()
        self._failed: dict[int, str] = {}

    # ---- properties -------------------------------------------------------------------

    @property
    def backend_name(self) -> str:
        """The resolved backend: "cuda", "compile", "trace" or "eager"."""
        return self._backend_name

    @property
    def compiles_elsewhere(self) -> bool:
        """True when this manager's compiles run in a compile process (`StoredCode.compiler`), off
        this process's interpreter lock: only recording and the check run here."""
        stored = self._stored
        return backend_class(self._backend_name).compiles_code and stored is not None and stored.compiler is not None

    @property
    def captured_sizes(self) -> tuple[int, ...]:
        """Sizes with a live graph, ascending (empty before capture and for eager)."""
        return tuple(sorted(self._graphs))

    @property
    def capture_sizes(self) -> tuple[int, ...]:
        """Sizes this manager captures, ascending."""
        return self._sizes

    @property
    def max_size(self) -> int:
        """The largest capture size (0 for an eager manager without sizes)."""
        return self._sizes[-1] if self._sizes else 0

    @property
    def is_captured(self) -> bool:
        """True once every size is captured (``capture()``, or the last ``capture_size``) until
        ``release()``."""
        return self._captured

    @property
    def pending_sizes(self) -> tuple[int, ...]:
        """Sizes queued by `begin` and not captured yet, ascending."""
        return tuple(sorted(self._pending))

    @property
    def pending_compiles(self) -> int:
        """How many `pending_sizes` will run a compile when captured (the compile backend; 0 for
        the others): with one symbolic compile per step, 1 until it ran or was loaded from the
        store, then 0 (the other sizes only record and check against it); per size, each of them
        (`CompileBackend.compiles_ahead`). What an estimate of the time they take counts."""
        with self._lock:
            pending, backend = len(self._pending), self._backend
        kind = backend_class(self._backend_name)
        if not kind.compiles_code or not pending:
            return 0
        if backend is None:  # no unit began yet: the backend will start as the default says
            try:
                return kind.expected_compiles(pending)
            except ValueError:  # a bad setting: making the backend fails and says so, not a report
                return pending
        ahead = getattr(backend, "compiles_ahead", None)
        return pending if ahead is None else int(ahead(pending))

    @property
    def failed_sizes(self) -> dict[int, str]:
        """Sizes whose `capture_size` failed (they stay eager), with the error."""
        return dict(self._failed)

    @property
    def static_inputs(self) -> Mapping[str, Tensor]:
        """Read-only view of the static input tensors."""
        return self._static.tensors

    @property
    def debug(self) -> DebugConfig:
        """The debug settings in force."""
        return self._debug

    @property
    def counters(self) -> ReplayCounters:
        """The live run counters (see `ReplayCounters`)."""
        return self._counters

    @property
    def stats(self) -> ManagerStats:
        """Snapshot of capture and replay statistics (``sizes`` only lists live graphs)."""
        c = self._counters
        sizes = {}
        for s, rec in sorted(self._records.items()):
            usage = c.usage(s)
            sizes[s] = SizeStats(s, rec.capture_s, rec.capture_bytes, rec.nodes, usage.replays, usage.pad_rows,
                                 rec.compile_s, rec.engine, rec.fallback, rec.source, rec.compiles)
        return ManagerStats(backend=self._backend_name, sizes=MappingProxyType(sizes), captures=self._captures,
                            replays=c.replays, eager_fallbacks=c.eager_fallbacks, eager_runs=c.eager_runs,
                            debug_checks=c.debug_checks)

    def padded_size(self, b: int) -> int | None:
        """Smallest capture size >= b (precomputed table); None above the largest (always for eager)."""
        return padded_size(self._table, b)

    def captured_graph(self, size: int) -> CapturedGraph | None:
        """The live graph for ``size`` (None if not captured): for introspection and benchmarks;
        replaying it directly skips loading the batch, so it reads whatever the static rows hold."""
        return self._graphs.get(size)

    def node_count(self, size: int) -> int | None:
        """Kernel-launching nodes of the graph for ``size``; None if not captured or unknown."""
        graph = self._graphs.get(size)
        return None if graph is None else graph.nodes

    # ---- capture / release ------------------------------------------------------------

    def _call_step(self, args: tuple[Tensor, ...]) -> tuple[tuple[Tensor, ...], bool]:
        """Call the step with positional static views bound to their names; (flat outputs, single)."""
        return flatten_outputs(self._step(**dict(zip(self._static.names, args))))

    def _warm_step(self, *args: Tensor) -> tuple[Tensor, ...]:
        """Warm-up call: records the output structure every capture must repeat."""
        flat, self._single_output = self._call_step(args)
        self._n_outputs = len(flat)
        return flat

    def _flat_step(self, *args: Tensor) -> tuple[Tensor, ...]:
        """Captured call: the step's outputs as a flat tuple, same structure as at warm-up."""
        flat, single = self._call_step(args)
        if (len(flat), single) != (self._n_outputs, self._single_output):
            raise TypeError(
                f"step returned {len(flat)} output(s) (single={single}) at size {args[0].shape[0]}, "
                f"but {self._n_outputs} (single={self._single_output}) at warm-up: the structure must not change"
            )
        return flat

    def capture(self) -> None:
        """Warm up at the largest size, then capture every size largest first into one pool.

        Largest first lets smaller graphs reuse the blocks of larger ones in the shared
        pool. On failure everything captured in this call is released, the manager stays
        uncaptured and a GraphCaptureError naming the size (cause chained) propagates.
        """
        if self._captured:
            raise RuntimeError("capture(): already captured; call release() before capturing again")
        if self._backend_name == "eager":
            self._captured = True
            self._captures += 1
            return
        backend = make_backend(self._backend_name, self.max_size, self._static.device, auto=self._auto,
                               stored=self._stored, share=self._share)
        graphs: dict[int, CapturedGraph] = {}
        records: dict[int, CaptureRecord] = {}
        size = self.max_size
        try:
            with span("warmup", size=size, backend=self._backend_name):
                check_outputs(backend.warmup(self._warm_step, self._static.views(size)), size)
            for size in reversed(self._sizes):
                graphs[size], records[size] = self._capture_one(backend, size)
        except BaseException as exc:
            self._discard(graphs, backend)
            if isinstance(exc, Exception) and not isinstance(exc, GraphCaptureError):
                msg = f"capture failed at size {size}: {type(exc).__name__}: {exc}"
                raise GraphCaptureError(msg, size=size) from exc
            raise
        self._backend, self._graphs, self._records = backend, graphs, records
        self._captured_ptrs = self._static.data_ptrs()
        self._captured = True
        self._captures += 1
        logger.debug("captured sizes %s with backend %s", self.captured_sizes, self._backend_name)

    def _capture_one(self, backend: GraphBackend, size: int, copies: bool = False, load_only: bool = False
                     ) -> tuple[CapturedGraph | None, CaptureRecord | None]:
        """Capture one size and time it (``copies``: record over stand-ins of the static rows;
        ``load_only``: only the backend's stored code, (None, None) when it has none)."""
        with span("capture", size=size, backend=self._backend_name):
            start = time.perf_counter()
            with suppress_spans():  # spans in the step would not replay / would become graph ops
                args = (size, self._flat_step, self._static.views(size))
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

    @staticmethod
    def _discard(graphs: Mapping[int, CapturedGraph], backend: GraphBackend) -> None:
        """Release graphs and the backend of a failed capture."""
        for graph in graphs.values():
            graph.release()
        backend.release()

    def begin(self) -> None:
        """Start an incremental capture: every size becomes pending, `lookup` answers "not_ready"
        for it until `capture_size` publishes its graph. Idempotent while started."""
        with self._lock:
            if self._started:
                return
            if self._captured:
                raise RuntimeError("begin(): already captured; call release() first")
            if self._backend_name == "eager":
                self._captured = True
                self._captures += 1
                return
            self._started = True
            self._pending = set(self._sizes)
            self._captured_ptrs = self._static.data_ptrs()
        backend_class(self._backend_name).prepare_background()  # before any thread compiles

    def capture_size(self, size: int) -> float:
        """Capture one pending size and publish it (one dict assignment: a concurrent `lookup`
        sees the whole graph or none); returns the seconds it took.

        Backends that record over stand-ins (trace, compile) never touch the live static rows,
        so this may run in another thread while steps replay other sizes; a CUDA capture must
        run where no other kernels are launched (a step boundary). The first call warms the
        step up at the largest size. On failure the size stays eager (``failed_sizes``,
        "capture_failed") and GraphCaptureError (cause chained) propagates; the other sizes
        are unaffected. A `release()` meanwhile discards the result."""
        with self._lock:
            if size not in self._pending:
                raise ValueError(f"capture_size({size!r}): not pending (pending: {self.pending_sizes})")
            epoch = self._epoch
        start = time.perf_counter()
        try:
            backend = self._incremental_backend(epoch)
            graph, record = self._capture_one(backend, size, copies=backend.records_on_copies)
        except BaseException as exc:
            with self._lock:
                if self._epoch == epoch:
                    self._pending.discard(size)
                    self._failed[size] = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, Exception) and not isinstance(exc, GraphCaptureError):
                raise GraphCaptureError(f"capture failed at size {size}: {type(exc).__name__}: {exc}",
                                        size=size) from exc
            raise
        self._publish(size, graph, record, epoch)
        return time.perf_counter() - start

    def _publish(self, size: int, graph: CapturedGraph, record: CaptureRecord, epoch: int) -> None:
        """Make ``graph`` the one `lookup` sees for ``size`` (discarded when released meanwhile)."""
        with self._lock:
            if self._epoch != epoch:  # released meanwhile
                graph.release()
                return
            self._records[size] = record
            self._graphs[size] = graph
            self._pending.discard(size)
            if not self._pending and not self._failed:
                self._captured = True
                self._captures += 1

    def load_stored(self) -> int:
        """Publish every pending size whose compiled code the backend loads from its store (no
        recording, no compile: tens of milliseconds a size); the others stay pending for
        `capture_size`. Returns how many were published. Cheap enough to call where serving
        waits (a constructor); a backend without a store publishes nothing. Sizes run beside
        serving the same way `capture_size` does (stand-ins, never the live rows)."""
        if self._stored is None or not backend_class(self._backend_name).compiles_code:
            return 0
        with self._lock:
            epoch = self._epoch
            pending = sorted(self._pending, reverse=True)
        if not pending:
            return 0
        backend = self._incremental_backend(epoch)
        published = 0
        for size in pending:
            try:
                graph, record = self._capture_one(backend, size, copies=backend.records_on_copies, load_only=True)
            except Exception as exc:  # a load that fails leaves the size to capture_size
                logger.warning("loading stored code for size %d failed: %s: %s", size, type(exc).__name__, exc)
                continue
            if graph is not None and record is not None:
                self._publish(size, graph, record, epoch)
                published += 1
        return published

    def _incremental_backend(self, epoch: int) -> GraphBackend:
        """The backend of this incremental capture, made and warmed up on first use."""
        backend = self._backend
        if backend is not None:
            return backend
        backend = make_backend(self._backend_name, self.max_size, self._static.device, auto=self._auto,
                               stored=self._stored, share=self._share)
        size = self.max_size
        args = self._static.shadow_views(size) if backend.records_on_copies else self._static.views(size)
        with span("warmup", size=size, backend=self._backend_name):
            check_outputs(backend.warmup(self._warm_step, args), size)
        with self._lock:
            if self._epoch != epoch:
                backend.release()
                raise RuntimeError("the manager was released during its capture")
            if self._backend is None:
                self._backend = backend
            return self._backend

    def release(self) -> None:
        """Free all graphs, static output buffers and the pool; capture() may run again; idempotent.
        The run counters stay (they count what happened, not what is live). An incremental
        capture still running discards its graph instead of publishing it."""
        with self._lock:
            self._epoch += 1
            if self._backend is not None:
                self._discard(self._graphs, self._backend)
            self._backend = None
            self._graphs = {}
            self._records = {}
            self._plans = {}
            self._captured_ptrs = {}
            self._captured = False
            self._started = False
            self._pending = set()
            self._failed = {}

    # ---- dispatch and run -----------------------------------------------------------------

    def lookup(self, b: int) -> ReplayPlan | Miss:
        """The one dispatch decision: the prepared plan that replays b rows (at the smallest
        capture size >= b), or a `Miss` when no graph serves b, naming the reason: "eager_backend",
        "above_max" (b above the largest size), "not_ready" (its graph is still queued),
        "capture_failed" or "eager_faster" ("auto" timed its replay slower than the eager step at
        capture); the caller then runs the step eagerly.
        RuntimeError before any capture (graph backends): replaying nothing is a bug, not a
        shape without a graph."""
        plan = self._plans.get(b)
        if plan is not None:
            return plan
        if self._backend_name == "eager":
            return _MISSES["eager_backend"]
        if not (self._captured or self._started):
            raise RuntimeError(f"lookup(): backend {self._backend_name!r} has not captured yet; call capture() first")
        padded = padded_size(self._table, b)
        if padded is None:
            return _MISSES["above_max"]
        graph = self._graphs.get(padded)
        if graph is None:  # incremental capture: not published (yet)
            return _MISSES["capture_failed" if padded in self._failed else "not_ready"]
        if getattr(graph, "prefer_eager", False):  # "auto": its replay timed slower than eager
            return _MISSES["eager_faster"]
        plan = ReplayPlan(self._static.plan(b, padded), graph, self._counters.usage(padded), self._single_output)
        self._plans[b] = plan
        return plan

    def replay(self, plan: ReplayPlan, inputs: Mapping[str, Tensor], clone: bool = False) -> StepOutput:
        """Replay ``plan`` (from `lookup`) on ``inputs`` (name -> tensor [plan.b, ...]); the outputs
        as `run` returns them. ValueError/TypeError for a batch the plan does not fit (or a `Miss`
        passed as the plan)."""
        if type(plan) is not ReplayPlan:
            raise TypeError(f"plan={plan!r}: must be a ReplayPlan (lookup answered no graph)")
        tensors = plan.load.match(inputs)
        if tensors is None:
            b = self._static.batch_size(inputs)
            if b != plan.b:
                raise ValueError(f"inputs have {b} rows: the plan replays {plan.b} (call lookup({b}))")
            tensors = self._static.ordered(inputs)
        return self._replay(plan, tensors, clone)

    def replay_trusted(self, plan: ReplayPlan, tensors: tuple[Tensor, ...]) -> StepOutput:
        """Replay ``plan`` on ``tensors``, given in the static inputs' name order, that the caller
        has checked at its entry (a draft worker): exactly [plan.b, *trailing] of each static
        input's dtype, on its device. Nothing is checked here (one check per step: the
        caller's); the outputs are `replay`'s with ``clone=False``."""
        return self._replay(plan, tensors, False)

    def run(self, inputs: Mapping[str, Tensor], clone: bool = False) -> StepOutput:
        """Run a batch (name -> tensor [b, ...]) through the graph `lookup(b)` picks.

        Returns the step's structure (tensor or tuple) sliced to b rows. With
        ``clone=False`` the outputs are views of graph memory that the next replay (of
        any size) overwrites, prepared once: every run of b returns the same view objects,
        so read them or copy from them, never change their metadata in place (``resize_``,
        ``squeeze_``, ``set_``); ``clone=True`` returns copies. Above the largest size the
        step runs eagerly on ``inputs`` as given (static buffers untouched, counted as
        ``eager_fallbacks``). The eager backend always calls the step directly (no
        padding, ``clone`` ignored, counted as ``eager_runs``). No run records autograd
        history, whatever the grad mode (inputs that require grad and inference-mode tensors
        are fine). Raises RuntimeError before capture (graph backends), ValueError/TypeError
        for a bad batch.
        """
        first = inputs.get(self._first) if type(inputs) is dict else None
        if type(first) is Tensor and first.dim():
            plan = self._plans.get(first.shape[0])
            tensors = plan.load.match(inputs) if plan is not None else None
            if tensors is not None:
                return self._replay(plan, tensors, clone)
        return self._run_checked(inputs, clone)

    def _run_checked(self, inputs: Mapping[str, Tensor], clone: bool) -> StepOutput:
        """``run`` after the full input check: first runs of a size, eager, fallbacks, unusual batches."""
        b = self._static.batch_size(inputs)
        plan = self.lookup(b)
        if type(plan) is ReplayPlan:
            return self._replay(plan, self._static.ordered(inputs), clone)
        if self._backend_name == "eager":
            self._counters.eager_runs += 1
            with span("eager_run", bs=b), torch.no_grad():  # as a replay: no autograd history
                return self._step(**inputs)
        self._counters.eager_fallbacks += 1
        with span("eager_fallback", bs=b), torch.no_grad():
            return self._step(**inputs)

    def _replay(self, plan: ReplayPlan, tensors: tuple[Tensor, ...], clone: bool) -> StepOutput:
        """Load the checked batch, replay (with debug checks), count it; the prepared b-row outputs.
        Never records autograd history, whatever the caller's grad mode: a batch that requires
        grad would otherwise make the static inputs record it (and later loads fail)."""
        if torch.is_grad_enabled():
            with torch.no_grad():
                return self._replay_loaded(plan, tensors, clone)
        return self._replay_loaded(plan, tensors, clone)

    def _replay_loaded(self, plan: ReplayPlan, tensors: tuple[Tensor, ...], clone: bool) -> StepOutput:
        """`_replay` with grad off."""
        load = plan.load
        with span("replay", bs=load.b, padded=load.padded):
            load.load(tensors)
            usage = plan.usage
            usage.replays += 1
            usage.pad_rows += plan.pad_rows
            if self._debug.enabled:
                self._debug_replay(plan)
            else:
                plan.graph.replay()
            return plan.cloned() if clone else plan.result

    def _debug_replay(self, plan: ReplayPlan) -> None:
        """Replay with the debug checks: static inputs not moved; every Nth, graph == eager."""
        check_data_ptrs(self._captured_ptrs, self._static.data_ptrs())
        if not self._debug.compare_due(self._counters.replays):
            plan.graph.replay()
            return
        padded = plan.load.padded
        clones = self._static.clones(padded)
        outs = plan.graph.replay()
        eager, _ = flatten_outputs(self._step(**clones))
        self._counters.debug_checks += 1
        compare_outputs(outs, eager, padded)
