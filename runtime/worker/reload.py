"""Live reconfiguration of a serving worker, as one transaction: request, prepare, commit or discard.

A reload runs under the worker's lock, so steps of other threads wait for it and then run on
the new state; a step never sees a half-built state.

- `request` / `check`: every check, in one place (`check`: the args' type and policy, the
  worker's own rules, the host's limits, the memory budget); nothing is built and nothing is
  counted. `request` then hands the checked `ReloadRequest` to the host that drives the worker
  (`ReloadHost.hold_reload`: the engine's step boundary holds it), or keeps it for the worker's
  own next step. Safe from a signal handler.
- `prepare` builds (and captures) the new state aside: a `PreparedState`; the active one keeps
  serving. `commit` swaps it in (or, given a request, prepares and swaps under one lock hold);
  `discard` releases it. A failure leaves the previous state serving.
- One record per reload in `log` (`ReloadLog`), counted once: when its transaction opens
  (`prepare`, or the build inside `commit`), or, for one that never opened, when it ends
  (superseded before it was taken). A host stamps each record with its own step, and its
  statistics read `ReloadLog.recent` from here: there is no second log.

`Reloads` is given its collaborators as objects: the `StateSlot`, the worker's `StateFactory`
(its args rules and how it builds a state), the `StateBudget` and the `StateCapture`.
"""

from __future__ import annotations

import gc
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from draftgraph.graphs import span
from draftgraph.runtime.config import RuntimeArgs
from draftgraph.runtime.validation import ConfigTypeError
from draftgraph.runtime.worker.reload_log import ReloadLog
from draftgraph.runtime.worker.reload_types import CommitStatus, PreparedState, ReloadError, ReloadHost, StateFactory
from draftgraph.runtime.worker.state_slot import ReloadRequest, StateSlot

if TYPE_CHECKING:
    from draftgraph.runtime.worker.budget import StateBudget
    from draftgraph.runtime.worker.state_capture import StateCapture

__all__ = ["RELOAD_POLICIES", "Reloads"]

logger = logging.getLogger(__name__)

RELOAD_POLICIES = ("swap", "release_first")


