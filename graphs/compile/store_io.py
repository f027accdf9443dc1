"""Stored compiled code, read and written for one compile backend: keys, loads, saves.

`StoredCodeIO` is the compile backend's collaborator for its `CompiledStore`: the key of a size
(or of the symbolic code), a size rebuilt from its stored entry over the live tensors
(`load_size`), the symbolic code fetched once (`fetch_symbolic`) and a size bound to it
(`bind_symbolic`), and the entries written after a compile (`save`, `save_symbolic`). A payload
that cannot be used is refused through the store (named, removed) and None returned, so the
caller records and compiles again. ``loaded`` / ``shared`` / ``stored`` count what it did.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, fx

from ..core.aten_reductions import REWRITE_TAG
from ..core.backend_trace import TraceGraph
from .compare import lift_constants
from .entry import (
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
from .inductor import ModuleLedger, artifact_bytes, fx_work, load_artifact, use_cache_dir
from .records import CompiledRunner, without_grad

__all__ = ["StoredCodeIO", "SymbolicCode"]

logger = logging.getLogger(__name__)

BufferFor = Callable[[int, tuple[int, ...], torch.dtype, torch.device], tuple[Tensor, int]]


@dataclass
class SymbolicCode:
    """The one symbolic compile of a step: ``compiled`` over (static rows, ``constants``), its
    artifact bytes ``raw`` (None: not saveable), its stored entry's ``manifest`` (None: not
    stored yet) and whether it came from the store as "loaded" or "shared" (``source``)."""

    compiled: Callable[..., Any]
    constants: tuple[Tensor, ...]
    raw: bytes | None = None
    manifest: dict[str, Any] | None = None
    source: str = "loaded"


def _dtype(name: str) -> torch.dtype:
    """``torch.float32`` for "torch.float32" (EntryError for anything else)."""
    value = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise EntryError(f"dtype {name!r} is not a torch dtype")
    return value


class StoredCodeIO:
    """Reads and writes one compile backend's entries (see the module docstring); ``buffer_for``
    is the backend's shared output buffer of an output index (`TraceBackend.buffer_for`);
    ``use_timings``: a loaded size takes the speed check's verdict stored with it ("auto")."""

    def __init__(self, store: CompiledStore, constants: Mapping[str, Tensor], structure: str, backend: str,
                 buffer_for: BufferFor, use_timings: bool = False) -> None:
        self.store = store
        self.use_timings = use_timings
        self.table = ConstantTable(constants)
        self.structure = structure
        self._tag = f"{backend}+{REWRITE_TAG}"
        self._buffer_for = buffer_for
        self.loaded = 0
        self.shared = 0
        self.stored = 0

    def key(self, size: int | None, args: tuple[Tensor, ...]) -> str:
        """The entry key of ``size`` over ``args`` (None: the symbolic code's)."""
        return entry_key(self.structure, size, args, self.table, self._tag)

    def count_source(self, graph: StoredGraph, shared: bool) -> None:
        """Count a graph served from the store (``shared``: code this process stored)."""
        graph.source = "shared" if shared else "loaded"
        if shared:
            self.shared += 1
        else:
            self.loaded += 1

    # ---- loads -------------------------------------------------------------------------------
    def load_size(self, size: int, args: tuple[Tensor, ...], ledger: ModuleLedger) -> StoredGraph | None:
        """``size``'s stored per-size code over the live ``args`` (None: no entry, or refused)."""
        key = self.key(size, args)
        payload = self.store.get(key)
        if payload is None:
            return None
        try:
            graph = self._rebuild(key, size, payload, args, ledger)
        except Exception as exc:  # a damaged or foreign entry, or torch cannot load it: rebuild it
            self.store.refuse(key, f"{type(exc).__name__}: {exc}")
            return None
        ledger.release_with(graph)
        self.count_source(graph, self.store.written_here(key))
        return graph

    def _rebuild(self, key: str, size: int, payload: bytes, args: tuple[Tensor, ...], ledger: ModuleLedger
                 ) -> StoredGraph:
        """A `StoredGraph` over the live ``args`` and named constants; EntryError when the entry was
        made for another key or structure (checked before its code is loaded) or does not fit."""
        manifest, artifact = unpack_entry(payload)
        check_request(manifest, key, describe_request(self.structure, size, args))
        if manifest.get("size") != size or len(manifest.get("inputs", ())) != len(args):
            raise EntryError(f"entry for size {manifest.get('size')!r} with {len(manifest.get('inputs', ()))} "
                             f"inputs; wanted size {size} with {len(args)}")
        constants = tuple(self.table.view(w) for w in manifest["constants"])
        check_tensors(manifest.get("constants_described"), constants, "constant")
        outputs, fresh, nbytes = self.bind_outputs(size, manifest["outputs"], args)
        check_tensors(manifest.get("outputs_described"), outputs, "output")
        use_cache_dir()
        engine = manifest.get("code", "inductor")
        with fx_work(lock=False):
            if engine == "fx":  # the recorded graph itself (inductor had nothing it could save)
                compiled = pickle.loads(artifact)  # noqa: S301  # digest-checked, from our private store
                if not isinstance(compiled, fx.GraphModule):
                    raise EntryError(f"fx entry holds a {type(compiled).__name__}, not a GraphModule")
            elif engine == "inductor":
                with ledger.track():
                    compiled = load_artifact(artifact)
            else:
                raise EntryError(f"unknown code kind {engine!r}")
        graph = StoredGraph(size, without_grad(compiled), (*args, *constants), tuple(outputs), tuple(fresh),
                            manifest.get("nodes"), nbytes, engine)
        if self.use_timings:
            _timed_when_stored(graph, manifest)
        return graph

    def fetch_symbolic(self, args: tuple[Tensor, ...], ledger: ModuleLedger) -> SymbolicCode | None:
        """The stored symbolic code (no recording, no compile), or None; an unusable entry is
        refused through the store (named, removed)."""
        key = self.key(None, args)
        payload = self.store.get(key)
        if payload is None:
            return None
        try:
            manifest, artifact = unpack_entry(payload)
            check_request(manifest, key, describe_request(self.structure, None, args))
            if manifest.get("symbolic") is not True or manifest.get("inputs") != len(args) \
                    or not isinstance(manifest.get("sizes"), dict):
                raise EntryError(f"not a symbolic entry over {len(args)} inputs")
            constants = tuple(self.table.view(w) for w in manifest["constants"])
            check_tensors(manifest.get("constants_described"), constants, "constant")
            use_cache_dir()
            with fx_work(lock=False), ledger.track():
                compiled = load_artifact(artifact)
        except Exception as exc:  # a damaged or foreign entry, or torch cannot load it: compile again
            self.store.refuse(key, f"{type(exc).__name__}: {exc}")
            return None
        logger.debug("compile backend: symbolic code from the store (%d sizes)", len(manifest["sizes"]))
        source = "shared" if self.store.written_here(key) else "loaded"
        return SymbolicCode(compiled, constants, artifact, manifest, source)

    def bind_symbolic(self, size: int, args: tuple[Tensor, ...], code: SymbolicCode) -> StoredGraph | None:
        """``size`` replayed by ``code`` when its manifest holds that size's outputs (the size
        passed the bitwise check when it was stored); else None (logged when it does not fit)."""
        described = (code.manifest or {}).get("sizes", {}).get(str(size))
        if described is None:
            return None
        try:
            outputs, fresh, nbytes = self.bind_outputs(size, described["outputs"], args)
            check_tensors(described.get("outputs_described"), outputs, "output")
        except (EntryError, KeyError, TypeError, ValueError) as exc:
            logger.warning("compile backend: size %d does not fit the stored symbolic code (%s); recording it",
                           size, exc)
            return None
        graph = StoredGraph(size, without_grad(code.compiled), (*args, *code.constants), tuple(outputs),
                            tuple(fresh), described.get("nodes"), nbytes, "inductor")
        self.count_source(graph, code.source == "shared")
        if self.use_timings:
            _timed_when_stored(graph, described)
        return graph

    def bind_outputs(self, size: int, described: list[dict[str, Any]], args: tuple[Tensor, ...]
                     ) -> tuple[list[Tensor], list[int], int]:
        """The outputs a manifest describes, over the live ``args`` and constants: (outputs,
        indices of fresh ones, bytes of new output buffers); EntryError when one does not fit."""
        outputs: list[Tensor] = []
        fresh: list[int] = []
        nbytes = 0
        for i, out in enumerate(described):
            kind = out.get("kind")
            if kind == "fresh":
                buffer, new = self._buffer_for(i, tuple(out["tail"]), _dtype(out["dtype"]), args[0].device)
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
                outputs.append(self.table.view(out))
            else:
                raise EntryError(f"output {i}: unknown kind {kind!r}")
        return outputs, fresh, nbytes

    # ---- saves -------------------------------------------------------------------------------
    def describe_outputs(self, graph: TraceGraph) -> list[dict[str, Any]] | None:
        """Where each of ``graph``'s outputs lives, as `bind_outputs` reads it (None, logged, when
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
            located = self.table.locate(out)
            if located is None:
                logger.debug("compile backend: size %d not stored: output %d is not in the constant table",
                              graph.size, i)
                return None
            outputs.append({"kind": "constant", **located})
        return outputs

    def save(self, graph: TraceGraph, runner: CompiledRunner) -> None:
        """Write ``graph``'s compiled code and manifest to the store (skipped, logged, when a
        constant or an output is not in the constant table; the recorded graph itself when the
        artifact cannot be saved)."""
        where = [self.table.locate(c) for c in runner.constants]
        if any(w is None for w in where):
            logger.debug("compile backend: size %d not stored: a constant is not in the constant table", graph.size)
            return
        inputs = graph.inputs
        outputs = self.describe_outputs(graph)
        if outputs is None:
            return
        code = "inductor"
        try:
            raw = runner.raw if runner.raw is not None else artifact_bytes(runner.compiled)
        except Exception as exc:  # inductor saved nothing (a step with nothing to compile): store the graph
            logger.debug("compile backend: size %d stores its recorded graph (%s)", graph.size, exc)
            raw, code = pickle.dumps(lift_constants(graph.module)[0]), "fx"
        key = self.key(graph.size, inputs)
        manifest = {"size": graph.size, "code": code, "inputs": [list(a.shape) for a in inputs], "constants": where,
                    "outputs": outputs, "nodes": graph.nodes, "torch": torch.__version__,
                    "prefer_eager": graph.prefer_eager if graph.replay_s is not None and code == "inductor" else None,
                    "replay_s": graph.replay_s, "eager_s": graph.eager_s, "key": key,
                    "request": describe_request(self.structure, graph.size, inputs),
                    "constants_described": describe_tensors(runner.constants, "constant"),
                    "outputs_described": describe_tensors(graph.outputs, [o["kind"] for o in outputs])}
        self.store.put(key, pack_entry(manifest, raw))
        self.stored += 1

    def save_symbolic(self, graph: TraceGraph, code: SymbolicCode) -> None:
        """Add ``graph``'s size (checked bitwise against the symbolic code) to the stored symbolic
        entry: one artifact, each size's outputs in its manifest (skipped, logged, as `save`)."""
        if code.raw is None:
            return
        outputs = self.describe_outputs(graph)
        where = [self.table.locate(c) for c in code.constants]
        if outputs is None or any(w is None for w in where):
            logger.debug("compile backend: size %d not in the symbolic entry: a tensor is not in the constant table",
                         graph.size)
            return
        key = self.key(None, graph.inputs)
        manifest = code.manifest or {
            "symbolic": True, "code": "inductor", "inputs": len(graph.inputs), "constants": where,
            "torch": torch.__version__, "sizes": {}, "key": key,
            "request": describe_request(self.structure, None, graph.inputs),
            "constants_described": describe_tensors(code.constants, "constant")}
        manifest["sizes"][str(graph.size)] = {
            "outputs": outputs, "nodes": graph.nodes, "replay_s": graph.replay_s, "eager_s": graph.eager_s,
            "prefer_eager": graph.prefer_eager if graph.replay_s is not None else None,
            "outputs_described": describe_tensors(graph.outputs, [o["kind"] for o in outputs])}
        self.store.put(key, pack_entry(manifest, code.raw))
        code.manifest = manifest
        self.stored += 1


def _timed_when_stored(graph: StoredGraph, described: Mapping[str, Any]) -> None:
    """The speed check's verdict the entry recorded when it was stored, if it was timed."""
    if described.get("prefer_eager") is not None:
        graph.replay_s, graph.eager_s = described.get("replay_s"), described.get("eager_s")
        graph.prefer_eager = bool(described["prefer_eager"])
