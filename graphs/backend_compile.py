"""CPU ``compile`` backend: record exactly as ``trace`` does, replay an inductor-compiled graph.

Capture semantics are the trace backend's (same make_fx recording, same rejections of host
syncs and data-dependent shapes, same static outputs and node counts); only the replay
differs. Per captured size the recorded aten graph is compiled with inductor
(`torch._inductor.compile_fx.compile_fx`) directly, not through `torch.compile`: the graph is
already aten, so dynamo has nothing to trace, and calling the compiled function without
dynamo's guards and wrappers is what makes small steps fast (measured on the tiny step:
about 0.1 ms per replay against 0.35 ms through `torch.compile`, 1.2 ms eager).

Before the compiled function replaces the FX replay, both run once on separate copies of the
same inputs (static inputs and every captured constant, lifted to graph inputs) and must
agree bitwise: every output and every in-place write into an input. A mismatch or a compile
error keeps that size on the FX replay, with a warning naming the size and a counter
(`CompileBackend.fallbacks`); never a silent wrong result. The copies mean the check never
touches memory a serving step may be using.

Inductor's on-disk cache goes under ``$DRAFTGRAPH_CACHE/inductor`` (default
``~/.cache/draftgraph/inductor``) unless ``TORCHINDUCTOR_CACHE_DIR`` is set, so a second start
compiles from cache.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, fx

from .backend_trace import _RECORD_LOCK, TraceBackend, TraceGraph, _evict_fx_sources, _fx_source_keys
from .protocol import FlatStep

__all__ = ["CompileBackend", "compiler_available", "inductor_cache_dir", "prepare_background_compile"]

logger = logging.getLogger(__name__)

_USER_CACHE_DIR = os.environ.get("TORCHINDUCTOR_CACHE_DIR")  # as the user set it, before inductor runs


@lru_cache(maxsize=1)
def compiler_available() -> bool:
    """True when inductor can build CPU kernels here: a C++ compiler on PATH (``$CXX``, else
    g++, c++ or clang++) and an importable inductor."""
    candidates = [os.environ.get("CXX", "")] + ["g++", "c++", "clang++"]
    if not any(c and shutil.which(c) for c in candidates):
        return False
    try:  # look without importing: inductor takes seconds to import
        return importlib.util.find_spec("torch._inductor") is not None
    except (ImportError, ValueError):  # an unusual torch build: no inductor
        return False


def prepare_background_compile() -> None:
    """Call in the serving thread before compiling in another one.

    Inductor builds one helper graph with a plain `torch.fx.symbolic_trace` (cached for the
    process), and a plain fx trace patches `torch.nn.Module.__call__` for every thread while it
    runs: a module called by another thread in that window fails ("module is not installed as
    a submodule"; measured while serving beside a background compile). Built here, it is never
    traced again. make_fx's own tracer leaves other threads' module calls alone (measured: 700k
    calls beside 40 background traces)."""
    try:
        from torch._inductor.loop_body import InterpreterShim

        InterpreterShim._dummy_gm()  # noqa: SLF001  # torch's own warm-up hook (see above)
    except Exception as exc:  # another torch: nothing to prepare, or it cannot be
        logger.debug("compile backend: no inductor helper graph to prepare (%s)", exc)


def inductor_cache_dir() -> Path:
    """Where inductor keeps compiled kernels for draftgraph: ``$TORCHINDUCTOR_CACHE_DIR`` when the
    user set it, else ``$DRAFTGRAPH_CACHE/inductor`` (default ``~/.cache/draftgraph/inductor``)."""
    own = _USER_CACHE_DIR
    if own:
        return Path(own)
    base = os.environ.get("DRAFTGRAPH_CACHE")
    root = Path(base).expanduser() if base else Path.home() / ".cache" / "draftgraph"
    return root / "inductor"


def _use_cache_dir() -> None:
    """Point inductor at `inductor_cache_dir` (it reads the variable at each compile; inductor
    itself fills in a /tmp default once it runs, so the user's own setting is the one read when
    this module was imported)."""
    if _USER_CACHE_DIR is None:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(inductor_cache_dir())


def _lift_constants(gm: fx.GraphModule) -> tuple[fx.GraphModule, tuple[Tensor, ...]]:
    """A copy of ``gm`` whose captured tensors (get_attr nodes) are extra inputs after the
    static ones, and those tensors in order: the compiled function then reads them as
    arguments, so it can be checked on copies and run on the real ones."""
    graph = copy.deepcopy(gm.graph)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    anchor = placeholders[-1] if placeholders else None
    lifted: dict[str, fx.Node] = {}
    tensors: list[Tensor] = []
    for node in list(graph.nodes):
        if node.op != "get_attr":
            continue
        target = str(node.target)
        value = getattr(gm, target)
        if not isinstance(value, Tensor):
            raise TypeError(f"captured constant {target} is a {type(value).__name__}, not a tensor")
        if target not in lifted:
            if anchor is None:
                with graph.inserting_before(next(iter(graph.nodes))):
                    anchor = graph.placeholder(f"const_{len(tensors)}")
            else:
                with graph.inserting_after(anchor):
                    anchor = graph.placeholder(f"const_{len(tensors)}")
            lifted[target] = anchor
            tensors.append(value)
        node.replace_all_uses_with(lifted[target])
        graph.erase_node(node)
    graph.lint()
    lifted = fx.GraphModule(torch.nn.Module(), graph)
    _evict_fx_sources({lifted.forward.__code__.co_filename})  # runs without them; FX would keep them
    return lifted, tuple(tensors)


def _shares_storage(tensors: tuple[Tensor, ...]) -> bool:
    """True when two inputs share memory (the compiled function would assume they do not)."""
    seen: set[int] = set()
    for t in tensors:
        try:
            key = t.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):
            return True
        if key == 0 and t.numel() == 0:
            continue
        if key in seen:
            return True
        seen.add(key)
    return False


def _copies(tensors: tuple[Tensor, ...]) -> list[Tensor]:
    """Fresh copies with the same values, shapes and strides."""
    return [t.clone() for t in tensors]


def _first_difference(name: str, want: list[Tensor] | tuple[Tensor, ...], got: list[Tensor] | tuple[Tensor, ...]
                      ) -> str | None:
    """Where ``got`` differs from ``want`` bitwise (dtype, shape or a value); None when equal."""
    if len(want) != len(got):
        return f"{name}: {len(got)} tensors, expected {len(want)}"
    for i, (a, b) in enumerate(zip(want, got)):
        if not isinstance(b, Tensor) or a.dtype != b.dtype or a.shape != b.shape:
            kind = type(b).__name__ if not isinstance(b, Tensor) else f"{b.dtype} {tuple(b.shape)}"
            return f"{name} {i}: {kind}, expected {a.dtype} {tuple(a.shape)}"
        if not torch.equal(a, b) and not (a.is_floating_point() and torch.equal(a.isnan(), b.isnan())
                                          and torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))):
            return f"{name} {i}: values differ"
    return None


class CompileBackend(TraceBackend):
    """The trace recorder with an inductor-compiled replay per size, checked bitwise first.

    ``compile_fn(gm, example_inputs) -> callable`` is inductor's ``compile_fx`` by default (a
    parameter so a test can force a failure or a mismatch). ``fallbacks`` counts sizes that
    kept the FX replay; ``compile_s`` is the compile seconds per size.
    """

    name = "compile"

    def __init__(self, rows: int, compile_fn: Callable[..., Any] | None = None,
                 check_speed: bool = False) -> None:
        super().__init__(rows)
        self.replay_engine = "fx"  # the recorded graph; the compiled runner replaces it per size
        self._compile_fn = compile_fn
        self.check_speed = check_speed  # "auto": time the replay against eager, keep the faster
        self.fallbacks = 0
        self.compile_s: dict[int, float] = {}

    def capture(self, size: int, fn: FlatStep, args: tuple[Tensor, ...],
                trace_args: tuple[Tensor, ...] | None = None) -> TraceGraph:
        """Record as `TraceBackend.capture` does, then compile and check the replay."""
        graph = super().capture(size, fn, args, trace_args)
        gm = graph.module
        start = time.perf_counter()
        modules_before = {id(m) for m in _loaded_modules()}
        try:
            runner, reason = self._compiled_runner(gm, args, size)
        except Exception as exc:  # inductor raises many kinds; the FX replay stays correct
            runner, reason = None, f"compile failed: {type(exc).__name__}: {exc}"
        elapsed = time.perf_counter() - start
        # what this compile left in process-wide caches goes with the graph (measured without
        # this: +1 inductor module and ~20 KB RSS per reload, for the life of the process)
        mine = [m for m in _loaded_modules() if id(m) not in modules_before]
        graph.release_hooks.append(lambda: _forget_modules(mine))
        self.compile_s[size] = elapsed
        graph.compile_s = elapsed
        if runner is None:
            self.fallbacks += 1
            graph.fallback_reason = reason
            logger.warning("compile backend: size %d keeps the FX replay (%s)", size, reason)
        else:
            graph.use_runner(runner, "inductor")
            logger.debug("compile backend: size %d compiled in %.2f s", size, elapsed)
        if self.check_speed:
            self._time_against_eager(graph, fn, args if trace_args is None else trace_args)
        return graph

    def _time_against_eager(self, graph: TraceGraph, fn: FlatStep, eager_args: tuple[Tensor, ...]) -> None:
        """Median seconds of the replay (on copies of its inputs) and of the eager step (on
        ``eager_args``, stand-ins when capturing beside serving); ``graph.prefer_eager`` when
        the replay is not faster, so "auto" never serves a replay slower than eager."""
        lifted, constants = _lift_constants(graph.module)
        copies = _copies((*graph.inputs, *constants))
        compiled = graph.compiled
        with torch.no_grad():
            replay = (lambda: compiled(*copies)) if compiled is not None else (lambda: lifted(*copies))
            graph.replay_s = _median_seconds(replay)
            graph.eager_s = _median_seconds(lambda: fn(*eager_args))
        graph.prefer_eager = graph.replay_s >= graph.eager_s
        if graph.prefer_eager:
            logger.info("compile backend: size %d serves eager (replay %.0f us >= eager %.0f us)",
                        graph.size, graph.replay_s * 1e6, graph.eager_s * 1e6)

    def _compiled_runner(self, gm: fx.GraphModule, args: tuple[Tensor, ...], size: int
                         ) -> tuple[Callable[..., Any] | None, str | None]:
        """(runner, None) when the compiled graph equals the FX replay bitwise, else (None, why)."""
        lifted, constants = _lift_constants(gm)
        inputs = (*args, *constants)
        if _shares_storage(inputs):
            return None, "two inputs share memory"
        _use_cache_dir()
        compile_fn = self._compile_fn or _inductor_compile
        with _RECORD_LOCK, torch.no_grad():  # inductor records with make_fx too (AOT autograd)
            before = _fx_source_keys()
            try:
                compiled = compile_fn(lifted, _copies(inputs))
            finally:  # FX never frees generated sources: drop those of this compile's graphs
                _evict_fx_sources(_fx_source_keys() - before)
            want_in = _copies(inputs)
            got_in = _copies(inputs)
            want = lifted(*want_in)
            got = compiled(*got_in)
        if isinstance(got, Tensor):
            got = (got,)
        why = _first_difference("output", tuple(want), tuple(got)) or _first_difference(
            "input after the step", want_in, got_in)
        if why is not None:
            return None, f"compiled replay differs from the FX replay at size {size}: {why}"

        def run(*_: Tensor) -> Any:
            with torch.no_grad():
                return compiled(*inputs)

        run.compiled = compiled  # type: ignore[attr-defined]
        return run, None


def _loaded_modules() -> list[Any]:
    """Inductor's list of every generated module it loaded (kept only to purge the disk cache)."""
    try:
        from torch._inductor.codecache import PyCodeCache
    except ImportError:
        return []
    return list(getattr(PyCodeCache, "modules", []))


def _forget_modules(modules: list[Any]) -> None:
    """Drop a released graph's generated modules from inductor's list and ``sys.modules`` (by
    identity; the compiled function keeps what it runs alive until it is gone)."""
    if not modules:
        return
    from torch._inductor.codecache import PyCodeCache

    ids = {id(m) for m in modules}
    kept = getattr(PyCodeCache, "modules", None)
    if isinstance(kept, list):
        kept[:] = [m for m in kept if id(m) not in ids]
    for m in modules:  # loaded under a name of its own each time, and registered there
        name = getattr(m, "__name__", None)
        if name is not None and sys.modules.get(name) is m:
            del sys.modules[name]


def _median_seconds(fn: Callable[[], Any], runs: int = 7) -> float:
    """Median wall seconds of ``fn`` over ``runs`` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def _inductor_compile(gm: fx.GraphModule, example_inputs: list[Tensor]) -> Callable[..., Any]:
    """Inductor's compile of an aten graph (no dynamo: the graph is already traced)."""
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(gm, example_inputs)
