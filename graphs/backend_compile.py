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
touches memory a serving step may be using. Sums, means and softmax are compiled as calls to
ATen's own kernels (`aten_reductions`): inductor's loops sum in another order, so a graph with
them failed this check on real data (the float64 verify forward kept its FX replay).

Inductor's on-disk cache goes under ``$DRAFTGRAPH_CACHE/inductor`` (default
``~/.cache/draftgraph/inductor``) unless ``TORCHINDUCTOR_CACHE_DIR`` is set, so a second start
compiles from cache.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import logging
import os
import pickle
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, fx

from .aten_reductions import REWRITE_TAG, keep_aten_reductions, register_inductor_lowerings
from .backend_trace import _RECORD_LOCK, TraceBackend, TraceGraph, _evict_fx_sources, _fx_source_keys
from .cancel import CaptureCancelled, cancel_requested
from .compile_symbolic import compile_symbolic, isolated_world, record_symbolic, symbolic_default, worlds_differ
from .compile_worker import CompileWorker, CompileWorkerDied
from .compiled_entry import (
    CompiledStore,
    ConstantTable,
    EntryError,
    StoredGraph,
    check_request,
    check_tensors,
    describe_request,
    describe_tensors,
    entry_key,
    pack_entry,
    unpack_entry,
)
from .errors import GraphCaptureError
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


