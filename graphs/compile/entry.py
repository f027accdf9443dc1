"""Compiled draft steps that load from a store: keys, entries and the graph a loaded entry replays.

A stored entry is what replaying one captured size needs without recording it again: the
inductor artifact (compiled code whose inputs are the static rows followed by every tensor
the step reads, lifted to arguments: weights are never baked in) and a manifest saying where
each of those tensors and each output lives, by name in a *constant table* the caller gives
(name -> tensor: the model's parameters and buffers, its caches, the state's topology
tensors). Loading rebuilds every argument as a view of the live tensor of that name, so an
in-place weight update reaches a loaded step exactly as it reaches a compiled one.

The key (`entry_key`) is a SHA-256 over the caller's structure string (what the step is:
model, configuration, code version), the size, the static inputs' and the constant table's
metadata (shape, stride, offset, dtype, device), the torch version, the CPU capability and
the backend: a different structure, torch or backend never loads another's code. A symbolic
entry (one compile with a symbolic batch dimension, `symbolic`) has a key of its own
without the size, and its manifest holds each checked size's outputs (``sizes``). A store
(`CompiledStore`, given by the caller: graphs/ does no file I/O of its own) keeps the bytes.
A payload that cannot be parsed or loaded is refused through the store (named, removed) and
the size is recorded and compiled again.

An entry is bound to what it was compiled for, inside the payload the store's digest covers:
its manifest holds its own ``key`` and a description of its structure (`describe_request`: the
structure string, the size, every static input's shape and dtype; `describe_tensors`: every
constant's and every output's role, shape and dtype). A load checks the key and the request's
description (`check_request`) before anything is loaded, and the bound constants and outputs
against their description (`check_tensors`) before anything runs: an entry under another
key's name (same user, digest intact) is an `EntryError`, so it is refused and compiled again,
never run as another structure's code.
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
import sys
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor

__all__ = ["CompiledStore", "ConstantTable", "EntryError", "StoredCode", "StoredGraph", "check_request",
           "check_tensors", "describe_request", "describe_tensors", "entry_key", "pack_entry", "unpack_entry"]

logger = logging.getLogger(__name__)

FORMAT = 2  # 2: the manifest names its key and describes its structure (`check_request`)
_MAGIC = b"DGCE"  # draftgraph compiled entry
_HEAD = struct.Struct("<4sIQ")  # magic, format, manifest bytes


class EntryError(ValueError):
    """A stored entry that cannot be used (damaged, another format, not matching the live tensors)."""


class CompiledStore(Protocol):
    """Where compiled entries live (the runtime's store applies the file-safety rules)."""

    def get(self, key: str) -> bytes | None:
        """The payload stored under ``key`` (digest checked), or None."""
        ...

    def put(self, key: str, payload: bytes) -> None:
        """Store ``payload`` under ``key`` (may evict older entries)."""
        ...

    def refuse(self, key: str, why: str) -> None:
        """``key``'s payload was unusable: log it by name and remove it."""
        ...

    def note_unit_seconds(self, seconds: float, compiled: bool = True) -> None:
        """One unit was recorded and compiled (``compiled``), or recorded and checked against its
        state's one symbolic compile, in ``seconds`` (a cold start's estimate reads it)."""
        ...

    def written_here(self, key: str) -> bool:
        """True when this process wrote ``key`` (a later load of it is a shared compile)."""
        ...


class StoredCode(NamedTuple):
    """What a manager needs to store and load compiled code: the ``store``, the ``structure``
    string of its step (model, configuration, code version: part of every key),
    ``constants()``, the constant table (name -> tensor) read when a capture starts, and an
    optional ``compiler`` (`worker.CompileWorker`: compile in another process)."""

    store: CompiledStore
    structure: str
    constants: Callable[[], Mapping[str, Tensor]]
    compiler: Any = None


def _meta(t: Tensor) -> list[Any]:
    return [list(t.shape), list(t.stride()), t.storage_offset(), str(t.dtype), str(t.device)]


class ConstantTable:
    """The tensors a step may read besides its inputs, by stable name (first name wins for a
    storage held by several)."""

    def __init__(self, tensors: Mapping[str, Tensor]) -> None:
        self.tensors = dict(tensors)
        self._by_storage: dict[int, str] = {}
        for name, t in self.tensors.items():
            if not isinstance(t, Tensor):
                raise TypeError(f"constants[{name!r}] is a {type(t).__name__}: must be a tensor")
            ptr = _storage_ptr(t)
            if ptr:
                self._by_storage.setdefault(ptr, name)

    def describe(self) -> list[Any]:
        """Metadata of every named tensor (part of the key)."""
        return [[name, *_meta(t), t.untyped_storage().nbytes()] for name, t in sorted(self.tensors.items())]

    def locate(self, t: Tensor) -> dict[str, Any] | None:
        """Where ``t`` lives: {name, offset, shape, stride} of a view of a named tensor's storage;
        None when no named tensor holds its storage."""
        if t.numel() == 0:  # no memory to alias: any empty tensor of that shape will do
            return {"name": None, "offset": 0, "shape": list(t.shape), "stride": list(t.stride()),
                    "dtype": str(t.dtype).removeprefix("torch."), "device": str(t.device)}
        name = self._by_storage.get(_storage_ptr(t))
        if name is None or self.tensors[name].dtype != t.dtype:
            return None
        return {"name": name, "offset": t.storage_offset(), "shape": list(t.shape), "stride": list(t.stride())}

    def view(self, where: Mapping[str, Any]) -> Tensor:
        """The live view ``locate`` described (EntryError when it does not fit)."""
        if where["name"] is None:
            dtype = getattr(torch, str(where.get("dtype")), None)
            if not isinstance(dtype, torch.dtype) or 0 not in where["shape"]:
                raise EntryError(f"empty constant {where!r}: not an empty tensor of a torch dtype")
            return torch.empty_strided(where["shape"], where["stride"], dtype=dtype, device=where["device"])
        base = self.tensors.get(where["name"])
        if base is None:
            raise EntryError(f"constant {where['name']!r} is not in the table")
        shape, stride, offset = tuple(where["shape"]), tuple(where["stride"]), int(where["offset"])
        end = offset + sum((n - 1) * s for n, s in zip(shape, stride)) + 1 if all(shape) else offset
        if offset < 0 or end * base.element_size() > base.untyped_storage().nbytes():
            raise EntryError(f"constant {where['name']!r}: view {shape} at {offset} is outside its storage")
        return torch.as_strided(base, shape, stride, offset)


def _storage_ptr(t: Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0


def entry_key(structure: str, size: int | None, inputs: tuple[Tensor, ...], table: ConstantTable, backend: str
              ) -> str:
    """SHA-256 hex of everything a stored entry's code depends on (see the module docstring).
    ``size`` None: the key of a symbolic entry (one code for every batch size): the inputs'
    dim 0 is left out and the key says "symbolic", so it never equals a per-size key."""
    try:
        cpu = torch.backends.cpu.get_cpu_capability()
    except (AttributeError, RuntimeError):
        cpu = "unknown"
    metas = [_meta(t) for t in inputs]
    if size is None:
        for m in metas:
            m[0] = m[0][1:]
    spec = {"format": FORMAT, "structure": structure, "size": "symbolic" if size is None else size,
            "inputs": metas, "constants": table.describe(), "torch": torch.__version__,
            "python": sys.version.split()[0], "cpu": cpu,
            "backend": backend if size is not None else f"{backend}+symbolic"}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def describe_request(structure: str, size: int | None, inputs: tuple[Tensor, ...]) -> dict[str, Any]:
    """What a load asks for, as an entry's manifest records it: the structure string, the size
    ("symbolic": one code for every size, the inputs' dim 0 left out) and each static input's
    role, shape and dtype."""
    described = describe_tensors(inputs, "static")
    if size is None:
        for d in described:
            d["shape"] = d["shape"][1:]
    return {"structure": structure, "size": "symbolic" if size is None else size, "inputs": described}


def describe_tensors(tensors: tuple[Tensor, ...] | list[Tensor], role: str | list[str]) -> list[dict[str, Any]]:
    """Role, shape and dtype of each tensor (``role``: one for all, or one per tensor)."""
    roles = [role] * len(tensors) if isinstance(role, str) else list(role)
    return [{"role": r, "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
            for r, t in zip(roles, tensors)]


def check_request(manifest: Mapping[str, Any], key: str, request: Mapping[str, Any]) -> None:
    """EntryError unless ``manifest`` was made under ``key`` for ``request`` (`describe_request`),
    naming the first difference."""
    made_for = manifest.get("key")
    if made_for != key:
        raise EntryError(f"entry made under key {str(made_for)[:16]}..., found under {key[:16]}...: "
                         f"code compiled for another structure is never run")
    stored = manifest.get("request")
    if not isinstance(stored, dict):
        raise EntryError("entry has no description of its structure")
    for field in ("structure", "size", "inputs"):
        if stored.get(field) != request[field]:
            raise EntryError(f"entry describes {field} {_short(stored.get(field))}, the request "
                             f"{_short(request[field])}")


def check_tensors(described: Any, tensors: tuple[Tensor, ...] | list[Tensor], what: str) -> None:
    """EntryError unless ``tensors`` have the roles, shapes and dtypes ``described`` (a manifest's
    `describe_tensors` list) says, naming ``what`` and the first difference."""
    if not isinstance(described, list) or len(described) != len(tensors):
        n = len(described) if isinstance(described, list) else None
        raise EntryError(f"{what}: the entry describes {n}, {len(tensors)} bound")
    for i, (d, t) in enumerate(zip(described, tensors)):
        if not isinstance(d, dict) or d.get("shape") != list(t.shape) \
                or d.get("dtype") != str(t.dtype).removeprefix("torch."):
            raise EntryError(f"{what} {i}: the entry describes {_short(d)}, bound {list(t.shape)} {t.dtype}")


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 200 else text[:200] + "..."


def pack_entry(manifest: Mapping[str, Any], artifact: bytes) -> bytes:
    """One payload: header, manifest JSON, artifact bytes."""
    raw = json.dumps(manifest, sort_keys=True).encode()
    return _HEAD.pack(_MAGIC, FORMAT, len(raw)) + raw + artifact


def unpack_entry(payload: bytes) -> tuple[dict[str, Any], bytes]:
    """(manifest, artifact) of a payload; EntryError when it is not one of ours."""
    if len(payload) < _HEAD.size:
        raise EntryError(f"{len(payload)} bytes: shorter than the header")
    magic, fmt, n = _HEAD.unpack_from(payload)
    if magic != _MAGIC or fmt != FORMAT:
        raise EntryError(f"header {magic!r} format {fmt}: not a draftgraph compiled entry of format {FORMAT}")
    if _HEAD.size + n > len(payload):
        raise EntryError(f"manifest of {n} bytes runs past the end ({len(payload)} bytes)")
    try:
        manifest = json.loads(payload[_HEAD.size:_HEAD.size + n])
    except ValueError as exc:
        raise EntryError(f"manifest is not JSON: {exc}") from exc
    if not isinstance(manifest, dict):
        raise EntryError("manifest is not an object")
    return manifest, payload[_HEAD.size + n:]


class StoredGraph:
    """One size replayed by loaded code: the same contract as a recorded graph (fixed
    ``outputs``; fresh outputs copied into the backend's shared buffers)."""

    fallback_reason: str | None = None

    def __init__(self, size: int, runner: Any, args: tuple[Tensor, ...], outputs: tuple[Tensor, ...],
                 fresh: tuple[int, ...], nodes: int | None, nbytes: int, engine: str = "inductor") -> None:
        self.size = size
        self.engine = engine  # "inductor", or "fx": the recorded graph itself (nothing to compile)
        self.nodes = nodes
        self.nbytes = nbytes
        self.outputs = outputs
        self._runner = runner
        self._args = args
        self._copies = tuple((i, outputs[i]) for i in fresh)
        self.compile_s = 0.0
        self.replay_s: float | None = None
        self.eager_s: float | None = None
        self.prefer_eager = False
        self.source = "loaded"  # or "shared": loaded code this process compiled for an identical graph
        self.release_hooks: list[Any] = []

    @property
    def inputs(self) -> tuple[Tensor, ...]:
        """The static views followed by the live constants, as the loaded code takes them."""
        return self._args

    @property
    def compiled(self) -> Any:
        """The loaded function (args: static views, then the lifted constants)."""
        return self._runner

    def replay(self) -> tuple[Tensor, ...]:
        """Run the loaded code over the static inputs and constants; the fixed outputs."""
        if self._runner is None:
            raise RuntimeError(f"stored graph for size {self.size} was released")
        outs = self._runner(*self._args)
        for i, view in self._copies:
            view.copy_(outs[i])
        return self.outputs

    def release(self) -> None:
        """Drop the code, views and output buffers it referenced; idempotent."""
        hooks, self.release_hooks = self.release_hooks, []
        for hook in hooks:
            hook()
        self._runner = None
        self._args = ()
        self._copies = ()
        self.outputs = ()
