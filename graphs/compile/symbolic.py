"""One compile per step, not per size (the default): record with a symbolic batch dimension.

`record_symbolic` records a flat step once with dim 0 of every static input symbolic (a
`FakeTensorMode` with a `ShapeEnv`; the tensors the step closes over stay real constants), and
`inductor.compile_symbolic` compiles that graph once (``standalone_compile(dynamic_shapes=
"from_graph")``). `SymbolicRoute`, the compile backend's one object for this route, then replays
the one compiled function at every captured size, checked bitwise per size against that size's
own FX recording (`compare.compare_on_worlds`); the compile may run in the compile process
(`worker`), and the code is stored once for every size (`entry.entry_key` with no size; its
manifest holds each checked size's outputs, so a later start replays those sizes with no
recording and no compile). ``DRAFTGRAPH_COMPILE_SYMBOLIC=0`` compiles each size on its own
instead. Measured on the default EAGLE draft forwards (scripts/symbolic_probe.py): bitwise equal
to per-size code, +5..+20% per replay.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import torch
from torch import Tensor, fx

from ..core.aten_reductions import keep_aten_reductions
from ..core.backend_trace import RECORD_LOCK, TraceGraph
from ..core.cancel import CaptureCancelled, cancel_requested, check_cancelled
from ..core.hostsync import HostSyncGuard
from ..core.protocol import FlatStep
from ..core.settings import compile_symbolic as symbolic_default
from .compare import compare_on_worlds, lift_constants, shares_storage
from .context import CompileContext
from .entry import StoredGraph
from .inductor import ModuleLedger, artifact_bytes, compile_symbolic, fx_work, load_artifact, use_cache_dir
from .records import CompiledRunner
from .store_io import StoredCodeIO, SymbolicCode
from .worker import CompileWorkerDied

__all__ = ["SymbolicRoute", "record_symbolic", "symbolic_default"]

logger = logging.getLogger(__name__)


def record_symbolic(fn: FlatStep, args: Sequence[Tensor], hint: int, size: int
                    ) -> tuple[fx.GraphModule, list[Tensor]]:
    """make_fx ``fn`` with dim 0 of each of ``args`` symbolic (example size ``hint`` >= 2, so the
    symbol is not specialized to 0 or 1), under the host-sync guard; (graph, fake inputs).
    Call with the recording lock held."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    if hint < 2:
        raise ValueError(f"hint={hint}: must be >= 2 (sizes 0 and 1 specialize)")
    check_cancelled(size)  # setting up symbols makes no torch call the guard would see
    mode = FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True)
    mode.cache_enabled = False  # its dispatch cache is process-wide: entries of each record stayed
    fakes = []
    for a in args:
        if a.dim() == 0:
            raise ValueError("a static input has no batch dimension")
        like = torch.empty_strided((hint, *a.shape[1:]), a.stride(), dtype=a.dtype, device=a.device)
        context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] + [DimDynamic.STATIC] * (a.dim() - 1))
        fakes.append(mode.from_tensor(like, symbolic_context=context))

    def traced(*static: Tensor) -> tuple[Tensor, ...]:
        with HostSyncGuard(size):
            return fn(*static)

    with mode:
        gm = make_fx(traced, tracing_mode="fake", _allow_non_fake_inputs=True)(*fakes)
    return gm, fakes


