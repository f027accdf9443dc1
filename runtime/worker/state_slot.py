"""`StateSlot`: the one owner of what a worker serves, and how that changes.

A worker, its reload machinery and an adaptive controller all need the same four things:
the lock that orders steps against reconfiguration, the active `RuntimeState`, the args it
was built from with their generation (bumped by every committed reload), and a reload
requested for the worker's own next step (`requests`, a `PendingReload`; a host holds its
own). The slot owns them and offers a small interface: read them, `switch` (same generation,
an adaptive step change) and `commit` (new args, next generation).

A host that drives the worker step by step (the engine) names itself in `host`: reloads then
reach the worker only as requests the host holds and applies at its step boundary, never
inside a draft step, and the host marks the thread and span of its step (`enter_step`), the
only place where reloads may run.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from draftgraph.runtime.config import RuntimeArgs

if TYPE_CHECKING:
    from draftgraph.runtime.worker.state import RuntimeState

__all__ = ["PendingReload", "ReloadRequest", "StateSlot"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReloadRequest:
    """A reload checked by `Reloads.request` / `Reloads.check` (arguments, the host's limits,
    the memory budget): nothing was built; `Reloads.commit` / `prepare` take it unchecked."""

    args: RuntimeArgs
    policy: str


class PendingReload:
    """The one reload request waiting for the serving thread. `hold` is reference writes and a
    deque append (safe from a signal handler); a newer request supersedes one not yet taken,
    and `take` (the serving thread) logs which by which."""

    __slots__ = ("_request", "_superseded", "_unreported")

    def __init__(self) -> None:
        self._request: ReloadRequest | None = None
        self._superseded: deque[tuple[ReloadRequest, ReloadRequest]] = deque(maxlen=64)
        self._unreported = 0  # superseded since the last report (the deque keeps 64)

    @property
    def request(self) -> ReloadRequest | None:
        """The request waiting, if any."""
        return self._request

    def hold(self, request: ReloadRequest) -> ReloadRequest | None:
        """Keep ``request`` for the next `take`; returns the one it supersedes, if any."""
        previous, self._request = self._request, request
        if previous is not None:
            self._superseded.append((previous, request))
            self._unreported += 1
        return previous

    def take(self) -> ReloadRequest | None:
        """The waiting request, now cleared (None: none); the requests it superseded are logged
        here, on the serving thread."""
        unreported, self._unreported = self._unreported, 0
        listed = 0
        while self._superseded:
            old, new = self._superseded.popleft()
            listed += 1
            logger.warning("reload request to %s (%s) superseded by %s (%s) before it was applied",
                           old.args.speculative, old.policy, new.args.speculative, new.policy)
        if unreported > listed:
            logger.warning("%d more reload requests were superseded before they were applied "
                           "(not listed; the latest %d are)", unreported - listed, listed)
        request, self._request = self._request, None
        return request


class StateSlot:
    """Lock, active state, args + generation, pending reload of one worker."""

    __slots__ = ("_args", "_committed", "_generation", "_state", "_step_thread", "host", "lock", "requests")

    def __init__(self, args: RuntimeArgs, state: RuntimeState) -> None:
        self.lock = threading.RLock()  # steps, overrides, switches and reloads take it
        self._args = args
        self._state = state
        self._committed = state  # the state this generation began with (a switch may leave it)
        self._generation = 0
        self.requests = PendingReload()  # a reload for the worker's own next step (no host)
        self.host: str | None = None  # who drives the steps (an engine), None: the worker itself
        self._step_thread: int | None = None  # the host thread inside its step, if any

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
    def pending(self) -> ReloadRequest | None:
        """The reload requested for the worker's own next step, if any."""
        return self.requests.request

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
