"""The backend registry: names, ``resolve_backend``, what each backend can do (`capabilities`)
and the ``make_backend`` factory.

The protocol every backend implements lives in ``core.protocol``; this module only picks and builds
one, so it imports the backend modules and none of them imports it. It is the one place that
compares a backend's name: everywhere else the code asks `capabilities` (captures, compiled
code, device replay, stored code), which each backend class declares (`GraphBackend`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .backend_cuda import CudaBackend
from .backend_eager import EagerBackend
from .compile.backend import CompileBackend
from .compile.entry import StoredCode
from .compile.inductor import compiler_available
from .core.backend_trace import TraceBackend
from .core.protocol import GraphBackend

__all__ = ["BACKEND_NAMES", "Capabilities", "backend_class", "capabilities", "make_backend", "resolve_backend"]

BACKEND_NAMES: tuple[str, ...] = ("auto", "cuda", "compile", "trace", "eager")
"""Names ``resolve_backend`` accepts."""


def resolve_backend(name: str, device: torch.device | str | None = None) -> str:
    """Concrete backend for ``name``: "auto" is "cuda" with CUDA (for ``device`` when given), else
    "compile" where inductor has a C++ compiler, else "trace"."""
    if not isinstance(name, str):
        raise TypeError(f"backend={name!r} ({type(name).__name__}): must be a str, one of {BACKEND_NAMES}")
    if name not in BACKEND_NAMES:
        raise ValueError(f"backend={name!r}: unknown; valid names are {', '.join(BACKEND_NAMES)}")
    cuda_ok = torch.cuda.is_available()
    if name == "auto":
        on_cuda = device is None or torch.device(device).type == "cuda"
        if cuda_ok and on_cuda:
            return "cuda"
        return "compile" if compiler_available() else "trace"
    if name == "cuda" and not cuda_ok:
        raise ValueError("backend='cuda': torch.cuda.is_available() is False; use 'auto', 'trace' or 'eager'")
    if name == "compile" and not compiler_available():
        raise ValueError("backend='compile': no C++ compiler found for inductor (set CXX or install g++); "
                         "use 'trace' or 'eager'")
    return name


_CLASSES: dict[str, type[Any]] = {"cuda": CudaBackend, "trace": TraceBackend, "compile": CompileBackend,
                                  "eager": EagerBackend}


def backend_class(name: str) -> type[GraphBackend]:
    """The class of a resolved backend ``name`` (its capabilities, before any instance exists)."""
    if name not in _CLASSES:
        raise ValueError(f"backend={name!r}: not a resolved backend name (cuda, compile, trace, eager)")
    return _CLASSES[name]


@dataclass(frozen=True)
class Capabilities:
    """What a resolved backend does, as its class declares it (`GraphBackend`)."""

    name: str  # the resolved name, for reports only: ask the fields below
    captures: bool  # records the step per size (False: every step runs eagerly, no graph)
    compiles_code: bool  # compiles code per size (may compile in another process, foresees compiles)
    replays_on_device: bool  # replays recorded device work (a CUDA graph: CUDA inputs, its own pool)
    stores_code: bool  # loads and stores compiled code (the compiled-code store)
    records_on_copies: bool  # may record over stand-ins of the inputs (beside serving)


def capabilities(name: str, device: torch.device | str | None = None) -> Capabilities:
    """What backend ``name`` does: a resolved name as it is (whether or not it could run here,
    e.g. a report's "cuda" read on a CPU box), "auto" resolved first (for ``device``)."""
    cls = backend_class(name if name in _CLASSES else resolve_backend(name, device))
    return Capabilities(cls.name, cls.captures, cls.compiles_code, cls.replays_on_device, cls.stores_code,
                        cls.records_on_copies)


def make_backend(name: str, rows: int, device: torch.device, auto: bool = False,
                 stored: StoredCode | None = None, share: Any = None) -> GraphBackend:
    """A fresh backend instance for a resolved ``name``; ``rows`` = the largest capture size;
    ``auto``: chosen by "auto" (compile then times each size against eager); ``stored``: where
    compiled code is stored and loaded from (the compile backend; the others ignore it);
    ``share``: a `CaptureShare` (the cuda backend captures into its pool on its stream)."""
    if name == "cuda":
        return CudaBackend(rows, device, share)
    if name == "trace":
        return TraceBackend(rows)
    if name == "compile":
        if stored is None:
            return CompileBackend(rows, check_speed=auto)
        return CompileBackend(rows, check_speed=auto, store=stored.store, constants=stored.constants(),
                              structure=stored.structure, compiler=stored.compiler)
    if name == "eager":
        return EagerBackend()
    raise ValueError(f"backend={name!r}: not a resolved backend name (cuda, compile, trace, eager)")