class SymbolicRoute:
    """The symbolic compile of one compile backend: its code (compiled here, in the compile
    process, or loaded from the store), why it failed, and the sizes it serves.

    ``failed`` set: every size compiles on its own (``cut_off``: a close cut the compile off,
    no failure of its own). ``compiles`` / ``compile_s``: the one compile; ``sizes``: the sizes
    its code replays (checked, or loaded from its entry)."""

    def __init__(self, enabled: bool, rows: int, ctx: CompileContext) -> None:
        self.enabled = enabled
        self._hint = max(2, rows)
        self._ctx = ctx
        self.code: SymbolicCode | None = None
        self.failed: str | None = None
        self.cut_off = False
        self._fetched = False  # the store was asked for the symbolic entry
        self.ledger = ModuleLedger()  # what loading its stored code left, for the first graph to release
        self.compiles = 0
        self.compile_s = 0.0
        self.sizes: list[int] = []

    @property
    def active(self) -> bool:
        """True when the sizes go this way (on, and inductor compiles as configured)."""
        return self.enabled and self._ctx.default_compile

    def compiles_ahead(self, sizes: int) -> int | None:
        """Compiles ``sizes`` captures still to run will take this way (1 until the code exists,
        then 0); None when the route is not taken (each size compiles)."""
        if self.active and (self.failed is None or self.cut_off):
            return 0 if self.code is not None else 1
        return None

    def load(self, size: int, args: tuple[Tensor, ...], io: StoredCodeIO) -> StoredGraph | None:
        """``size`` replayed by the stored symbolic code (fetched once per backend) when its entry
        holds that size's outputs; else None."""
        if not self._fetched and self.code is None and self.failed is None:
            self._fetched = True
            self.code = io.fetch_symbolic(args, self.ledger)
        code = self.code
        if code is None or shares_storage((*args, *code.constants)):
            return None
        graph = io.bind_symbolic(size, args, code)
        if graph is not None:
            self.sizes.append(size)
            self.ledger.release_with(graph)
        return graph

    def runner(self, fn: FlatStep, rec_args: tuple[Tensor, ...], args: tuple[Tensor, ...], gm: fx.GraphModule,
               size: int) -> tuple[CompiledRunner | None, str | None]:
        """(runner, None) replaying the one symbolic compile over ``args`` when it equals ``gm``
        (this size's recording) bitwise, else (None, why); records and compiles it on first use."""
        if self.code is None and self.failed is None:
            self._compile(fn, rec_args, size)
        if self.code is None:
            return None, self.failed
        compiled, constants = self.code.compiled, self.code.constants
        inputs = (*args, *constants)
        if shares_storage(inputs):
            return None, "two inputs of the symbolic graph share memory"
        reference, own = lift_constants(gm)
        try:
            with RECORD_LOCK, torch.no_grad():
                why = compare_on_worlds(reference, (*args, *own), compiled, inputs, len(args))
        except Exception as exc:  # noqa: BLE001  # e.g. a guard the symbolic graph assumed
            return None, f"symbolic replay failed at size {size}: {type(exc).__name__}: {exc}"
        if why is not None:
            return None, f"symbolic replay differs from the FX replay at size {size}: {why}"
        self.sizes.append(size)
        return CompiledRunner(compiled, inputs, constants, None, symbolic=True), None

    def save(self, io: StoredCodeIO, graph: TraceGraph) -> None:
        """Add ``graph``'s size to the stored symbolic entry (`StoredCodeIO.save_symbolic`)."""
        if self.code is not None:
            io.save_symbolic(graph, self.code)

    def _compile(self, fn: FlatStep, rec_args: tuple[Tensor, ...], size: int) -> None:
        """Record ``fn`` once with a symbolic batch dimension and compile that once (in the compile
        process when there is one: only the graph and its inputs' metadata travel, and this
        process loads the returned code); sets ``code``, or ``failed`` (every size then compiles
        on its own). `CompileWorkerDied` when the compile process died: this size serves eager as
        a per-size unit would, and later sizes compile per size."""
        use_cache_dir()
        start = time.perf_counter()
        try:
            with fx_work():
                sgm, fakes = record_symbolic(fn, rec_args, self._hint, size)
                lifted, constants = lift_constants(sgm)
                exact, _ = keep_aten_reductions(lifted)
        except Exception as exc:  # noqa: BLE001  # any failure: compile per size, as without it
            self._per_size_after("no symbolic recording", exc)
            return
        raw: bytes | None = None
        if self._ctx.compiler is not None:
            raw = self._compile_elsewhere(exact, rec_args, constants, size)
            if raw is None and self.failed is not None:
                return
        try:
            compiled, raw = self._load_or_compile(raw, exact, [*fakes, *constants])
        except CompileWorkerDied:  # closed while loading (`stop_if_closed`): a cut-off, no failure
            self.cut_off = True
            self.failed = "the compile process was closed during the symbolic compile"
            raise
        except Exception as exc:  # noqa: BLE001  # any failure: compile per size, as without it
            self._per_size_after("no symbolic compile", exc)
            return
        if self._ctx.storing and raw is None:  # not storable: per size stores what it can
            self.failed = "no symbolic code: inductor saved nothing for it"
            logger.info("compile backend: %s; compiling per size", self.failed)
            return
        self.code = SymbolicCode(compiled, constants, raw)
        self.compiles += 1
        self.compile_s = time.perf_counter() - start
        logger.info("compile backend: one symbolic compile in %.2f s%s", self.compile_s,
                    " (compile process)" if self._ctx.compiler is not None and raw is not None else "")

    def _compile_elsewhere(self, exact: fx.GraphModule, rec_args: tuple[Tensor, ...], constants: tuple[Tensor, ...],
                           size: int) -> bytes | None:
        """The symbolic code's bytes from the compile process; None when it failed there (``failed``
        set when no compile should follow). `CompileWorkerDied` when it died or was closed."""
        stand_ins = [torch.empty_strided((self._hint, *a.shape[1:]), a.stride(), dtype=a.dtype, device="meta")
                     for a in rec_args]
        self._ctx.compiles += 1
        try:  # no lock held: this process goes on serving
            return self._ctx.compiler.compile(exact, [*stand_ins, *constants], dynamic=len(rec_args))
        except CompileWorkerDied as exc:
            if self._ctx.compiler.closed:  # the engine is closing: nothing went wrong
                self.cut_off = True
                self.failed = "the compile process was closed during the symbolic compile"
                logger.info("compile backend: %s; size %d stays eager", self.failed, size)
                raise
            self.failed = f"the compile process died during the symbolic compile ({exc})"
            logger.warning("compile backend: %s; size %d serves eager, later sizes compile per size",
                           self.failed, size)
            raise
        except (RuntimeError, ValueError) as exc:  # the graph cannot travel, or inductor failed there
            if "not a saveable" in str(exc):  # nothing to compile (chain S=1): per size stores the graph
                self.failed = "no symbolic code: inductor saved nothing for it"
                logger.info("compile backend: %s; compiling per size", self.failed)
                return None
            logger.warning("compile process: no symbolic compile there (%s); compiling it in this process", exc)
            return None

    def _load_or_compile(self, raw: bytes | None, exact: fx.GraphModule, example: list[Tensor]
                         ) -> tuple[object, bytes | None]:
        """(the compiled code, its bytes): ``raw`` loaded, else compiled in this process."""
        compiled = None
        ctx = self._ctx
        with fx_work():
            if raw is not None:
                try:
                    with ctx.ledger.track():
                        compiled = load_artifact(raw)
                except Exception as exc:  # noqa: BLE001  # the in-process compile decides
                    ctx.stop_if_closed(exc)
                    logger.warning("compile process: the symbolic code does not load here (%s: %s); "
                                   "compiling it in this process", type(exc).__name__, exc)
                    raw = None
            if compiled is None:
                ctx.stop_if_closed(None)
                ctx.compiles += 1
                with ctx.ledger.track():
                    compiled = compile_symbolic(exact, example)
                try:  # nothing saveable: it is not stored
                    raw = artifact_bytes(compiled) if ctx.storing else None
                except Exception:  # noqa: BLE001
                    raw = None
        return compiled, raw

    def _per_size_after(self, what: str, exc: Exception) -> None:
        """The symbolic route failed (``what``, raising ``exc``): every size compiles on its own
        (a cancelled capture is no failure: it propagates)."""
        if isinstance(exc, CaptureCancelled):
            raise exc
        if cancel_requested():  # the process is exiting: inductor refuses new work, nothing failed
            raise CaptureCancelled(f"{what}: cancelled at exit") from exc
        self.failed = f"{what}: {type(exc).__name__}: {exc}"
        logger.warning("compile backend: %s; compiling per size", self.failed)
