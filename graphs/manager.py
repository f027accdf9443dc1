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

The manager decides and delegates: `GraphSet` (graph_set.py) captures, publishes and releases
the graphs, `Replayer` (replay.py) runs a plan or the eager step and counts it, `StepCalls`
(step_calls.py) adapts the step to the backends, `manager_stats` (stats.py) builds the snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from torch import Tensor

from .backends import Capabilities, capabilities, resolve_backend
from .capture_share import CaptureShare
from .compile.entry import StoredCode
from .core.protocol import CapturedGraph, GraphBackend
from .debug import DebugConfig
from .graph_set import GraphSet
from .replay import Replayer, ReplayPlan, StepOutput
from .sizes import padded_size, padding_table
from .static import PadValue, StaticInputs
from .stats import CaptureRecord, ManagerStats, ReplayCounters, manager_stats
from .step_calls import StepCalls

__all__ = ["GraphCaptureManager", "MISS_REASONS", "Miss"]


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

    One job, the decision per size (`lookup`), and the door to what it delegates (module
    docstring); a third of it is read-only views for callers, which a split would only forward.
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
        self._can = capabilities(self._backend_name)
        if not sizes and self._can.captures:
            raise ValueError(f"capture_sizes is empty: backend {self._backend_name!r} needs at least one size")
        if self._can.replays_on_device and any(d.type != "cuda" for d in self._static.devices()):
            devices = sorted(map(str, self._static.devices()))
            raise ValueError(f"static_inputs on {devices}: backend {self._backend_name!r} needs CUDA tensors")
        if counters is not None and not isinstance(counters, ReplayCounters):
            raise TypeError(f"counters={type(counters).__name__}: must be a ReplayCounters or None")
        self._stored = stored
        self._table = padding_table(sizes) if self._can.captures else ()
        self._debug = DebugConfig.resolve(debug, debug_every)
        self._counters = ReplayCounters() if counters is None else counters
        self._calls = StepCalls(step, self._static.names)
        # "auto": compile then keeps a size's graph only when faster than eager
        self._set = GraphSet(self._backend_name, sizes, self._static, self._calls,
                             auto=backend == "auto", stored=stored, share=share)
        self._runs = Replayer(step, self._static, self._counters, self._debug, self._set)
        self._first = self._static.names[0]
        self._plans: dict[int, ReplayPlan] = {}

    # ---- properties -------------------------------------------------------------------
    @property
    def backend_name(self) -> str:
        """The resolved backend: "cuda", "compile", "trace" or "eager"."""
        return self._backend_name

    @property
    def capabilities(self) -> Capabilities:
        """What the resolved backend does (the code asks these, never `backend_name`)."""
        return self._can

    @property
    def compiles_elsewhere(self) -> bool:
        """True when this manager's compiles run in a compile process (`StoredCode.compiler`), off
        this process's interpreter lock: only recording and the check run here."""
        stored = self._stored
        return self._can.compiles_code and stored is not None and stored.compiler is not None

    @property
    def captured_sizes(self) -> tuple[int, ...]:
        """Sizes with a live graph, ascending (empty before capture and for eager)."""
        return tuple(sorted(self._set.graphs))

    @property
    def capture_sizes(self) -> tuple[int, ...]:
        """Sizes this manager captures, ascending."""
        return self._set.sizes

    @property
    def max_size(self) -> int:
        """The largest capture size (0 for an eager manager without sizes)."""
        return self._set.max_size

    @property
    def is_captured(self) -> bool:
        """True once every size is captured (``capture()``, or the last ``capture_size``) until
        ``release()``."""
        return self._set.captured

    @property
    def pending_sizes(self) -> tuple[int, ...]:
        """Sizes queued by `begin` and not captured yet, ascending."""
        return tuple(sorted(self._set.pending))

    @property
    def pending_compiles(self) -> int:
        """How many `pending_sizes` will run a compile when captured (the compile backend; 0 for
        the others): with one symbolic compile per step, 1 until it ran or was loaded from the
        store, then 0 (the other sizes only record and check against it); per size, each of them
        (`CompileBackend.compiles_ahead`). What an estimate of the time they take counts."""
        return self._set.pending_compiles()

    @property
    def failed_sizes(self) -> dict[int, str]:
        """Sizes whose `capture_size` failed (they stay eager), with the error."""
        return dict(self._set.failed)

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
        return manager_stats(self._backend_name, self._set.records, self._counters, self._set.captures)

    @property
    def _backend(self) -> GraphBackend | None:
        """The backend of the live capture (None before capture): tests and benchmarks read its counters."""
        return self._set.backend

    @property
    def _graphs(self) -> Mapping[int, CapturedGraph]:
        """The live graphs by size (see `captured_graph`): tests read them all."""
        return self._set.graphs

    def padded_size(self, b: int) -> int | None:
        """Smallest capture size >= b (precomputed table); None above the largest (always for eager)."""
        return padded_size(self._table, b)

    def captured_graph(self, size: int) -> CapturedGraph | None:
        """The live graph for ``size`` (None if not captured): for introspection and benchmarks;
        replaying it directly skips loading the batch, so it reads whatever the static rows hold."""
        return self._set.graphs.get(size)

    def node_count(self, size: int) -> int | None:
        """Kernel-launching nodes of the graph for ``size``; None if not captured or unknown."""
        graph = self._set.graphs.get(size)
        return None if graph is None else graph.nodes

    # ---- capture / release (the work is `GraphSet`'s) -----------------------------------

    def capture(self) -> None:
        """Warm up at the largest size, then capture every size largest first into one pool.

        Largest first lets smaller graphs reuse the blocks of larger ones in the shared
        pool. On failure everything captured in this call is released, the manager stays
        uncaptured and a GraphCaptureError naming the size (cause chained) propagates.
        """
        self._set.capture_all(self._capture_one)

    def _capture_one(self, backend: GraphBackend, size: int, copies: bool = False, load_only: bool = False
                     ) -> tuple[CapturedGraph | None, CaptureRecord | None]:
        """Capture one size and time it (`GraphSet.record`): the one place every capture goes through."""
        return self._set.record(backend, size, copies=copies, load_only=load_only)

    def begin(self) -> None:
        """Start an incremental capture: every size becomes pending, `lookup` answers "not_ready"
        for it until `capture_size` publishes its graph. Idempotent while started."""
        self._set.begin()

    def capture_size(self, size: int) -> float:
        """Capture one pending size and publish it (one dict assignment: a concurrent `lookup`
        sees the whole graph or none); returns the seconds it took.

        Backends that record over stand-ins (trace, compile) never touch the live static rows,
        so this may run in another thread while steps replay other sizes; a CUDA capture must
        run where no other kernels are launched (a step boundary). The first call warms the
        step up at the largest size. On failure the size stays eager (``failed_sizes``,
        "capture_failed") and GraphCaptureError (cause chained) propagates; the other sizes
        are unaffected. A `release()` meanwhile discards the result."""
        return self._set.capture_size(size, self._capture_one)

    def load_stored(self) -> int:
        """Publish every pending size whose compiled code the backend loads from its store (no
        recording, no compile: tens of milliseconds a size); the others stay pending for
        `capture_size`. Returns how many were published. Cheap enough to call where serving
        waits (a constructor); a backend without a store publishes nothing. Sizes run beside
        serving the same way `capture_size` does (stand-ins, never the live rows)."""
        return self._set.load_stored(self._capture_one)

    def release(self) -> None:
        """Free all graphs, static output buffers and the pool; capture() may run again; idempotent.
        The run counters stay (they count what happened, not what is live). An incremental
        capture still running discards its graph instead of publishing it."""
        self._set.release()
        self._plans = {}

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
        if not self._can.captures:
            return _MISSES["eager_backend"]
        graphs = self._set
        if not (graphs.captured or graphs.started):
            raise RuntimeError(f"lookup(): backend {self._backend_name!r} has not captured yet; call capture() first")
        padded = padded_size(self._table, b)
        if padded is None:
            return _MISSES["above_max"]
        graph = graphs.graphs.get(padded)
        if graph is None:  # incremental capture: not published (yet)
            return _MISSES["capture_failed" if padded in graphs.failed else "not_ready"]
        if getattr(graph, "prefer_eager", False):  # "auto": its replay timed slower than eager
            return _MISSES["eager_faster"]
        plan = ReplayPlan(self._static.plan(b, padded), graph, self._counters.usage(padded), self._calls.single)
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
        return self._runs.replay(plan, tensors, clone)

    def replay_trusted(self, plan: ReplayPlan, tensors: tuple[Tensor, ...]) -> StepOutput:
        """Replay ``plan`` on ``tensors``, given in the static inputs' name order, that the caller
        has checked at its entry (a draft worker): exactly [plan.b, *trailing] of each static
        input's dtype, on its device. Nothing is checked here (one check per step: the
        caller's); the outputs are `replay`'s with ``clone=False``."""
        return self._runs.replay(plan, tensors, False)

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
                return self._runs.replay(plan, tensors, clone)
        return self._run_checked(inputs, clone)

    def _run_checked(self, inputs: Mapping[str, Tensor], clone: bool) -> StepOutput:
        """``run`` after the full input check: first runs of a size, eager, fallbacks, unusual batches."""
        b = self._static.batch_size(inputs)
        plan = self.lookup(b)
        if type(plan) is ReplayPlan:
            return self._runs.replay(plan, self._static.ordered(inputs), clone)
        return self._runs.eager(inputs, b, fallback=self._can.captures)