@contextlib.contextmanager
def _fx_work(lock: bool = True) -> Iterator[None]:
    """The scope of one recording, compile or load of compiled code: the recording lock
    (``lock``: make_fx's globals, see `backend_trace`; inductor records with make_fx too), no
    autograd, and the FX sources generated inside evicted on the way out, raised or not (FX never
    frees them: measured without this, a few KB per graph and reload, for the life of the process)."""
    with _RECORD_LOCK if lock else contextlib.nullcontext(), torch.no_grad():
        before = _fx_source_keys()
        try:
            yield
        finally:
            _evict_fx_sources(_fx_source_keys() - before)


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

    ``compile_fn(gm, example_inputs) -> callable`` is inductor's ``standalone_compile`` by
    default (a parameter so a test can force a failure or a mismatch; a custom one is never
    stored). ``fallbacks`` counts sizes that kept the FX replay; ``compile_s`` is the compile
    seconds per size.

    With a ``store`` (`CompiledStore`), a ``constants`` table (name -> every tensor the step may
    read: see `compiled_entry`) and a ``structure`` string (what the step is), each compiled
    size is written to the store and `load` (tried first by `capture`) replays stored code
    without recording or compiling; ``loaded`` / ``shared`` / ``stored`` count them. With a
    ``compiler`` (`CompileWorker`) inductor runs in that process: this one records, loads the
    returned code and checks it; a compile process that dies fails the size
    (`GraphCaptureError`: it serves eager, counted) instead of falling back to the FX replay.

    ``symbolic`` (default: ``DRAFTGRAPH_COMPILE_SYMBOLIC``, "1" unless set to "0";
    `compile_symbolic`): the first captured size also records the step once with a symbolic
    batch dimension and compiles that once (in the ``compiler`` process when there is one);
    every size then replays that one function, checked bitwise against its own recording (a
    size that fails the check, or every size when the symbolic recording or compile fails,
    compiles per size as without it; a compile process that dies then fails that size as
    above). With a store the symbolic code is one entry (`entry_key` without the size) whose
    manifest holds each checked size's outputs: `load` replays those sizes from it with no
    recording and no compile. ``symbolic_compiles`` / ``symbolic_sizes`` count them.
    """

    name = "compile"

    def __init__(self, rows: int, compile_fn: Callable[..., Any] | None = None,
                 check_speed: bool = False, store: CompiledStore | None = None,
                 constants: Mapping[str, Tensor] | None = None, structure: str | None = None,
                 compiler: CompileWorker | None = None, symbolic: bool | None = None) -> None:
        super().__init__(rows)
        self.symbolic = symbolic_default() if symbolic is None else bool(symbolic)
        self._symbolic: tuple[Any, tuple[Tensor, ...]] | None = None  # (compiled, its constants)
        self._symbolic_failed: str | None = None
        self._symbolic_raw: bytes | None = None  # its artifact bytes (None: not saveable)
        self._symbolic_manifest: dict[str, Any] | None = None  # its stored entry's manifest
        self._symbolic_fetched = False  # the store was asked for the symbolic entry
        self._symbolic_cut_off = False  # a close cut the symbolic compile off (not its failure)
        self._symbolic_source = "loaded"  # or "shared": this process stored the symbolic entry it loaded
        self._symbolic_modules: list[Any] = []  # inductor modules its load left, for the next graph's release
        self._unit_modules: list[Any] = []  # inductor modules the unit in progress loaded (`_new_modules`)
        self.symbolic_compiles = 0
        self.compiles = 0  # compiles run (symbolic and per size, here or in the compile process)
        self.symbolic_compile_s = 0.0
        self.symbolic_sizes: list[int] = []
        self.replay_engine = "fx"  # the recorded graph; the compiled runner replaces it per size
        self._compile_fn = compile_fn
        self.check_speed = check_speed  # "auto": time the replay against eager, keep the faster
        self.fallbacks = 0
        self.compile_s: dict[int, float] = {}
        usable = store is not None and constants is not None and bool(structure)
        self._store = store if usable else None
        self._table = ConstantTable(constants) if usable and constants is not None else None
        self._structure = structure or ""
        self._compiler = compiler  # compile in that process, off this one's interpreter lock
        self.loaded = 0
        self.shared = 0
        self.stored = 0

    def compiles_ahead(self, sizes: int) -> int:
        """How many of ``sizes`` captures still to run will compile: with the one symbolic compile
        (``symbolic``, no custom ``compile_fn``) 1 until it ran or was loaded from the store, then 0
        (each size only records and checks against it; one that fails the check compiles on its
        own, not foreseen here); per size, or once the symbolic compile failed, ``sizes`` (one
        cut off by a close still counts as the 1 it would have been)."""
        if sizes <= 0:
            return 0
        if self.symbolic and self._compile_fn is None and (self._symbolic_failed is None or self._symbolic_cut_off):
            return 0 if self._symbolic is not None else 1
        return sizes

    # ---- stored code -------------------------------------------------------------------------
    def _key(self, size: int, args: tuple[Tensor, ...]) -> str:
        assert self._table is not None  # noqa: S101  # callers check; a typing aid only
        return entry_key(self._structure, size, args, self._table, f"{self.name}+{REWRITE_TAG}")

    def load(self, size: int, fn: FlatStep, args: tuple[Tensor, ...],
             trace_args: tuple[Tensor, ...] | None = None) -> StoredGraph | None:
        """The stored compiled code of ``size`` over ``args`` (no recording, no compile), or None
        when there is no store or no entry; an unusable entry is refused through the store
        (named, removed) and None returned, so the caller records and compiles again."""
        store, table = self._store, self._table
        if store is None or table is None:
            return None
        if self.symbolic and self._compile_fn is None:
            shared = self._load_symbolic(size, args)
            if shared is not None:
                if self.check_speed and shared.replay_s is None:
                    self._time_against_eager(shared, fn, args if trace_args is None else trace_args)
                return shared
        key = self._key(size, args)
        payload = store.get(key)
        if payload is None:
            return None
        start = time.perf_counter()
        try:
            graph = self._rebuild(key, size, payload, args, table)
        except Exception as exc:  # a damaged or foreign entry, or torch cannot load it: rebuild it
            store.refuse(key, f"{type(exc).__name__}: {exc}")
            return None
        mine = self._take_unit_modules()
        graph.release_hooks.append(lambda: _forget_modules(mine))
        if store.written_here(key):
            graph.source = "shared"
            self.shared += 1
        else:
            self.loaded += 1
        if self.check_speed and graph.replay_s is None:
            self._time_against_eager(graph, fn, args if trace_args is None else trace_args)
        logger.debug("compile backend: size %d %s from the store in %.3f s", size, graph.source,
                     time.perf_counter() - start)
        return graph

    def _symbolic_key(self, args: tuple[Tensor, ...]) -> str:
        assert self._table is not None  # noqa: S101  # callers check; a typing aid only
        return entry_key(self._structure, None, args, self._table, f"{self.name}+{REWRITE_TAG}")

    def _fetch_symbolic(self, args: tuple[Tensor, ...]) -> None:
        """Load the stored symbolic code once (no recording, no compile): sets ``_symbolic`` and its
        manifest; an unusable entry is refused through the store (named, removed)."""
        store, table = self._store, self._table
        if store is None or table is None:
            return
        key = self._symbolic_key(args)
        payload = store.get(key)
        if payload is None:
            return
        modules: list[Any] = []
        try:
            manifest, artifact = unpack_entry(payload)
            check_request(manifest, key, describe_request(self._structure, None, args))
            if manifest.get("symbolic") is not True or manifest.get("inputs") != len(args) \
                    or not isinstance(manifest.get("sizes"), dict):
                raise EntryError(f"not a symbolic entry over {len(args)} inputs")
            constants = tuple(table.view(w) for w in manifest["constants"])
            check_tensors(manifest.get("constants_described"), constants, "constant")
            _use_cache_dir()
            with _fx_work(lock=False):
                with _new_modules(modules):
                    compiled = _load_artifact(artifact)
        except Exception as exc:  # a damaged or foreign entry, or torch cannot load it: compile again
            store.refuse(key, f"{type(exc).__name__}: {exc}")
            return
        self._symbolic = (compiled, constants)
        self._symbolic_raw = artifact
        self._symbolic_manifest = manifest
        self._symbolic_source = "shared" if store.written_here(key) else "loaded"
        self._symbolic_modules = modules
        logger.debug("compile backend: symbolic code from the store (%d sizes)", len(manifest["sizes"]))

    def _take_unit_modules(self) -> list[Any]:
        """The inductor modules this backend's loads and compiles left since the last call (the
        graph of the unit that loaded them releases them)."""
        mine, self._unit_modules = self._unit_modules, []
        return mine

    def _take_symbolic_modules(self) -> list[Any]:
        """The inductor modules loading the symbolic code left, once (the first graph releases them)."""
        mine, self._symbolic_modules = self._symbolic_modules, []
        return mine

    def _load_symbolic(self, size: int, args: tuple[Tensor, ...]) -> StoredGraph | None:
        """``size`` replayed by the stored symbolic code (loaded once per backend) when its entry
        holds that size's outputs (the size passed the bitwise check when it was stored); else None."""
        table = self._table
        if table is None:
            return None
        if not self._symbolic_fetched and self._symbolic is None and self._symbolic_failed is None:
            self._symbolic_fetched = True
            self._fetch_symbolic(args)
        described = (self._symbolic_manifest or {}).get("sizes", {}).get(str(size))
        if described is None or self._symbolic is None:
            return None
        compiled, constants = self._symbolic
        if _shares_storage((*args, *constants)):
            return None
        try:
            outputs, fresh, nbytes = self._bind_outputs(size, described["outputs"], args, table)
            check_tensors(described.get("outputs_described"), outputs, "output")
        except (EntryError, KeyError, TypeError, ValueError) as exc:
            logger.warning("compile backend: size %d does not fit the stored symbolic code (%s); recording it",
                           size, exc)
            return None

        graph = StoredGraph(size, _without_grad(compiled), (*args, *constants), tuple(outputs), tuple(fresh),
                            described.get("nodes"), nbytes, "inductor")
        graph.source = self._symbolic_source
        if graph.source == "shared":
            self.shared += 1
        else:
            self.loaded += 1
        self.symbolic_sizes.append(size)
        mine = self._take_symbolic_modules()
        graph.release_hooks.append(lambda: _forget_modules(mine))
        if self.check_speed and described.get("prefer_eager") is not None:  # timed when it was stored
            graph.replay_s, graph.eager_s = described.get("replay_s"), described.get("eager_s")
            graph.prefer_eager = bool(described["prefer_eager"])
        return graph

    def _save_symbolic(self, graph: TraceGraph, constants: tuple[Tensor, ...]) -> None:
        """Add ``graph``'s size (checked bitwise against the symbolic code) to the stored symbolic
        entry: one artifact, each size's outputs in its manifest (skipped, logged, as `_save`)."""
        store, table = self._store, self._table
        if store is None or table is None or self._compile_fn is not None or self._symbolic_raw is None:
            return
        outputs = self._describe_outputs(graph, table)
        where = [table.locate(c) for c in constants]
        if outputs is None or any(w is None for w in where):
            logger.debug("compile backend: size %d not in the symbolic entry: a tensor is not in the constant table",
                         graph.size)
            return
        key = self._symbolic_key(graph.inputs)
        manifest = self._symbolic_manifest or {
            "symbolic": True, "code": "inductor", "inputs": len(graph.inputs), "constants": where,
            "torch": torch.__version__, "sizes": {}, "key": key,
            "request": describe_request(self._structure, None, graph.inputs),
            "constants_described": describe_tensors(constants, "constant")}
        manifest["sizes"][str(graph.size)] = {
            "outputs": outputs, "nodes": graph.nodes, "replay_s": graph.replay_s, "eager_s": graph.eager_s,
            "prefer_eager": graph.prefer_eager if graph.replay_s is not None else None,
            "outputs_described": describe_tensors(graph.outputs, [o["kind"] for o in outputs])}
        store.put(key, pack_entry(manifest, self._symbolic_raw))
        self._symbolic_manifest = manifest
        self.stored += 1

    def _rebuild(self, key: str, size: int, payload: bytes, args: tuple[Tensor, ...], table: ConstantTable
                 ) -> StoredGraph:
        """A `StoredGraph` over the live ``args`` and named constants; EntryError when the entry was
        made for another key or structure (checked before its code is loaded) or does not fit."""
        manifest, artifact = unpack_entry(payload)
        check_request(manifest, key, describe_request(self._structure, size, args))
        if manifest.get("size") != size or len(manifest.get("inputs", ())) != len(args):
            raise EntryError(f"entry for size {manifest.get('size')!r} with {len(manifest.get('inputs', ()))} "
                             f"inputs; wanted size {size} with {len(args)}")
        constants = tuple(table.view(w) for w in manifest["constants"])
        check_tensors(manifest.get("constants_described"), constants, "constant")
        outputs, fresh, nbytes = self._bind_outputs(size, manifest["outputs"], args, table)
        check_tensors(manifest.get("outputs_described"), outputs, "output")
        _use_cache_dir()
        engine = manifest.get("code", "inductor")
        with _fx_work(lock=False):
            if engine == "fx":  # the recorded graph itself (inductor had nothing it could save)
                compiled = pickle.loads(artifact)  # noqa: S301  # digest-checked, from our private store
                if not isinstance(compiled, fx.GraphModule):
                    raise EntryError(f"fx entry holds a {type(compiled).__name__}, not a GraphModule")
            elif engine == "inductor":
                with _new_modules(self._unit_modules):
                    compiled = _load_artifact(artifact)
            else:
                raise EntryError(f"unknown code kind {engine!r}")

        graph = StoredGraph(size, _without_grad(compiled), (*args, *constants), tuple(outputs), tuple(fresh),
                            manifest.get("nodes"), nbytes, engine)
        if self.check_speed and manifest.get("prefer_eager") is not None:  # timed when it was stored
            graph.replay_s, graph.eager_s = manifest.get("replay_s"), manifest.get("eager_s")
            graph.prefer_eager = bool(manifest["prefer_eager"])
        return graph

    def _bind_outputs(self, size: int, described: list[dict[str, Any]], args: tuple[Tensor, ...],
                      table: ConstantTable) -> tuple[list[Tensor], list[int], int]:
        """The outputs a manifest describes, over the live ``args`` and constants: (outputs,
        indices of fresh ones, bytes of new output buffers); EntryError when one does not fit."""
        outputs: list[Tensor] = []
        fresh: list[int] = []
        nbytes = 0
        for i, out in enumerate(described):
            kind = out.get("kind")
            if kind == "fresh":
                buffer, new = self.buffer_for(i, tuple(out["tail"]), _dtype(out["dtype"]), args[0].device)
                nbytes += new
                outputs.append(buffer[:size])
                fresh.append(i)
            elif kind == "input":
                j = int(out["input"])
                if not 0 <= j < len(args):
                    raise EntryError(f"output {i}: input {j} of {len(args)}")
                offset = args[j].storage_offset() + int(out["offset"])
                outputs.append(args[j].as_strided(out["shape"], out["stride"], offset))
            elif kind == "constant":
                outputs.append(table.view(out))
            else:
                raise EntryError(f"output {i}: unknown kind {kind!r}")
        return outputs, fresh, nbytes

    def _describe_outputs(self, graph: TraceGraph, table: ConstantTable) -> list[dict[str, Any]] | None:
        """Where each of ``graph``'s outputs lives, as `_bind_outputs` reads it (None, logged, when
        one is neither fresh, nor a view of an input, nor in the constant table)."""
        inputs = graph.inputs
        fresh = set(graph.fresh)
        outputs: list[dict[str, Any]] = []
        for i, out in enumerate(graph.outputs):
            if i in fresh:
                outputs.append({"kind": "fresh", "tail": list(out.shape[1:]), "dtype": str(out.dtype)})
                continue
            ptr = out.untyped_storage().data_ptr()
            j = next((j for j, a in enumerate(inputs) if a.untyped_storage().data_ptr() == ptr), None)
            if j is not None:
                offset = out.storage_offset() - inputs[j].storage_offset()
                outputs.append({"kind": "input", "input": j, "offset": offset, "shape": list(out.shape),
                                "stride": list(out.stride())})
                continue
            located = table.locate(out)
            if located is None:
                logger.debug("compile backend: size %d not stored: output %d is not in the constant table",
                              graph.size, i)
                return None
            outputs.append({"kind": "constant", **located})
        return outputs

    def _save(self, graph: TraceGraph, artifact: Any, constants: tuple[Tensor, ...], raw: bytes | None) -> None:
        """Write ``graph``'s compiled code and manifest to the store (skipped, logged, when a
        constant or an output is not in the constant table or the artifact cannot be saved)."""
        store, table = self._store, self._table
        if store is None or table is None or self._compile_fn is not None:
            return
        where = [table.locate(c) for c in constants]
        if any(w is None for w in where):
            logger.debug("compile backend: size %d not stored: a constant is not in the constant table", graph.size)
            return
        inputs = graph.inputs
        outputs = self._describe_outputs(graph, table)
        if outputs is None:
            return
        code = "inductor"
        try:
            raw = raw if raw is not None else _artifact_bytes(artifact)
        except Exception as exc:  # inductor saved nothing (a step with nothing to compile): store the graph
            logger.debug("compile backend: size %d stores its recorded graph (%s)", graph.size, exc)
            raw, code = pickle.dumps(_lift_constants(graph.module)[0]), "fx"
        key = self._key(graph.size, inputs)
        manifest = {"size": graph.size, "code": code, "inputs": [list(a.shape) for a in inputs], "constants": where,
                    "outputs": outputs, "nodes": graph.nodes, "torch": torch.__version__,
                    "prefer_eager": graph.prefer_eager if graph.replay_s is not None and code == "inductor" else None,
                    "replay_s": graph.replay_s, "eager_s": graph.eager_s, "key": key,
                    "request": describe_request(self._structure, graph.size, inputs),
                    "constants_described": describe_tensors(constants, "constant"),
                    "outputs_described": describe_tensors(graph.outputs, [o["kind"] for o in outputs])}
        store.put(key, pack_entry(manifest, raw))
        self.stored += 1

    # ---- recording and compiling -------------------------------------------------------------
    def capture(self, size: int, fn: FlatStep, args: tuple[Tensor, ...],
                trace_args: tuple[Tensor, ...] | None = None) -> TraceGraph | StoredGraph:
        """Load ``size``'s stored code (`load`); else record as `TraceBackend.capture` does, then
        compile and check the replay (and store it)."""
        stored = self.load(size, fn, args, trace_args)
        if stored is not None:
            return stored
        unit_start = time.perf_counter()
        graph = super().capture(size, fn, args, trace_args)
        gm = graph.module
        start = time.perf_counter()
        compiles_before = self.compiles
        runner = None
        try:
            if self.symbolic and self._compile_fn is None:
                runner, why = self._symbolic_runner(fn, args if trace_args is None else trace_args, args, gm, size)
                if runner is None:
                    logger.info("compile backend: size %d compiles on its own (%s)", size, why)
            if runner is None:
                runner, reason = self._compiled_runner(gm, args, size)
            else:
                reason = None
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
        elapsed = time.perf_counter() - start
        # what this compile left in process-wide caches goes with the graph (measured without
        # this: +1 inductor module and ~20 KB RSS per reload, for the life of the process)
        mine = self._take_unit_modules() + self._take_symbolic_modules()
        graph.release_hooks.append(lambda: _forget_modules(mine))
        self.compile_s[size] = elapsed
        graph.compile_s = elapsed
        graph.compiles = self.compiles - compiles_before
        if runner is None:
            self.fallbacks += 1
            graph.fallback_reason = reason
            logger.warning("compile backend: size %d keeps the FX replay (%s)", size, reason)
        else:
            graph.use_runner(runner, "inductor")
            logger.debug("compile backend: size %d compiled in %.2f s", size, elapsed)
        if self.check_speed:
            self._time_against_eager(graph, fn, args if trace_args is None else trace_args)
        if runner is not None:
            if getattr(runner, "symbolic", False):
                self._save_symbolic(graph, runner.constants)
            else:
                self._save(graph, runner.compiled, runner.constants, runner.raw)
            if self._store is not None and self._compile_fn is None:
                self._store.note_unit_seconds(time.perf_counter() - unit_start, compiled=graph.compiles > 0)
        return graph

    def _time_against_eager(self, graph: TraceGraph | StoredGraph, fn: FlatStep, eager_args: tuple[Tensor, ...]
                            ) -> None:
        """Median seconds of the replay (on copies of its inputs) and of the eager step (on
        ``eager_args``, stand-ins when capturing beside serving); ``graph.prefer_eager`` when
        the replay is not faster, so "auto" never serves a replay slower than eager."""
        compiled = graph.compiled
        if isinstance(graph, StoredGraph):
            copies = _copies(graph.inputs)
            replay = lambda: compiled(*copies)  # noqa: E731
        elif compiled is not None:
            if graph.runner_constants is not None:  # a symbolic runner reads its own constants
                copies = isolated_world((*graph.inputs, *graph.runner_constants))[0]
            else:
                copies = _copies((*graph.inputs, *_lift_constants(graph.module)[1]))
            replay = lambda: compiled(*copies)  # noqa: E731
        else:
            lifted, constants = _lift_constants(graph.module)
            copies = _copies((*graph.inputs, *constants))
            replay = lambda: lifted(*copies)  # noqa: E731
        with torch.no_grad():
            graph.replay_s, graph.eager_s, ratio = _paired_seconds(replay, lambda: fn(*eager_args))
        graph.prefer_eager = ratio >= 1.0
        if graph.prefer_eager:
            logger.info("compile backend: size %d serves eager (replay %.0f us >= eager %.0f us)",
                        graph.size, graph.replay_s * 1e6, graph.eager_s * 1e6)

    def _symbolic_compile(self, fn: FlatStep, rec_args: tuple[Tensor, ...], size: int) -> None:
        """Record ``fn`` once with a symbolic batch dimension and compile that once (in the compile
        process when there is one: only the graph and its inputs' metadata travel, and this
        process loads the returned code); sets ``_symbolic``, or ``_symbolic_failed`` (every size
        then compiles on its own). `CompileWorkerDied` when the compile process died: this
        size serves eager as a per-size unit would, and later sizes compile per size."""
        _use_cache_dir()
        start = time.perf_counter()
        hint = max(2, self._rows)
        try:
            with _fx_work():
                sgm, fakes = record_symbolic(fn, rec_args, hint, size)
                lifted, constants = _lift_constants(sgm)
                exact, _ = keep_aten_reductions(lifted)
        except Exception as exc:  # noqa: BLE001  # any failure: compile per size, as without it
            self._per_size_after("no symbolic recording", exc)
            return
        raw: bytes | None = None
        if self._compiler is not None:
            stand_ins = [torch.empty_strided((hint, *a.shape[1:]), a.stride(), dtype=a.dtype, device="meta")
                         for a in rec_args]
            self.compiles += 1
            try:  # no lock held: this process goes on serving
                raw = self._compiler.compile(exact, [*stand_ins, *constants], dynamic=len(rec_args))
            except CompileWorkerDied as exc:
                if self._compiler.closed:  # the engine is closing: nothing went wrong
                    self._symbolic_cut_off = True
                    self._symbolic_failed = "the compile process was closed during the symbolic compile"
                    logger.info("compile backend: %s; size %d stays eager", self._symbolic_failed, size)
                    raise
                self._symbolic_failed = f"the compile process died during the symbolic compile ({exc})"
                logger.warning("compile backend: %s; size %d serves eager, later sizes compile per size",
                               self._symbolic_failed, size)
                raise
            except (RuntimeError, ValueError) as exc:  # the graph cannot travel, or inductor failed there
                if "not a saveable" in str(exc):  # nothing to compile (chain S=1): per size stores the graph
                    self._symbolic_failed = "no symbolic code: inductor saved nothing for it"
                    logger.info("compile backend: %s; compiling per size", self._symbolic_failed)
                    return
                logger.warning("compile process: no symbolic compile there (%s); compiling it in this process", exc)
        compiled: Any = None
        try:
            with _fx_work():
                if raw is not None:
                    try:
                        with _new_modules(self._unit_modules):
                            compiled = _load_artifact(raw)
                    except Exception as exc:  # noqa: BLE001  # the in-process compile decides
                        self._if_closed_stop(exc)
                        logger.warning("compile process: the symbolic code does not load here (%s: %s); "
                                       "compiling it in this process", type(exc).__name__, exc)
                        raw = None
                if compiled is None:
                    self._if_closed_stop(None)
                    self.compiles += 1
                    with _new_modules(self._unit_modules):
                        compiled = compile_symbolic(exact, [*fakes, *constants])
                    with contextlib.suppress(Exception):  # nothing saveable: it is not stored
                        raw = _artifact_bytes(compiled) if self._store is not None else None
        except CompileWorkerDied:  # closed while loading (`_if_closed_stop`): a cut-off, no failure
            self._symbolic_cut_off = True
            self._symbolic_failed = "the compile process was closed during the symbolic compile"
            raise
        except Exception as exc:  # noqa: BLE001  # any failure: compile per size, as without it
            self._per_size_after("no symbolic compile", exc)
            return
        if self._store is not None and raw is None:  # not storable: per size stores what it can
            self._symbolic_failed = "no symbolic code: inductor saved nothing for it"
            logger.info("compile backend: %s; compiling per size", self._symbolic_failed)
            return
        self._symbolic = (compiled, constants)
        self._symbolic_raw = raw
        self.symbolic_compiles += 1
        self.symbolic_compile_s = time.perf_counter() - start
        logger.info("compile backend: one symbolic compile in %.2f s%s", self.symbolic_compile_s,
                    " (compile process)" if self._compiler is not None and raw is not None else "")

    def _if_closed_stop(self, exc: Exception | None) -> None:
        """Raise `CompileWorkerDied` when the compile process was closed (the engine or the
        process is ending: at exit, loading inductor's code fails with "can't register atexit
        after shutdown"): no compile in this process then, and nothing to warn about."""
        if self._compiler is not None and self._compiler.closed:
            raise CompileWorkerDied("the compile process was closed: no compile in this process") from exc

    def _per_size_after(self, what: str, exc: Exception) -> None:
        """The symbolic route failed (``what``, raising ``exc``): every size compiles on its own
        (a cancelled capture is no failure: it propagates)."""
        if isinstance(exc, CaptureCancelled):
            raise exc
        if cancel_requested():  # the process is exiting: inductor refuses new work, nothing failed
            raise CaptureCancelled(f"{what}: cancelled at exit") from exc
        self._symbolic_failed = f"{what}: {type(exc).__name__}: {exc}"
        logger.warning("compile backend: %s; compiling per size", self._symbolic_failed)

    def _symbolic_runner(self, fn: FlatStep, rec_args: tuple[Tensor, ...], args: tuple[Tensor, ...],
                         gm: fx.GraphModule, size: int) -> tuple[Callable[..., Any] | None, str | None]:
        """(runner, None) replaying the one symbolic compile over ``args`` when it equals ``gm``
        (this size's recording) bitwise, else (None, why); records and compiles it on first use."""
        if self._symbolic is None and self._symbolic_failed is None:
            self._symbolic_compile(fn, rec_args, size)
        if self._symbolic is None:
            return None, self._symbolic_failed
        compiled, constants = self._symbolic
        inputs = (*args, *constants)
        if _shares_storage(inputs):
            return None, "two inputs of the symbolic graph share memory"
        reference, own = _lift_constants(gm)
        n, m = len(args), len(own)
        try:
            with _RECORD_LOCK, torch.no_grad():
                snapshot, _ = isolated_world((*args, *own, *constants))  # one snapshot, copied twice
                want_in, want_mem = isolated_world(snapshot[:n + m])
                got_in, got_mem = isolated_world((*snapshot[:n], *snapshot[n + m:]))
                want = reference(*want_in)
                got = compiled(*got_in)
        except Exception as exc:  # noqa: BLE001  # e.g. a guard the symbolic graph assumed
            return None, f"symbolic replay failed at size {size}: {type(exc).__name__}: {exc}"
        if isinstance(got, Tensor):
            got = (got,)
        why = _first_difference("output", tuple(want), tuple(got)) or worlds_differ(want_mem, got_mem)
        if why is not None:
            return None, f"symbolic replay differs from the FX replay at size {size}: {why}"

        self.symbolic_sizes.append(size)
        return _runner(compiled, inputs, constants, None, symbolic=True), None

    def _compiled_runner(self, gm: fx.GraphModule, args: tuple[Tensor, ...], size: int
                         ) -> tuple[Callable[..., Any] | None, str | None]:
        """(runner, None) when the compiled graph equals the FX replay bitwise, else (None, why)."""
        lifted, constants = _lift_constants(gm)
        inputs = (*args, *constants)
        if _shares_storage(inputs):
            return None, "two inputs share memory"
        _use_cache_dir()
        exact, _ = keep_aten_reductions(lifted)  # what inductor compiles; ``lifted`` is the reference
        raw: bytes | None = None
        if self._compiler is not None and self._compile_fn is None:
            try:
                self.compiles += 1
                raw = self._compiler.compile(exact, inputs)  # no lock held: this process goes on serving
            except CompileWorkerDied:
                raise
            except (RuntimeError, ValueError) as exc:  # the graph cannot travel, or inductor failed there
                # a step with nothing to compile (chain S=1) has no saveable artifact: expected, and
                # cheap here (this process stores its recorded graph, see _save)
                log = logger.info if "not a saveable" in str(exc) else logger.warning
                log("compile process: size %d not compiled there (%s); compiling it in this process", size, exc)
        if raw is not None:
            with _fx_work(lock=False):
                try:
                    with _new_modules(self._unit_modules):
                        compiled = _load_artifact(raw)
                    compiled(*_copies(inputs))  # a graph the pipe changed fails here: compile it here
                except Exception as exc:  # noqa: BLE001  # any failure: the in-process compile decides
                    self._if_closed_stop(exc)
                    logger.warning("compile process: size %d's code does not run here (%s: %s); "
                                   "compiling it in this process", size, type(exc).__name__, exc)
                    raw = None
        compile_fn = self._compile_fn or (_inductor_artifact if self._store is not None else _inductor_compile)
        if raw is None:
            self._if_closed_stop(None)
        with _RECORD_LOCK, torch.no_grad():  # inductor records with make_fx too (AOT autograd)
            if raw is None:
                self.compiles += 1
                with _fx_work(lock=False):  # the lock is held: only this compile's sources go
                    with _new_modules(self._unit_modules):
                        compiled = compile_fn(exact, _copies(inputs))
            # one snapshot, copied twice: serving may write the live cache between two copies of
            # it (seen beside serving: "input after the step 17: values differ" at size 4)
            snapshot = _copies(inputs)
            want_in = _copies(snapshot)
            got_in = _copies(snapshot)
            want = lifted(*want_in)
            got = compiled(*got_in)
        if isinstance(got, Tensor):
            got = (got,)
        why = _first_difference("output", tuple(want), tuple(got)) or _first_difference(
            "input after the step", want_in, got_in)
        if why is not None:
            return None, f"compiled replay differs from the FX replay at size {size}: {why}"

        return _runner(compiled, inputs, constants, raw), None


