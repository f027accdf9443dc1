"""One CUDA memory pool and one capture stream shared by several graph managers.

A runtime state captures several steps (the draft decode step and the host's phases: target
verify, draft extend). Captured into one pool on one stream, later graphs reuse the blocks the
earlier ones freed while capturing, so a state's graphs together take about the memory of its
largest, as the sizes of one manager already do. Every graph's outputs stay allocated while its
manager holds them, so a replay never overwrites another graph's outputs; the graphs replay one
after another on the serving stream, never concurrently. Other backends ignore the share.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["CaptureShare"]


class CaptureShare:
    """The pool handle and capture stream of one device, created at the first CUDA capture that
    asks for them (a share that only ever serves CPU backends allocates nothing)."""

    def __init__(self) -> None:
        self._device: torch.device | None = None
        self._pool: Any = None
        self._stream: Any = None

    def pool_and_stream(self, device: torch.device) -> tuple[Any, Any]:
        """(pool handle, capture stream) for ``device``; ValueError for a second device."""
        if self._device is None:
            self._device = device
            self._pool = torch.cuda.graph_pool_handle()
            self._stream = torch.cuda.Stream(device=device)
        elif device != self._device:
            raise ValueError(f"device={device}: this capture share serves {self._device} (one pool per device)")
        return self._pool, self._stream

    @property
    def device(self) -> torch.device | None:
        """The device of the shared pool (None before any CUDA capture)."""
        return self._device