class Reloads:
    """The reload transaction of one worker (see the module docstring)."""

    def __init__(self, slot: StateSlot, states: StateFactory, budget: StateBudget, capture: StateCapture) -> None:
        self.slot = slot
        self.log = ReloadLog()
        self._states = states
        self._budget = budget
        self._capture = capture
        self._host: ReloadHost | None = None
        self._host_checks: tuple[Callable[[RuntimeArgs], None], ...] = ()
        self._capturing: tuple[ReloadRequest, PreparedState] | None = None  # a background commit's build

    def add_check(self, check: Callable[[RuntimeArgs], None]) -> None:
        """Add a host's own limit (a drafter's layer count, an engine's widest tree) to `check`:
        ``check(args)`` raises ValueError / TypeError naming the field and the limit."""
        if not callable(check):
            raise ConfigTypeError(f"check={check!r}: must be callable")
        self._host_checks = (*self._host_checks, check)

    def attach_host(self, host: ReloadHost) -> None:
        """Declare that ``host`` drives this worker's steps: requests are handed to it
        (`ReloadHost.hold_reload`) and applied at its step boundary, never inside a draft step;
        a direct `reload` / `prepare` / `commit` / override outside its step is refused with an
        error naming `request_reload`."""
        for member in ("name", "hold_reload", "reload_stamp"):
            if not hasattr(host, member):
                raise ConfigTypeError(f"host={type(host).__name__}: needs {member} (a ReloadHost)")
        self._host = host
        self.slot.host = str(host.name)

    @property
    def history(self) -> deque[dict[str, Any]]:
        """The latest reload records (policy, seconds, ok, error, capture_s, capture_bytes)."""
        return self.log.history

    def check(self, new_args: Any, policy: str = "swap") -> ReloadRequest:
        """Every check a reload to ``new_args`` must pass (the same as construction, the host's
        limits and the memory budget included), without changing anything: ValueError /
        TypeError naming the field and the limit. The checked request."""
        if not isinstance(new_args, RuntimeArgs):
            raise ConfigTypeError(f"new_args={type(new_args).__name__}: must be a RuntimeArgs")
        if policy not in RELOAD_POLICIES:
            raise ValueError(f"policy={policy!r}: must be one of {list(RELOAD_POLICIES)}")
        self._states.check_args(new_args)
        for check in self._host_checks:
            check(new_args)
        self._budget.check_state(new_args, new_args.speculative)
        return ReloadRequest(new_args, policy)

    def request(self, new_args: RuntimeArgs, policy: str = "swap") -> None:
        """Check now (nothing is left pending when a check fails); the reload runs at the host's
        next step boundary (or this worker's next step). A newer request supersedes one not
        yet applied: counted here, logged by the serving thread."""
        request = self.check(new_args, policy)
        host = self._host
        previous = host.hold_reload(request) if host is not None else self.slot.requests.hold(request)
        if previous is not None:
            self.log.count_superseded(opened=False)

    def require_direct(self, what: str) -> None:
        """Refuse a direct reload call while a host drives this worker, outside its step."""
        slot = self.slot
        if slot.host is not None and not slot.in_host_step():
            raise ReloadError(
                f"{what}: this worker is driven by {slot.host}, and a direct {what} would race "
                f"its steps; call request_reload (the host's or this worker's): it is applied at "
                f"the next step boundary")

    def reload(self, new_args: RuntimeArgs, policy: str = "swap", backend: str | None = None) -> None:
        """Replace the active state with one built from ``new_args`` now: `prepare` then `commit`
        under one lock hold (``swap``: build, swap, release the old state; ``release_first``:
        release the old graphs first, serving eager if the build fails)."""
        self.require_direct("reload")
        request = self.check(new_args, policy)
        with self.slot.lock, span("reload", policy=policy):
            self._swap(self._build(request, backend))

    def prepare(self, new: RuntimeArgs | ReloadRequest, policy: str = "swap", backend: str | None = None, *,
                background: bool = False, graphs: bool = True) -> PreparedState:
        """Build and capture the new state aside (``new``: args, checked here, or a checked
        `ReloadRequest`, whose own policy holds); the active state keeps serving
        (``release_first`` releases its graphs first). ``background=True`` queues the capture:
        commit when `PreparedState.ready`. ``graphs=False``: no graphs (a host serving states
        of its own). ReloadError when the build fails. Finish with `commit` or `discard`."""
        self.require_direct("prepare_reload")
        request = new if isinstance(new, ReloadRequest) else self.check(new, policy)
        with self.slot.lock, span("reload_prepare", policy=request.policy):
            return self._build(request, backend, background, graphs)

    def commit(self, prepared: PreparedState | ReloadRequest, *, backend: str | None = None,
               graphs: bool = True, background: bool = False, land: bool = False) -> CommitStatus:
        """Swap a prepared state in (O(1), no capture) and release the old one; given a checked
        `ReloadRequest`, build it first under the same lock hold (one transaction). ReloadError,
        the previous state serving, when the build fails or the worker was reloaded since.

        ``background=True`` (a request): its graphs are captured off the serving thread, so the
        host calls again, at each step boundary, with the request it holds: the first call
        builds the state aside (discarding, as superseded, one built for an older request), and
        each call swaps it in once its graphs are ready, else returns ``HOLDING``; ``land=True``
        swaps it in whatever is pending (``LANDED_UNREADY``: the missing sizes serve eager until
        captured). ``release_first`` commits at the first call; a failed capture discards it."""
        self.require_direct("commit_reload")
        if background:
            if not isinstance(prepared, ReloadRequest):
                raise ConfigTypeError(f"prepared={type(prepared).__name__}: background=True commits a ReloadRequest")
            return self._commit_background(prepared, backend, graphs, land)
        policy = prepared.policy
        with self.slot.lock:
            if isinstance(prepared, ReloadRequest):  # the same two ranges as prepare, then commit
                with span("reload_prepare", policy=policy):
                    prepared = self._build(prepared, backend, False, graphs)
            self._commit_built(prepared)
        return CommitStatus.COMMITTED

    @property
    def capturing_state(self) -> Any:
        """The state a background `commit` is capturing aside (not serving yet), or None."""
        held = self._capturing  # read once: the serving thread may clear it meanwhile
        return held[1].state if held is not None else None

    def _commit_background(self, request: ReloadRequest, backend: str | None, graphs: bool,
                           land: bool) -> CommitStatus:
        held = self._capturing
        if held is None or held[0] is not request:
            self._capturing = None
            if held is not None:  # a newer request supersedes one still capturing
                self.discard(held[1], f"superseded by a reload to {request.args.speculative}", superseded=True)
            with self.slot.lock, span("reload_prepare", policy=request.policy):
                prepared = self._build(request, backend, True, graphs)
            if request.policy == "release_first":  # swapped in now, eager until its graphs are ready
                with self.slot.lock:
                    self._commit_built(prepared)
                return CommitStatus.COMMITTED
            held = self._capturing = (request, prepared)
        prepared = held[1]
        ready = prepared.ready
        if not ready and not land:
            return CommitStatus.HOLDING
        self._capturing = None
        with span("commit_reload"):
            failed = prepared.failed_sizes
            if failed:  # build-then-swap stays transactional
                reason = f"capture failed at sizes {sorted(failed)}: {next(iter(failed.values()))}"
                self.discard(prepared, reason)
                raise ReloadError(reason)
            with self.slot.lock:
                self._commit_built(prepared)
        return CommitStatus.COMMITTED if ready else CommitStatus.LANDED_UNREADY

    def _commit_built(self, prepared: PreparedState) -> None:
        """Swap a built state in, or discard it when stale; the caller holds the lock."""
        with span("reload_commit", policy=prepared.policy):
            try:
                self._swap(prepared)
            except ReloadError as exc:
                self.discard(prepared, str(exc))
                raise

    def discard(self, prepared: PreparedState, reason: str, *, superseded: bool = False) -> None:
        """Release a prepared state and record ``reason`` (failed, or superseded when a newer
        reload replaces it)."""
        with self.slot.lock:
            prepared.state.release()
            if superseded:
                self.log.count_superseded(opened=True)
                logger.warning("reload to %s (%s) superseded while it was prepared: %s",
                               prepared.args.speculative, prepared.policy, reason)
            else:
                self._record(prepared.policy, prepared.start, False, reason)

    def _record(self, policy: str, start: float, ok: bool, error: str | None, state: Any = None) -> None:
        stamp = self._host.reload_stamp() if self._host is not None else None
        self.log.record(policy, start, ok, error, state, stamp=stamp)

    def _build(self, request: ReloadRequest, backend: str | None, background: bool = False,
               graphs: bool = True) -> PreparedState:
        """Open the reload (counted) and build its state; the caller holds the lock."""
        self.log.opened()
        new_args, policy = request.args, request.policy
        old = self.slot.active
        if not graphs:
            backend = None
        elif backend is None:  # the worker's backend, whatever the current state has (none after
            # a failed release_first reload)
            backend = self._capture.backend
            if backend is None and old.graphs is not None:
                backend = old.graphs.backend_name
        generation = self.slot.generation
        start = time.perf_counter()
        if policy == "release_first":
            old.release()
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        try:
            new = self._states.new_state(new_args, generation + 1)
            if backend is not None:
                self._capture.build(new, backend, background)
        except Exception as exc:
            self._record(policy, start, False, repr(exc))
            serving = "the old state keeps serving" + (
                " eager (its graphs were released first)" if policy == "release_first" else "")
            raise ReloadError(f"reload ({policy}) to {new_args.speculative} failed; {serving}: "
                              f"{exc}") from exc
        return PreparedState(new_args, policy, new, generation, start)

    def _swap(self, prepared: PreparedState) -> None:
        """Swap in a prepared state; the caller holds the lock."""
        slot = self.slot
        if prepared.generation != slot.generation:
            raise ReloadError(f"prepared reload to {prepared.args.speculative} is stale: prepared at "
                              f"generation {prepared.generation}, the worker is at {slot.generation}")
        for old in slot.commit(prepared.args, prepared.state):
            old.release()
        self._record(prepared.policy, prepared.start, True, None, prepared.state)
        logger.info("reloaded to %s (%s) in %.3f s", prepared.args.speculative, prepared.policy,
                    self.history[-1]["seconds"])

    def apply_pending(self) -> None:
        """Run a requested reload (a worker without a host, at the start of its step); a
        failure is logged and recorded, serving goes on."""
        if self._host is not None:  # the host applies it at its step boundary
            return
        request = self.slot.requests.take()
        if request is None:
            return
        try:
            with self.slot.lock, span("reload", policy=request.policy):
                self._swap(self._build(request, None))
        except ReloadError:
            logger.exception("requested reload failed")
