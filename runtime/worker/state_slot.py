"""`StateSlot`: the one owner of what a worker serves, and how that changes.

A worker, its reload machinery and an adaptive controller all need the same four things:
the lock that orders steps against reconfiguration, the active `RuntimeState`, the args it
was built from with their generation (bumped by every committed reload), and a reload
requested for the next step. The slot owns them and offers a small interface: read them,
`switch` (same generation, an adaptive step change), `commit` (new args, next generation)
and `request` / `take_request` (a reload handed to the serving thread).

A host that drives the worker step by step (the engine) marks the slot `hosted`: reloads
then reach the worker only through `request` and are taken at the host's step boundary, never
inside a draft step, and the host marks the thread and span of its step (`enter_step`), the
only place where reloads may run.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import TYPE_CHECKING

from draftgraph.runtime.config import RuntimeArgs

if TYPE_CHECKING:
    from draftgraph.runtime.worker.state import RuntimeState

__all__ = ["StateSlot"]


class StateSlot:
    """Lock, active state, args + generation, pending reload of one worker."""

    __slots__ = ("_args", "_committed", "_generation", "_pending", "_state", "_step_thread", "host", "lock",
                 "superseded", "superseded_unreported")

    def __init__(self, args: RuntimeArgs, state: RuntimeState) -> None:
        self.lock = threading.RLock()  # steps, overrides, switches and reloads take it
        self._args = args
        self._state = state
        self._committed = state  # the state this generation began with (a switch may leave it)
        self._generation = 0
        self._pending: tuple[RuntimeArgs, str] | None = None
        self.host: str | None = None  # who drives the steps (an engine), None: the worker itself
        self._step_thread: int | None = None  # the host thread inside its step, if any
        # (superseded, superseding) requests not yet reported: appended by `request` (maybe in a
        # signal handler, where logging is not safe), reported by the serving thread
        self.superseded: deque[tuple[tuple[RuntimeArgs, str], tuple[RuntimeArgs, str]]] = deque(maxlen=64)
        self.superseded_unreported = 0  # how many since the last report (the deque keeps 64)

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

    def commit(self, args: RuntimeArgs, state: RuntimeState) -> tuple[RuntimeState, ...]:
        """Make ``state`` (built from ``args``) active and start the next generation; returns
        the states the ending generation leaves, which the caller releases: the previous active
        one, and the one that generation began with when a switch left it (an adaptive step
        change to a candidate: nothing else releases it, and no state of an older generation
        is ever served again)."""
        with self.lock:
            previous, began = self._state, self._committed
            self._args, self._state, self._generation = args, state, self._generation + 1
            self._committed = state
            return (previous,) if began is previous else (previous, began)

    def request(self, args: RuntimeArgs, policy: str) -> tuple[RuntimeArgs, str] | None:
        """Record a reload for the serving thread (reference writes and a deque append: safe
        from a signal handler); a later request supersedes an earlier one not yet taken, which
        is returned (and queued in `superseded` for the serving thread to report)."""
        new = (args, policy)
        previous, self._pending = self._pending, new
        if previous is not None:
            self.superseded.append((previous, new))
            self.superseded_unreported += 1
        return previous

    def take_request(self) -> tuple[RuntimeArgs, str] | None:
        """The pending reload, now cleared (None when there is none)."""
        pending, self._pending = self._pending, None
        return pending

    # ---- a host's step -------------------------------------------------------------------------
    def enter_step(self) -> None:
        """The host's thread starts a step: reloads may run in this thread until `leave_step`."""
        self._step_thread = threading.get_ident()

    def leave_step(self) -> None:
        """The host's step ended."""
        self._step_thread = None

    def in_host_step(self) -> bool:
        """True when the calling thread is the host's, inside one of its steps."""
        return self._step_thread == threading.get_ident()