def _without_grad(compiled: Callable[..., Any]) -> Callable[..., Any]:
    """``compiled`` called under `torch.no_grad` (a stored graph's replay)."""
    def run(*inputs: Tensor) -> Any:
        with torch.no_grad():
            return compiled(*inputs)
    return run


# Loads and in-process compiles take turns on this lock, so that the modules inductor registers
# during one are told apart from another capture thread's (`_new_modules`).
_MODULES_LOCK = threading.RLock()


@contextlib.contextmanager
def _new_modules(into: list[Any]) -> Iterator[None]:
    """Run the body (an inductor load or compile) alone among loads; append to ``into`` the
    generated modules it registered (released with the graph that holds them)."""
    with _MODULES_LOCK:
        before = {id(m) for m in _loaded_modules()}
        try:
            yield
        finally:
            into.extend(m for m in _loaded_modules() if id(m) not in before)


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


def _dtype(name: str) -> torch.dtype:
    """``torch.float32`` for "torch.float32" (EntryError for anything else)."""
    value = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise EntryError(f"dtype {name!r} is not a torch dtype")
    return value


def _paired_seconds(a: Callable[[], Any], b: Callable[[], Any], rounds: int = 9) -> tuple[float, float, float]:
    """(median seconds of ``a``, of ``b``, median of the per-round ratios a / b): one warm-up
    call each, then ``rounds`` rounds that call ``a`` and ``b`` back to back, the order
    alternating. A compile process or serving busy on the other core slows both sides of a
    round alike, so the ratio holds where two separate medians did not (measured: a cold fill
    served 37 of its 63 steps eager, "eager_faster", and stored that verdict; with pairs, 0)."""
    a()
    b()
    ta: list[float] = []
    tb: list[float] = []
    for i in range(rounds):
        if cancel_requested():  # the process is exiting: no verdict, and no more rounds
            raise CaptureCancelled("speed check cancelled")
        for fn, out in ((a, ta), (b, tb)) if i % 2 == 0 else ((b, tb), (a, ta)):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    ratios = sorted(x / max(y, 1e-12) for x, y in zip(ta, tb))
    return sorted(ta)[rounds // 2], sorted(tb)[rounds // 2], ratios[rounds // 2]


def _inductor_compile(gm: fx.GraphModule, example_inputs: list[Tensor]) -> Callable[..., Any]:
    """Inductor's compile of an aten graph (no dynamo: the graph is already traced)."""
    from torch._inductor.compile_fx import compile_fx

    register_inductor_lowerings()
    return compile_fx(gm, example_inputs)


def _inductor_artifact(gm: fx.GraphModule, example_inputs: list[Tensor]) -> Callable[..., Any]:
    """`_inductor_compile` as an artifact that can be saved (with a store): ``standalone_compile``
    specialized on the example shapes
    (measured on the S=3 draft step at b=8: 2.6 s warm against 2.2-4.3 s for ``compile_fx``, the
    same 0.80 ms per replay)."""
    from torch._inductor import standalone_compile

    register_inductor_lowerings()
    return standalone_compile(gm, example_inputs, dynamic_shapes="from_example_inputs")


def _artifact_bytes(artifact: Any) -> bytes:
    """The bytes ``CompiledArtifact.save(format="binary")`` would write (ValueError when the
    artifact holds nothing saveable)."""
    saveable = getattr(artifact, "is_saveable", None)
    if saveable is None or not saveable():
        raise ValueError(f"{type(artifact).__name__} is not a saveable inductor artifact")
    raw = artifact._to_binary_bytes()  # noqa: SLF001  # torch's own serializer, without a temp file
    with contextlib.suppress(AttributeError):  # stored now: the live artifact need not keep a copy
        artifact._artifacts = None  # noqa: SLF001  # torch's field holding those bytes
    return raw


def _load_artifact(raw: bytes) -> Callable[..., Any]:
    """A callable from `_artifact_bytes` output, loaded in memory (what
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


def _runner(compiled: Callable[..., Any], inputs: tuple[Tensor, ...], constants: Any, raw: bytes | None,
            symbolic: bool = False) -> Callable[..., Any]:
    """The replay of one size: ``compiled`` over its bound ``inputs`` (static views and lifted
    constants), carrying what storing and timing it need (``compiled``, ``constants``, ``raw``
    artifact bytes, ``symbolic``: the one code of every size)."""
    def run(*_: Tensor) -> Any:
        with torch.no_grad():
            return compiled(*inputs)

    run.compiled = compiled  # type: ignore[attr-defined]
    run.constants = constants  # type: ignore[attr-defined]
    run.raw = raw  # type: ignore[attr-defined]
    if symbolic:
        run.symbolic = True  # type: ignore[attr-defined]
    return run
