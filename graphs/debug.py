"""Debug mode: replay-time checks that static inputs were not rebound and graphs still match eager.

Switched on by ``DRAFTGRAPH_DEBUG=1`` (read when a manager is built) or the manager's
``debug=True``. Every replay then checks each static input's ``data_ptr()`` against
the one captured; every Nth replay (``debug_every``, env ``DRAFTGRAPH_DEBUG_EVERY``,
default 16) also runs the step eagerly on clones of the padded inputs and compares
the outputs bitwise. A mismatch usually means baked control flow (a Python value the
step reads changed after capture) or a buffer the graph reads was replaced.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from .core.errors import GraphDebugError
from .core.settings import DEFAULT_DEBUG_EVERY, debug_enabled, debug_every

__all__ = ["DEFAULT_DEBUG_EVERY", "DebugConfig", "check_data_ptrs", "compare_outputs"]

def _check_every(field: str, value: object) -> int:
    """A positive int for the comparison period."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{field}={value!r}: must be an int >= 1")
    return value


@dataclass(frozen=True)
class DebugConfig:
    """Whether debug checks run, and every how many replays the eager comparison runs."""

    enabled: bool = False
    every: int = DEFAULT_DEBUG_EVERY

    def __post_init__(self) -> None:
        _check_every("debug_every", self.every)

    @classmethod
    def resolve(cls, debug: bool | None, every: int | None) -> DebugConfig:
        """Explicit arguments win; None falls back to DRAFTGRAPH_DEBUG / DRAFTGRAPH_DEBUG_EVERY."""
        if debug is not None and not isinstance(debug, bool):
            raise TypeError(f"debug={debug!r}: must be a bool or None")
        enabled = debug_enabled() if debug is None else debug
        if every is None:
            every = debug_every()
        return cls(enabled=enabled, every=every)

    def compare_due(self, replay_index: int) -> bool:
        """True on replays every, 2*every, ... (replay_index counts from 1)."""
        return self.enabled and replay_index % self.every == 0


def check_data_ptrs(captured: Mapping[str, int], current: Mapping[str, int]) -> None:
    """GraphDebugError naming the first static input whose data_ptr changed since capture."""
    for name, ptr in captured.items():
        now = current.get(name, 0)
        if now != ptr:
            raise GraphDebugError(
                f"static input {name!r} moved: data_ptr {now:#x} at replay, {ptr:#x} at capture; "
                "the graph still reads the old memory. Never rebind, resize or set_() a static "
                "input while its graphs live; copy into it instead (or release() and capture again)"
            )


def compare_outputs(graph_outs: tuple[Tensor, ...], eager_outs: tuple[Tensor, ...], size: int) -> None:
    """GraphDebugError naming the first output index where the graph and eager differ bitwise."""
    if len(graph_outs) != len(eager_outs):
        raise GraphDebugError(
            f"size {size}: graph returned {len(graph_outs)} outputs, eager {len(eager_outs)}"
        )
    for i, (g, e) in enumerate(zip(graph_outs, eager_outs)):
        if g.shape != e.shape or g.dtype != e.dtype or not torch.equal(g, e):
            raise GraphDebugError(
                f"size {size}: output {i} of the graph differs from eager (graph {tuple(g.shape)} {g.dtype}, "
                f"eager {tuple(e.shape)} {e.dtype}); the step likely depends on Python state or "
                "control flow that was baked at capture"
            )
