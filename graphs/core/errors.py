"""Exceptions raised by graph capture, replay and debug checks."""

from __future__ import annotations

__all__ = ["GraphCaptureError", "GraphDebugError"]


class GraphCaptureError(RuntimeError):
    """Capturing a step failed at one batch size; the cause is chained (``__cause__``)."""

    def __init__(self, message: str, *, size: int | None = None) -> None:
        super().__init__(message)
        self.size = size


class GraphDebugError(RuntimeError):
    """A debug-mode check found a replay that disagrees with its capture or with eager."""
