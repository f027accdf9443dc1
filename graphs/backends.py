"""Backend protocol, output normalization and ``resolve_backend``: what every capture backend shares."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
from torch import Tensor

from .errors import GraphCaptureError

__all__ = [
    "BACKEND_NAMES",
    "CapturedGraph",
    "FlatStep",
    "GraphBackend",
    "check_outputs",
    "flatten_outputs",
    "make_backend",
    "resolve_backend",
]

BACKEND_NAMES: tuple[str, ...] = ("auto", "cuda", "trace", "eager")
"""Names ``resolve_backend`` accepts."""

FlatStep = Callable[..., tuple[Tensor, ...]]
"""A step over positional static views returning a flat tuple of tensors."""


class CapturedGraph(Protocol):
    """One captured batch size: replay returns its outputs with ``size`` rows each."""

    size: int
    nodes: int | None
    nbytes: int

    def replay(self) -> tuple[Tensor, ...]:
        """Run the graph over the static inputs; outputs live in graph/static memory."""
        ...

    def release(self) -> None:
        """Free the graph; idempotent."""
        ...


class GraphBackend(Protocol):
    """A capture backend: one instance per successful ``capture()`` call, owning the shared pool."""

    name: str
    captures: bool

    def warmup(self, fn: FlatStep, args: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        """Run ``fn`` eagerly once at the largest size (side stream on CUDA)."""
        ...

    def capture(self, size: int, fn: FlatStep, args: tuple[Tensor, ...]) -> CapturedGraph:
        """Record ``fn`` over ``args`` (the static views with ``size`` rows) into the shared pool."""
        ...

    def release(self) -> None:
        """Free the shared pool and stream; idempotent."""
        ...


def flatten_outputs(out: object) -> tuple[tuple[Tensor, ...], bool]:
    """(flat tuple of tensors, was a single tensor) for a step result; TypeError for anything else."""
    if isinstance(out, Tensor):
        return (out,), True
    if isinstance(out, tuple) and out and all(isinstance(t, Tensor) for t in out):
        return out, False
    kinds = type(out).__name__ if not isinstance(out, tuple) else [type(t).__name__ for t in out]
    raise TypeError(f"step returned {kinds}: must return a tensor or a non-empty tuple of tensors")


def check_outputs(outs: tuple[Tensor, ...], size: int) -> tuple[Tensor, ...]:
    """Check every output has ``size`` rows (dim 0 is the batch); GraphCaptureError otherwise."""
    for i, out in enumerate(outs):
        if out.dim() == 0 or out.shape[0] != size:
            raise GraphCaptureError(
                f"step output {i} has shape {tuple(out.shape)} at size {size}: "
                f"outputs must have the batch as dim 0 ({size} rows)",
                size=size,
            )
    return outs


def resolve_backend(name: str, device: torch.device | str | None = None) -> str:
    """Concrete backend for ``name``: "auto" is "cuda" with CUDA (for ``device`` when given), else "trace"."""
    if not isinstance(name, str):
        raise TypeError(f"backend={name!r} ({type(name).__name__}): must be a str, one of {BACKEND_NAMES}")
    if name not in BACKEND_NAMES:
        raise ValueError(f"backend={name!r}: unknown; valid names are {', '.join(BACKEND_NAMES)}")
    cuda_ok = torch.cuda.is_available()
    if name == "auto":
        on_cuda = device is None or torch.device(device).type == "cuda"
        return "cuda" if cuda_ok and on_cuda else "trace"
    if name == "cuda" and not cuda_ok:
        raise ValueError("backend='cuda': torch.cuda.is_available() is False; use 'auto', 'trace' or 'eager'")
    return name


def make_backend(name: str, rows: int, device: torch.device) -> GraphBackend:
    """A fresh backend instance for a resolved ``name``; ``rows`` = the largest capture size."""
    if name == "cuda":
        from .backend_cuda import CudaBackend

        return CudaBackend(rows, device)
    if name == "trace":
        from .backend_trace import TraceBackend

        return TraceBackend(rows)
    if name == "eager":
        from .backend_eager import EagerBackend

        return EagerBackend()
    raise ValueError(f"backend={name!r}: not a resolved backend name (cuda, trace, eager)")
