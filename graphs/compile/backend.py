"""CPU ``compile`` backend: record exactly as ``trace`` does, replay an inductor-compiled graph.

Capture semantics are the trace backend's (same make_fx recording, same rejections of host
syncs and data-dependent shapes, same static outputs and node counts); only the replay
differs. Per captured size the recorded aten graph is compiled with inductor
(`torch._inductor.compile_fx.compile_fx`) directly, not through `torch.compile`: the graph is
already aten, so dynamo has nothing to trace, and calling the compiled function without
dynamo's guards and wrappers is what makes small steps fast (measured on the tiny step:
about 0.1 ms per replay against 0.35 ms through `torch.compile`, 1.2 ms eager).

Before the compiled function replaces the FX replay, both run once on separate copies of the
same inputs and must agree bitwise (`compare`). A mismatch or a compile error keeps that size on
the FX replay, with a warning naming the size and a counter (`CompileBackend.fallbacks`); never
a silent wrong result. Sums, means and softmax are compiled as calls to ATen's own kernels
(`aten_reductions`): inductor's loops sum in another order, so a graph with them failed this
check on real data (the float64 verify forward kept its FX replay).

The rooms: `inductor` (compile, artifact, load, the module ledger, the cache folder),
`compare` (the bitwise check), `store_io` (stored code, a collaborator), `symbolic` (one compile
per step, one object), `per_size` (one compile per size), `speed` ("auto"'s timing), `records`
(`CaptureOutcome`, `CompiledRunner`). Inductor's on-disk cache goes under
``$DRAFTGRAPH_CACHE/inductor`` unless ``TORCHINDUCTOR_CACHE_DIR`` is set.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from torch import Tensor

from ..core.backend_trace import TraceBackend, TraceGraph
from ..core.cancel import CaptureCancelled, cancel_requested
from ..core.errors import GraphCaptureError
from ..core.protocol import FlatStep
from .context import CompileContext
from .entry import CompiledStore, StoredGraph
from .inductor import prepare_background_compile
from .per_size import compile_per_size
from .records import CaptureOutcome
from .speed import time_against_eager
from .store_io import StoredCodeIO
from .symbolic import SymbolicRoute, symbolic_default
from .worker import CompileWorker, CompileWorkerDied

__all__ = ["CompileBackend"]

logger = logging.getLogger(__name__)


class CompileBackend(TraceBackend):
    """The trace recorder with an inductor-compiled replay per size, checked bitwise first.

    ``compile_fn(gm, example_inputs) -> callable`` is inductor's ``standalone_compile`` by
    default (a parameter so a test can force a failure or a mismatch; a custom one is never
    stored). ``fallbacks`` counts sizes that kept the FX replay; ``compile_s`` is the compile
    seconds per size.

    With a ``store`` (`CompiledStore`), a ``constants`` table (name -> every tensor the step may
    read: see `entry`) and a ``structure`` string (what the step is), each compiled size is
    written to the store and `load` (tried first by `capture`) replays stored code without
    recording or compiling; ``loaded`` / ``shared`` / ``stored`` count them (`StoredCodeIO`).
    With a ``compiler`` (`CompileWorker`) inductor runs in that process: this one records, loads
    the returned code and checks it; a compile process that dies fails the size
    (`GraphCaptureError`: it serves eager, counted) instead of falling back to the FX replay.

    ``symbolic`` (default: ``DRAFTGRAPH_COMPILE_SYMBOLIC``, "1" unless set to "0";
    `SymbolicRoute`): the first captured size also records the step once with a symbolic batch
    dimension and compiles that once; every size then replays that one function, checked
    bitwise against its own recording (a size that fails the check, or every size when the
    symbolic recording or compile fails, compiles per size). ``symbolic_compiles`` /
    ``symbolic_sizes`` count them.
    """

    name = "compile"
    compiles_code = True
    stores_code = True

    def __init__(self, rows: int, compile_fn: Callable[..., Any] | None = None,
                 check_speed: bool = False, store: CompiledStore | None = None,
                 constants: Mapping[str, Tensor] | None = None, structure: str | None = None,
                 compiler: CompileWorker | None = None, symbolic: bool | None = None) -> None:
        super().__init__(rows)
        self.symbolic = symbolic_default() if symbolic is None else bool(symbolic)
        self.replay_engine = "fx"  # the recorded graph; the compiled runner replaces it per size
        self.check_speed = check_speed  # "auto": time the replay against eager, keep the faster
        self.fallbacks = 0
        self.compile_s: dict[int, float] = {}
        usable = store is not None and constants is not None and bool(structure)
        self._io = StoredCodeIO(store, constants, structure or "", self.name, self.buffer_for,
                                use_timings=check_speed) if usable else None  # type: ignore[arg-type]
        self._ctx = CompileContext(compile_fn=compile_fn, compiler=compiler, storing=usable)
        self._route = SymbolicRoute(self.symbolic, rows, self._ctx)

    @staticmethod
    def expected_compiles(pending: int) -> int:
        """How many of ``pending`` sizes a fresh backend would compile (`compiles_ahead` before
        any capture: 1 with the symbolic default, else one per size)."""
        return 1 if symbolic_default() else pending

    @staticmethod
    def prepare_background() -> None:
        """Before any thread compiles (`inductor.prepare_background_compile`)."""
        prepare_background_compile()

    # ---- counts ------------------------------------------------------------------------------
    @property
    def compiles(self) -> int:
        """Compiles run (symbolic and per size, here or in the compile process)."""
        return self._ctx.compiles

    @property
    def symbolic_compiles(self) -> int:
        return self._route.compiles

    @property
    def symbolic_compile_s(self) -> float:
        return self._route.compile_s

    @property
    def symbolic_sizes(self) -> list[int]:
        return self._route.sizes

    @property
    def loaded(self) -> int:
        return self._io.loaded if self._io is not None else 0

    @property
    def shared(self) -> int:
        return self._io.shared if self._io is not None else 0

    @property
    def stored(self) -> int:
        return self._io.stored if self._io is not None else 0

    def compiles_ahead(self, sizes: int) -> int:
        """How many of ``sizes`` captures still to run will compile: with the one symbolic compile
        (``symbolic``, no custom ``compile_fn``) 1 until it ran or was loaded from the store, then 0
        (each size only records and checks against it; one that fails the check compiles on its
        own, not foreseen here); per size, or once the symbolic compile failed, ``sizes`` (one
        cut off by a close still counts as the 1 it would have been)."""
        if sizes <= 0:
            return 0
        ahead = self._route.compiles_ahead(sizes)
        return sizes if ahead is None else ahead

    # ---- capture -----------------------------------------------------------------------------
    def load(self, size: int, fn: FlatStep, args: tuple[Tensor, ...],
             trace_args: tuple[Tensor, ...] | None = None) -> StoredGraph | None:
        """The stored compiled code of ``size`` over ``args`` (no recording, no compile), or None
        when there is no store or no entry; an unusable entry is refused through the store
        (named, removed) and None returned, so the caller records and compiles again."""
        io = self._io
        if io is None:
            return None
        start = time.perf_counter()
        graph = self._route.load(size, args, io) if self._route.active else None
        if graph is None:
            graph = io.load_size(size, args, self._ctx.ledger)
            if graph is None:
                return None
            logger.debug("compile backend: size %d %s from the store in %.3f s", size, graph.source,
                         time.perf_counter() - start)
        if self.check_speed and graph.replay_s is None:
            time_against_eager(graph, fn, args if trace_args is None else trace_args)
        return graph

    def capture(self, size: int, fn: FlatStep, args: tuple[Tensor, ...],
                trace_args: tuple[Tensor, ...] | None = None) -> TraceGraph | StoredGraph:
        """Load ``size``'s stored code (`load`); else record as `TraceBackend.capture` does, then
        compile and check the replay (and store it)."""
        stored = self.load(size, fn, args, trace_args)
        if stored is not None:
            return stored
        unit_start = time.perf_counter()
        graph = super().capture(size, fn, args, trace_args)
        rec_args = args if trace_args is None else trace_args
        outcome = self._compile(graph, fn, rec_args, args, size)
        # what this compile left in process-wide caches goes with the graph (measured without
        # this: +1 inductor module and ~20 KB RSS per reload, for the life of the process)
        self._ctx.ledger.release_with(graph)
        self._route.ledger.release_with(graph)
        self.compile_s[size] = outcome.seconds
        graph.compile_s = outcome.seconds
        graph.compiles = outcome.compiles
        runner = outcome.runner
        if runner is None:
            self.fallbacks += 1
            graph.fallback_reason = outcome.reason
            logger.warning("compile backend: size %d keeps the FX replay (%s)", size, outcome.reason)
        else:
            graph.use_runner(runner, "inductor")
            logger.debug("compile backend: size %d compiled in %.2f s", size, outcome.seconds)
        if self.check_speed:
            time_against_eager(graph, fn, rec_args)
        if runner is not None and self._io is not None and self._ctx.default_compile:
            if runner.symbolic:
                self._route.save(self._io, graph)
            else:
                self._io.save(graph, runner)
            self._io.store.note_unit_seconds(time.perf_counter() - unit_start, compiled=graph.compiles > 0)
        return graph

    def _compile(self, graph: TraceGraph, fn: FlatStep, rec_args: tuple[Tensor, ...], args: tuple[Tensor, ...],
                 size: int) -> CaptureOutcome:
        """Compile ``graph`` (the symbolic route first, then per size) into a `CaptureOutcome`;
        a compile process that died fails the size (`GraphCaptureError`), a cancel propagates."""
        start = time.perf_counter()
        before = self._ctx.compiles
        runner, reason = None, None
        try:
            if self._route.active:
                runner, why = self._route.runner(fn, rec_args, args, graph.module, size)
                if runner is None:
                    logger.info("compile backend: size %d compiles on its own (%s)", size, why)
            if runner is None:
                runner, reason = compile_per_size(self._ctx, graph.module, args, size)
        except CompileWorkerDied as exc:  # not the graph's fault: this size serves eager, counted
            graph.release()
            raise GraphCaptureError(f"size {size}: {exc}", size=size) from exc
        except CaptureCancelled:  # the capture thread was stopped (exit): no fallback, no warning
            graph.release()
            raise
        except Exception as exc:  # inductor raises many kinds; the FX replay stays correct
            if cancel_requested():  # the process is exiting ("cannot schedule new futures after
                graph.release()  # interpreter shutdown"): no fallback, no warning
                raise CaptureCancelled(f"size {size}: cancelled at exit", size=size) from exc
            runner, reason = None, f"compile failed: {type(exc).__name__}: {exc}"
        return CaptureOutcome(runner, reason, time.perf_counter() - start, self._ctx.compiles - before)
