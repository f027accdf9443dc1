"""One recorded size compiled on its own and checked bitwise against its FX replay.

The route when there is no symbolic code (``DRAFTGRAPH_COMPILE_SYMBOLIC=0``, a custom compile, or
the symbolic compile or its check failed for this size): the recorded graph, its constants lifted
to inputs, is compiled by inductor (in the compile process when there is one: only the graph and
its inputs' metadata travel, and this process loads the returned code) and replaces the FX
replay only when both agree bitwise on copies of the same inputs (`compare.compare_on_copies`).
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor, fx

from ..core.aten_reductions import keep_aten_reductions
from ..core.backend_trace import RECORD_LOCK
from .compare import compare_on_copies, copies, lift_constants, shares_storage
from .context import CompileContext
from .inductor import fx_work, inductor_artifact, inductor_compile, load_artifact, use_cache_dir
from .records import CompiledRunner
from .worker import CompileWorkerDied

__all__ = ["compile_per_size"]

logger = logging.getLogger(__name__)


def _compile_elsewhere(ctx: CompileContext, exact: fx.GraphModule, inputs: tuple[Tensor, ...], size: int
                       ) -> tuple[bytes | None, object]:
    """(artifact bytes, the loaded code) from the compile process, or (None, None) when it could
    not compile or its code does not run here (the in-process compile decides then)."""
    try:
        ctx.compiles += 1
        raw = ctx.compiler.compile(exact, inputs)  # no lock held: this process goes on serving
    except CompileWorkerDied:
        raise
    except (RuntimeError, ValueError) as exc:  # the graph cannot travel, or inductor failed there
        # a step with nothing to compile (chain S=1) has no saveable artifact: expected, and
        # cheap here (this process stores its recorded graph, see StoredCodeIO.save)
        log = logger.info if "not a saveable" in str(exc) else logger.warning
        log("compile process: size %d not compiled there (%s); compiling it in this process", size, exc)
        return None, None
    with fx_work(lock=False):
        try:
            with ctx.ledger.track():
                compiled = load_artifact(raw)
            compiled(*copies(inputs))  # a graph the pipe changed fails here: compile it here
        except Exception as exc:  # noqa: BLE001  # any failure: the in-process compile decides
            ctx.stop_if_closed(exc)
            logger.warning("compile process: size %d's code does not run here (%s: %s); "
                           "compiling it in this process", size, type(exc).__name__, exc)
            return None, None
    return raw, compiled


def compile_per_size(ctx: CompileContext, gm: fx.GraphModule, args: tuple[Tensor, ...], size: int
                     ) -> tuple[CompiledRunner | None, str | None]:
    """(runner, None) when the compiled graph equals the FX replay bitwise, else (None, why)."""
    lifted, constants = lift_constants(gm)
    inputs = (*args, *constants)
    if shares_storage(inputs):
        return None, "two inputs share memory"
    use_cache_dir()
    exact, _ = keep_aten_reductions(lifted)  # what inductor compiles; ``lifted`` is the reference
    raw, compiled = None, None
    if ctx.compiler is not None and ctx.default_compile:
        raw, compiled = _compile_elsewhere(ctx, exact, inputs, size)
    compile_fn = ctx.compile_fn or (inductor_artifact if ctx.storing else inductor_compile)
    if raw is None:
        ctx.stop_if_closed(None)
    with RECORD_LOCK, torch.no_grad():  # inductor records with make_fx too (AOT autograd)
        if raw is None:
            ctx.compiles += 1
            with fx_work(lock=False), ctx.ledger.track():  # the lock is held: only this compile's sources go
                compiled = compile_fn(exact, copies(inputs))
        why = compare_on_copies(lifted, compiled, inputs)
    if why is not None:
        return None, f"compiled replay differs from the FX replay at size {size}: {why}"
    return CompiledRunner(compiled, inputs, constants, raw), None
