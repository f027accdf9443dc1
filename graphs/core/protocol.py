"""The backend protocol: what a capture backend and a captured graph provide, and the output rules.

Every backend module imports this one; ``backends`` (the factory) imports the backend modules;
nothing here imports either, so the imports run one way: protocol <- backend_* <- backends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from torch import Tensor

from .errors import GraphCaptureError

__all__ = ["CapturedGraph", "CompilesNothing", "FlatStep", "GraphBackend", "check_outputs", "flatten_outputs"]

FlatStep = Callable[..., tuple[Tensor, ...]]
"""A step over positional static views returning a flat tuple of tensors."""


class CapturedGraph(Protocol):
    """One captured batch size: replay returns its outputs with ``size`` rows each.

    ``outputs`` is what ``replay()`` returns, as the very same tensor objects every time
    (graph or static memory at fixed addresses), so a caller may prepare views of them once.
    Empty after ``release()``.
    """

    size: int
    nodes: int | None
    nbytes: int
    outputs: tuple[Tensor, ...]

    def replay(self) -> tuple[Tensor, ...]:
        """Run the graph over the static inputs and return ``outputs``."""
        ...

    def release(self) -> None:
        """Free the graph; idempotent."""
        ...


class GraphBackend(Protocol):
    """A capture backend: one instance per successful ``capture()`` call, owning the shared pool."""

    name: str
    captures: bool
    records_on_copies: bool  # capture() takes trace_args: it can record over stand-ins of the inputs
    # compiles code per size (the compile backend): it may compile in another process, load
    # stored code (``load``) and foresee its compiles (``compiles_ahead``); a manager asks this,
    # never the backend's name
    compiles_code: bool
    replays_on_device: bool  # replays recorded device work (a CUDA graph): CUDA inputs, its own pool
    stores_code: bool  # loads and stores compiled code (the compiled-code store)

    @staticmethod
    def expected_compiles(pending: int) -> int:
        """Compiles a fresh backend of this kind would run for ``pending`` sizes (0: it compiles nothing)."""
        ...

    @staticmethod
    def prepare_background() -> None:
        """Run in the serving thread before another thread captures or compiles."""
        ...

    def warmup(self, fn: FlatStep, args: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        """Run ``fn`` eagerly once at the largest size (side stream on CUDA)."""
        ...

    def capture(self, size: int, fn: FlatStep, args: tuple[Tensor, ...]) -> CapturedGraph:
        """Record ``fn`` over ``args`` (the static views with ``size`` rows) into the shared pool."""
        ...

    def release(self) -> None:
        """Free the shared pool and stream; idempotent."""
        ...


class CompilesNothing:
    """The `GraphBackend` capabilities of a backend that compiles nothing (cuda, trace, eager);
    the compile backend overrides them."""

    compiles_code = False
    stores_code = False

    @staticmethod
    def expected_compiles(pending: int) -> int:
        """A fresh backend of this kind compiles nothing for ``pending`` sizes."""
        return 0

    @staticmethod
    def prepare_background() -> None:
        """Nothing to prepare before another thread captures."""


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
