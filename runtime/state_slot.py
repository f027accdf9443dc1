"""`StateSlot`: the one owner of what a worker serves, and how that changes.

A worker, its reload machinery and an adaptive controller all need the same four things:
the lock that orders steps against reconfiguration, the active `RuntimeState`, the args it
was built from with their generation (bumped by every committed reload), and a reload
requested for the next step. The slot owns them and offers a small interface: read them,
`switch` (same generation, an adaptive step change), `commit` (new args, next generation)
and `request` / `take_request` (a reload handed to the serving thread).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from .config import RuntimeArgs

if TYPE_CHECKING:
    from .state import RuntimeState

__all__ = ["StateSlot"]


class StateSlot:
    """Lock, active state, args + generation, pending reload of one worker."""

    __slots__ = ("_args", "_generation", "_pending", "_state", "lock")

    def __init__(self, args: RuntimeArgs, state: RuntimeState) -> None:
        self.lock = threading.RLock()  # steps, overrides, switches and reloads take it
        self._args = args
        self._state = state
        self._generation = 0
        self._pending: tuple[RuntimeArgs, str] | None = None

    @property
    def active(self) -> RuntimeState:
        """The state steps run under now."""
        return self._state

    @property
    def args(self) -> RuntimeArgs:
        """The arguments of the latest committed configuration."""
        return self._args

    @property
    def generation(self) -> int:
        """How many reloads were committed: states built under an older generation are stale."""
        return self._generation

    @property
    def pending(self) -> tuple[RuntimeArgs, str] | None:
        """The reload requested for the next step, if any: (args, policy)."""
        return self._pending

    def switch(self, state: RuntimeState) -> RuntimeState:
        """Make ``state`` active within the same generation; returns the previous one."""
        with self.lock:
            previous, self._state = self._state, state
            return previous

    def commit(self, args: RuntimeArgs, state: RuntimeState) -> RuntimeState:
        """Make ``state`` (built from ``args``) active and start the next generation; returns
        the previous state (the caller releases it)."""
        with self.lock:
            previous = self._state
            self._args, self._state, self._generation = args, state, self._generation + 1
            return previous

    def request(self, args: RuntimeArgs, policy: str) -> None:
        """Record a reload for the serving thread (one reference write: safe from a signal
        handler); a later request replaces an earlier one not yet taken."""
        self._pending = (args, policy)

    def take_request(self) -> tuple[RuntimeArgs, str] | None:
        """The pending reload, now cleared (None when there is none)."""
        pending, self._pending = self._pending, None
        return pending
