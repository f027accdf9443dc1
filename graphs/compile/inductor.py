"""Inductor, as the compile backend and the compile process use it: compile, artifact, load, ledger.

One module both the backend (`compile.backend`, in the serving process) and the compile process
(`compile.worker`, a child that imports only this and what it needs) call, so neither imports
the other. Every name here is public:

- `compiler_available`, `inductor_cache_dir`, `use_cache_dir`: can inductor build CPU kernels
  here, and where its on-disk cache goes (``$DRAFTGRAPH_CACHE/inductor`` unless the user set
  ``TORCHINDUCTOR_CACHE_DIR``), so a second start compiles from cache;
- `inductor_compile` (``compile_fx``: an aten graph, no dynamo), `inductor_artifact`
  (``standalone_compile`` specialized on the example shapes: saveable), `compile_symbolic`
  (one compile with a symbolic batch dimension);
- `artifact_bytes` / `load_artifact`: a compiled artifact to bytes and back, in memory;
- `ModuleLedger` and `forget_modules`: the generated modules each load or compile registered
  (inductor keeps every one for the life of the process), released with the graph that holds them;
- `fx_work`: the scope of one recording, compile or load (recording lock, no autograd, FX's
  generated sources evicted on the way out);
- `prepare_background_compile`: the warm-up a serving thread runs before another thread compiles.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shutil
import sys
import threading
from collections.abc import Callable, Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, fx

from ..core.aten_reductions import register_inductor_lowerings
from ..core.backend_trace import RECORD_LOCK, evict_fx_sources, fx_source_keys
from ..core.settings import cache_root
from .entry import EntryError

__all__ = ["ModuleLedger", "artifact_bytes", "compile_symbolic", "compiler_available", "forget_modules",
           "fx_work", "inductor_artifact", "inductor_cache_dir", "inductor_compile", "load_artifact",
           "prepare_background_compile", "use_cache_dir"]

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
    return cache_root(expand=True) / "inductor"


def use_cache_dir() -> None:
    """Point inductor at `inductor_cache_dir` (it reads the variable at each compile; inductor
    itself fills in a /tmp default once it runs, so the user's own setting is the one read when
    this module was imported)."""
    if _USER_CACHE_DIR is None:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(inductor_cache_dir())


@contextlib.contextmanager
def fx_work(lock: bool = True) -> Iterator[None]:
    """The scope of one recording, compile or load of compiled code: the recording lock
    (``lock``: make_fx's globals, see `backend_trace`; inductor records with make_fx too), no
    autograd, and the FX sources generated inside evicted on the way out, raised or not (FX never
    frees them: measured without this, a few KB per graph and reload, for the life of the process)."""
    with RECORD_LOCK if lock else contextlib.nullcontext(), torch.no_grad():
        before = fx_source_keys()
        try:
            yield
        finally:
            evict_fx_sources(fx_source_keys() - before)


def inductor_compile(gm: fx.GraphModule, example_inputs: list[Tensor]) -> Callable[..., Any]:
    """Inductor's compile of an aten graph (no dynamo: the graph is already traced)."""
    from torch._inductor.compile_fx import compile_fx

    register_inductor_lowerings()
    return compile_fx(gm, example_inputs)


def inductor_artifact(gm: fx.GraphModule, example_inputs: list[Tensor]) -> Callable[..., Any]:
    """`inductor_compile` as an artifact that can be saved (with a store): ``standalone_compile``
    specialized on the example shapes
    (measured on the S=3 draft step at b=8: 2.6 s warm against 2.2-4.3 s for ``compile_fx``, the
    same 0.80 ms per replay)."""
    from torch._inductor import standalone_compile

    register_inductor_lowerings()
    return standalone_compile(gm, example_inputs, dynamic_shapes="from_example_inputs")


def compile_symbolic(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Inductor's one compile of a symbolic graph (fake inputs, then real constants)."""
    from torch._inductor import standalone_compile

    register_inductor_lowerings()
    return standalone_compile(gm, example_inputs, dynamic_shapes="from_graph")


def artifact_bytes(artifact: Any) -> bytes:
    """The bytes ``CompiledArtifact.save(format="binary")`` would write (ValueError when the
    artifact holds nothing saveable)."""
    saveable = getattr(artifact, "is_saveable", None)
    if saveable is None or not saveable():
        raise ValueError(f"{type(artifact).__name__} is not a saveable inductor artifact")
    raw = artifact._to_binary_bytes()  # noqa: SLF001  # torch's own serializer, without a temp file
    with contextlib.suppress(AttributeError):  # stored now: the live artifact need not keep a copy
        artifact._artifacts = None  # noqa: SLF001  # torch's field holding those bytes
    return raw


def load_artifact(raw: bytes) -> Callable[..., Any]:
    """A callable from `artifact_bytes` output, loaded in memory (what
    ``CompiledArtifact.load(format="binary")`` does from a file; the torch build key is checked)."""
    from torch._inductor.codecache import torch_key
    from torch._inductor.standalone_compile import CacheCompiledArtifact
    from torch.utils._appending_byte_serializer import BytesReader

    reader = BytesReader(raw)
    if reader.read_bytes() != CacheCompiledArtifact.CACHE_HEADER:
        raise EntryError("artifact header is not an inductor cache artifact")
    if reader.read_bytes() != torch_key():
        raise EntryError("artifact was built by another torch (build key differs)")
    key = reader.read_str()
    body = reader.read_bytes()
    if not reader.is_finished():
        raise EntryError("artifact has trailing bytes")
    torch.compiler.load_cache_artifacts(body)
    return CacheCompiledArtifact._load_impl(contextlib.nullcontext(), key)  # noqa: SLF001  # its binary loader


# Loads and in-process compiles take turns on this lock, so that the modules inductor registers
# during one are told apart from another capture thread's (`ModuleLedger.track`).
_MODULES_LOCK = threading.RLock()


def _loaded_modules() -> list[Any]:
    """Inductor's list of every generated module it loaded (kept only to purge the disk cache)."""
    try:
        from torch._inductor.codecache import PyCodeCache
    except ImportError:
        return []
    return list(getattr(PyCodeCache, "modules", []))


def forget_modules(modules: list[Any]) -> None:
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


class ModuleLedger:
    """The generated modules inductor registered during one backend's loads and compiles, until
    the graph that holds them takes them (`take`; released with it by `forget_modules`)."""

    def __init__(self) -> None:
        self._modules: list[Any] = []

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        """Run the body (an inductor load or compile) alone among loads, and note the modules it
        registered."""
        with _MODULES_LOCK:
            before = {id(m) for m in _loaded_modules()}
            try:
                yield
            finally:
                self._modules.extend(m for m in _loaded_modules() if id(m) not in before)

    def take(self) -> list[Any]:
        """The modules noted since the last call (the caller's graph releases them)."""
        mine, self._modules = self._modules, []
        return mine

    def release_with(self, graph: Any) -> None:
        """Hand every noted module to ``graph``: its release forgets them."""
        mine = self.take()
        graph.release_hooks.append(lambda: forget_modules(mine))
