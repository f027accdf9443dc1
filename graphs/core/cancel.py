"""Cancelling a capture in progress: a recording stops at its next torch call once told to.

A capture unit records in a background thread (seconds for a symbolic recording); at process
exit or `stop` it must end within a second, not run on while the interpreter tears down (an
abort was seen: a recording cut off by finalization). Each capture thread runs its units inside
`cancel_scope(event)`; `HostSyncGuard`, the torch-function mode every recording runs under,
asks `cancel_requested` at each torch call and raises `CaptureCancelled`. The event lives in a
thread-local slot: one thread's scope never cancels another thread's capture.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from .errors import GraphCaptureError

__all__ = ["CaptureCancelled", "cancel_requested", "cancel_scope", "check_cancelled"]

_scope = threading.local()  # .event: the calling thread's cancel event (none outside a scope)


class CaptureCancelled(GraphCaptureError):
    """The capture was cancelled while recording (the queue stopped, or the process exits)."""


@contextmanager
def cancel_scope(event: threading.Event) -> Iterator[None]:
    """Captures in this thread stop (`CaptureCancelled`) once ``event`` is set."""
    previous = getattr(_scope, "event", None)
    _scope.event = event
    try:
        yield
    finally:
        _scope.event = previous


def cancel_requested() -> bool:
    """True when the calling thread's scope was cancelled."""
    event = getattr(_scope, "event", None)
    return event is not None and event.is_set()


def check_cancelled(size: int | None = None) -> None:
    """Raise `CaptureCancelled` when the calling thread's scope was cancelled (between the steps
    of a recording that make no torch call: waiting for the recording lock, setting up symbols)."""
    if cancel_requested():
        raise CaptureCancelled(f"capture at size {size} cancelled", size=size)
