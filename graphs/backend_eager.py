"""``eager`` backend: no capture at all; the manager calls the step on each batch as given.

It is the reference (what a graph must match) and the choice when capture is disabled.
The manager counts its runs as ``eager_runs`` (not replays, not eager fallbacks).
"""

from __future__ import annotations

from torch import Tensor

from .core.protocol import CapturedGraph, CompilesNothing, FlatStep

__all__ = ["EagerBackend"]


class EagerBackend(CompilesNothing):
    """Backend that captures nothing (``captures`` is False)."""

    name = "eager"
    captures = False
    records_on_copies = False
    replays_on_device = False

    def warmup(self, fn: FlatStep, args: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        """Run ``fn`` once."""
        return fn(*args)

    def capture(self, size: int, fn: FlatStep, args: tuple[Tensor, ...]) -> CapturedGraph:
        """Not supported: the eager backend runs steps directly."""
        raise RuntimeError(f"backend 'eager' does not capture graphs (asked for size {size})")

    def release(self) -> None:
        """Nothing to free."""
