"""What a draft worker hands the graph manager so compiled steps store and load (`StoredCode`).

- the **structure** string: everything the compiled code of one state's draft step depends on
  besides the tensors' shapes (which the key covers): the worker and model classes, the model's
  configuration, the speculative shape (S, k, N, a static tree), the chain capacity, the
  device, and a digest of draftgraph's own source (a changed step never loads old code);
- the **constant table**: every tensor the step may read, by a stable name: the draft model's
  parameters and buffers, the tensors of its cache, the state's topology tensors.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from draftgraph.graphs.compile.entry import StoredCode
from draftgraph.runtime.compile_store import default_compile_store
from draftgraph.runtime.config import chain_capacity
from draftgraph.runtime.worker.state import RuntimeState

__all__ = ["code_digest", "code_sources", "compiled_unit_seconds", "phase_stored_code", "source_counts", "stored_code"]


def _package_root() -> Path:
    """The folder holding ``runtime`` and ``graphs`` (this file is runtime/worker/stored_steps.py)."""
    return Path(__file__).resolve().parents[2]


def code_sources() -> list[Path]:
    """Every ``.py`` file of draftgraph's ``runtime`` and ``graphs`` packages, sorted (what the
    stored code's key hashes: a change anywhere in them, models included, compiles anew)."""
    return [p for name in ("runtime", "graphs") for p in sorted((_package_root() / name).rglob("*.py"))]


@lru_cache(maxsize=1)
def code_digest() -> str:
    """SHA-256 over `code_sources` (names relative to the package root, and bytes)."""
    h = hashlib.sha256()
    root = _package_root()
    for path in code_sources():
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _config(model: Any) -> Any:
    cfg = getattr(model, "cfg", None)
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {k: repr(v) for k, v in dataclasses.asdict(cfg).items()}
    return repr(cfg) if cfg is not None else None


def _structure(worker_name: str, args: Any, rows: Any, state: RuntimeState, model: Any) -> str:
    spec = state.spec
    return json.dumps({
        "worker": worker_name, "model": f"{type(model).__module__}.{type(model).__qualname__}",
        "config": _config(model), "num_steps": spec.num_steps, "topk": spec.topk,
        "num_draft_tokens": spec.num_draft_tokens, "tree": repr(spec.tree_choices),
        "capacity": chain_capacity(args), "device": str(args.device), "rows": rows.describe(),
        "code": code_digest(),
    }, sort_keys=True)


def _add(out: dict[str, torch.Tensor], name: str, value: Any) -> None:
    """Every tensor in ``value`` (a tensor, or a tuple / list of them, nested) under ``name``."""
    if isinstance(value, torch.Tensor):
        out[name] = value
    elif isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            _add(out, f"{name}.{i}", v)


def _constants(model: Any, state: RuntimeState) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    if isinstance(model, torch.nn.Module):
        for name, t in model.named_parameters():
            out[f"model.{name}"] = t
        for name, t in model.named_buffers():
            out[f"model.{name}"] = t
    cache = getattr(model, "cache", None)
    for field in ("k", "v"):
        _add(out, f"cache.{field}", getattr(cache, field, None))
    buf = state.topology_buffers
    if buf is not None:
        for field in ("parents", "score_indices", "first_columns", "first_feed", "levels"):
            _add(out, f"topology.{field}", getattr(buf, field, None))
    return out


def stored_code(worker_name: str, args: Any, rows: Any, state: RuntimeState, model: Any,
                compiler: Any = None) -> StoredCode | None:
    """`StoredCode` for ``state``'s draft step under a worker of class ``worker_name`` serving
    ``args`` with the draft row layout ``rows`` (None when the store is off); ``compiler``: a
    `CompileWorker` to compile in."""
    store = default_compile_store()
    if store is None:
        return None
    structure = _structure(worker_name, args, rows, state, model)
    return StoredCode(store, structure, lambda: _constants(model, state), compiler)


def phase_stored_code(name: str, structure: str, constants: Any, compiler: Any = None) -> StoredCode | None:
    """`StoredCode` for a host's phase ``name`` (see `runtime.worker.host_phases`): its ``structure`` (the
    host's description of what the code depends on) with the phase name and draftgraph's source
    digest, and its constant table ``constants()`` (None when the store is off); ``compiler``: a
    `CompileWorker` to compile in."""
    store = default_compile_store()
    if store is None:
        return None
    key = json.dumps({"phase": name, "structure": structure, "code": code_digest()}, sort_keys=True)
    return StoredCode(store, key, constants, compiler)


def _managers(state: RuntimeState) -> list[Any]:
    """The draft step's manager and every phase's (those a state holds)."""
    out = [state.graphs] if state.graphs is not None else []
    if state.phases is not None:
        out.extend(state.phases.managers.values())
    return out


def compiled_unit_seconds(compiled: bool = True) -> float | None:
    """The mean seconds a unit took to record and compile (``compiled=False``: to record and check
    against its state's one compile), as noted in the store by this and earlier processes (None
    when the store is off or holds no figure)."""
    store = default_compile_store()
    return None if store is None else store.unit_seconds(compiled)


def source_counts(states: list[RuntimeState], compile_process: dict[str, Any] | None = None) -> dict[str, Any]:
    """Where the live graphs of ``states`` came from: ``units_recorded`` (recorded; with the compile
    backend ``units_checked`` of them were checked bitwise against compiled code), ``units_compiled``
    (the compiles those captures ran: one symbolic compile per step and each size compiled on its
    own; not one per size), ``units_loaded`` (compiled code from the
    store, no recording), ``units_shared`` (code this process compiled for an identical graph),
    the store's own counts (None when it is off) and the compile process's (``compile_process``:
    compiles, deaths, ``compile_s`` spent compiling in it; None when none ran)."""
    out = {"units_recorded": 0, "units_checked": 0, "units_compiled": 0, "units_loaded": 0, "units_shared": 0}
    for graphs in (m for state in states for m in _managers(state)):
        for size in graphs.stats.sizes.values():
            if size.source == "loaded":
                out["units_loaded"] += 1
            elif size.source == "shared":
                out["units_shared"] += 1
            else:
                out["units_recorded"] += 1
                out["units_checked"] += int(size.compile_s > 0)
                out["units_compiled"] += size.compiles
    store = default_compile_store()
    out["compiled_store"] = store.as_dict() if store is not None else None
    out["compile_process"] = compile_process
    return out
