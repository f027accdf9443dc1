"""Live reconfiguration of a serving worker: build-then-swap or release-first, thread-safe.

A reload runs under the worker's lock, so steps of other threads wait for it and then run on
the new state; a step never sees a half-built state. `request_reload` only records the request
(safe from a signal handler); the serving thread applies it at the start of its next step.

`Reloads` is an object its worker holds (not a mixin): it is given the worker's `slot`
(`StateSlot`: lock, active state, args, generation, pending request) and its hooks:
``check_args(args)`` and ``check_memory(args)`` (the worker's own checks; the host's run
between them), ``build_state(args, generation, backend, background)`` and ``backend()``.
It keeps the `ReloadLog`.

When an engine drives the worker (`attach_host`), every reload reaches it the same way: a
request (the engine's, the worker's own, a signal handler's) taken at the engine's step
boundary; direct calls outside the engine's step are refused. A host adds its own limits to
the checks with `add_check`, so a reload it cannot serve is refused when requested.
"""

from __future__ import annotations

import gc
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from draftgraph.graphs import span
from draftgraph.runtime.config import RuntimeArgs
from draftgraph.runtime.validation import ConfigTypeError
from draftgraph.runtime.worker.state_slot import StateSlot

__all__ = ["PreparedReload", "ReloadError", "ReloadLog", "Reloads", "RELOAD_POLICIES"]

logger = logging.getLogger(__name__)

RELOAD_POLICIES = ("swap", "release_first")


class ReloadError(RuntimeError):
    """A reload failed; the cause is chained and the worker state is described in the message."""


@dataclass(frozen=True)
class PreparedReload:
    """A state built aside by `Reloads.prepare`: not serving until committed."""

    args: RuntimeArgs
    policy: str
    state: Any
    generation: int  # the worker's generation it was prepared against
    start: float  # perf_counter at the start of the prepare

    @property
    def ready(self) -> bool:
        """True when no capture unit of the new state is pending (always, unless prepared with
        ``background=True``)."""
        graphs = self.state.graphs
        return graphs is None or not graphs.pending_sizes

    @property
    def failed_sizes(self) -> dict[int, str]:
        """Sizes whose queued capture failed (they would serve eager)."""
        graphs = self.state.graphs
        return graphs.failed_sizes if graphs is not None else {}


class ReloadLog:
    """Reload outcomes of one worker: totals for its whole life (requested, applied, failed,
    superseded) and the records of the latest ``keep`` reloads only, so a long-running server
    does not grow."""

    __slots__ = ("failed", "history", "requested", "succeeded", "superseded")

    def __init__(self, keep: int = 64) -> None:
        self.history: deque[dict[str, Any]] = deque(maxlen=keep)
        self.requested = 0  # request_reload calls accepted, direct reloads and prepares
        self.succeeded = 0  # applied
        self.failed = 0
        self.superseded = 0  # replaced by a newer request before they were applied

    def record(self, policy: str, start: float, ok: bool, error: str | None, state: Any = None) -> None:
        """Count one reload and keep its record."""
        if ok:
            self.succeeded += 1
        else:
            self.failed += 1
        self.history.append({
            "policy": policy, "seconds": time.perf_counter() - start, "ok": ok, "error": error,
            "capture_s": state.capture_s if state is not None else 0.0,
            "capture_bytes": state.capture_bytes if state is not None else 0,
        })

    def totals(self) -> dict[str, int]:
        """Lifetime counts: requested, applied, failed, superseded."""
        return {"requested": self.requested, "applied": self.succeeded, "failed": self.failed,
                "superseded": self.superseded}


class Reloads:
    """`reload` / `request` / two-phase `prepare` + `commit` of one worker's state, through the
    interface in the module docstring. ``backend()`` is the worker's graph backend (None: none
    chosen yet), which a reload captures with unless told otherwise."""

    def __init__(self, slot: StateSlot, check_args: Callable[[RuntimeArgs], None],
                 check_memory: Callable[[RuntimeArgs], None],
                 build_state: Callable[[RuntimeArgs, int, str | None, bool], Any],
                 backend: Callable[[], str | None]) -> None:
        self.slot = slot
        self.log = ReloadLog()
        self._check_args = check_args
        self._check_memory = check_memory  # after the host's checks, before anything is built
        self._build_state = build_state
        self._backend = backend
        self._host_checks: tuple[Callable[[RuntimeArgs], None], ...] = ()

    def add_check(self, check: Callable[[RuntimeArgs], None]) -> None:
        """Add a host's own limit (a drafter's layer count, an engine's widest tree) to the
        checks every reload path runs before anything changes: ``check(args)`` raises
        ValueError / TypeError naming the field and the limit."""
        if not callable(check):
            raise ConfigTypeError(f"check={check!r}: must be callable")
        self._host_checks = (*self._host_checks, check)

    def attach_host(self, name: str) -> None:
        """Declare that ``name`` (an engine) drives this worker's steps: requested reloads are
        then applied at its step boundary (`take_request`), never inside a draft step, and a
        direct `reload` / `prepare` / `commit` / override outside the host's step is refused
        with an error naming `request_reload`."""
        self.slot.host = str(name)

    @property
    def history(self) -> deque[dict[str, Any]]:
        """The latest reload records (policy, seconds, ok, error, capture_s, capture_bytes)."""
        return self.log.history

    def check(self, new_args: Any, policy: str = "swap") -> None:
        """Run every check a reload to ``new_args`` must pass (the same as construction, the
        host's limits included) without changing anything: ValueError / TypeError naming the
        field and the limit. Hosts call it before queueing a request of their own."""
        if not isinstance(new_args, RuntimeArgs):
            raise ConfigTypeError(f"new_args={type(new_args).__name__}: must be a RuntimeArgs")
        if policy not in RELOAD_POLICIES:
            raise ValueError(f"policy={policy!r}: must be one of {list(RELOAD_POLICIES)}")
        self._check_args(new_args)
        for check in self._host_checks:
            check(new_args)
        self._check_memory(new_args)

    def require_direct(self, what: str) -> None:
        """Refuse a direct reload call while a host drives this worker, outside its step."""
        slot = self.slot
        if slot.host is not None and not slot.in_host_step():
            raise ReloadError(
                f"{what}: this worker is driven by {slot.host}, and a direct {what} would race "
                f"its steps; call request_reload (the host's or this worker's): it is applied at "
                f"the next step boundary")

    def reload(self, new_args: RuntimeArgs, policy: str = "swap", backend: str | None = None) -> None:
        """Replace the active state with one built from ``new_args``.

        ``swap``: build (and capture) the new state, swap it in, then release the old one; on
        failure the old state keeps serving and ReloadError (cause chained) is raised.
        ``release_first``: release the old graphs, gc + empty the CUDA cache, then build (lower
        peak memory); on failure the old configuration keeps serving eager until a later reload
        succeeds. Graphs are captured when the old state had some (same backend) or ``backend``
        is given. Equivalent to `prepare` then `commit` under one lock hold.
        """
        self.check(new_args, policy)
        self.require_direct("reload")
        self.log.requested += 1
        self._reload_now(new_args, policy, backend)

    def _reload_now(self, new_args: RuntimeArgs, policy: str, backend: str | None = None) -> None:
        """`reload` of checked (and counted) args."""
        with self.slot.lock, span("reload", policy=policy):
            self._commit(self._prepare(new_args, policy, backend))

    def prepare(self, new_args: RuntimeArgs, policy: str = "swap", backend: str | None = None, *,
                background: bool = False, requested: bool = False, graphs: bool = True) -> PreparedReload:
        """Phase one of a two-phase reload (several ranks): build and capture the new state
        aside; the active state keeps serving (``release_first`` releases its graphs first).
        ``background=True`` queues the capture instead (`capture_graphs`): commit when
        `PreparedReload.ready`. Raises ReloadError like `reload`. Finish with `commit` or
        `discard`. ``requested=True``: the reload was already counted by `request` (a host
        applying a request it took). ``graphs=False``: the new state gets no graphs (a host
        that serves other states of its own, a schedule's band states)."""
        self.require_direct("prepare_reload")
        try:
            self.check(new_args, policy)
        except Exception as exc:
            if requested:  # counted when requested: its outcome is a failure
                self.log.record(policy, time.perf_counter(), ok=False, error=repr(exc))
            raise
        if not requested:
            self.log.requested += 1
        with self.slot.lock, span("reload_prepare", policy=policy):
            return self._prepare(new_args, policy, backend, background, graphs)

    def commit(self, prepared: PreparedReload) -> None:
        """Phase two: swap the prepared state in (O(1), no capture) and release the old one.

        Raises ReloadError (nothing changes) when the worker was reloaded since the prepare."""
        self.require_direct("commit_reload")
        with self.slot.lock, span("reload_commit", policy=prepared.policy):
            self._commit(prepared)

    def discard(self, prepared: PreparedReload, reason: str, *, superseded: bool = False) -> None:
        """Phase two when the ranks did not agree: release the prepared state, record ``reason``
        (counted as failed, or as superseded when a newer reload replaces it)."""
        with self.slot.lock:
            prepared.state.release()
            if superseded:
                self.log.superseded += 1
                logger.warning("reload to %s (%s) superseded while it was prepared: %s",
                               prepared.args.speculative, prepared.policy, reason)
            else:
                self.log.record(prepared.policy, prepared.start, ok=False, error=reason)

    def _prepare(self, new_args: RuntimeArgs, policy: str, backend: str | None,
                 background: bool = False, graphs: bool = True) -> PreparedReload:
        """Build (and capture) the new state; the caller holds the lock and checked the args."""
        old = self.slot.active
        if not graphs:
            backend = None
        elif backend is None:  # the worker's backend, whatever the current state has (none after
            # a failed release_first reload)
            backend = self._backend()
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
            new = self._build_state(new_args, generation + 1, backend, background)
        except Exception as exc:
            self.log.record(policy, start, ok=False, error=repr(exc))
            serving = "the old state keeps serving" + (
                " eager (its graphs were released first)" if policy == "release_first" else "")
            raise ReloadError(f"reload ({policy}) to {new_args.speculative} failed; {serving}: "
                              f"{exc}") from exc
        return PreparedReload(new_args, policy, new, generation, start)

    def _commit(self, prepared: PreparedReload) -> None:
        """Swap in a prepared state; the caller holds the lock."""
        slot = self.slot
        if prepared.generation != slot.generation:
            raise ReloadError(f"prepared reload to {prepared.args.speculative} is stale: prepared at "
                              f"generation {prepared.generation}, the worker is at {slot.generation}")
        for old in slot.commit(prepared.args, prepared.state):
            old.release()
        self.log.record(prepared.policy, prepared.start, ok=True, error=None, state=prepared.state)
        logger.info("reloaded to %s (%s) in %.3f s", prepared.args.speculative, prepared.policy,
                    self.history[-1]["seconds"])

    def request(self, new_args: RuntimeArgs, policy: str = "swap") -> None:
        """Validate now (nothing is left pending when a check fails), reload at the start of the
        next step: the worker's own, or its host's step boundary (safe from signal handlers).
        A newer request supersedes one not yet applied; that is counted and logged."""
        self.check(new_args, policy)
        log = self.log
        log.requested += 1
        if self.slot.request(new_args, policy) is not None:
            log.superseded += 1

    def take_request(self) -> tuple[RuntimeArgs, str] | None:
        """For the serving thread: the pending request (args, policy), now cleared, or None;
        requests it superseded are logged here (not in a signal handler)."""
        slot = self.slot
        unreported, slot.superseded_unreported = slot.superseded_unreported, 0
        listed = 0
        while slot.superseded:
            (old_args, old_policy), (new_args, new_policy) = slot.superseded.popleft()
            listed += 1
            logger.warning("reload request to %s (%s) superseded by %s (%s) before it was applied",
                           old_args.speculative, old_policy, new_args.speculative, new_policy)
        if unreported > listed:
            logger.warning("%d more reload requests were superseded before they were applied "
                           "(not listed; the latest %d are)", unreported - listed, listed)
        return slot.take_request()

    def apply_pending(self) -> None:
        """Run a requested reload (a worker without a host, at the start of its step); a
        failure is logged and recorded, serving goes on."""
        if self.slot.host is not None:  # the host applies it at its step boundary
            return
        pending = self.take_request()
        if pending is None:
            return
        try:
            self._reload_now(*pending)
        except ReloadError:
            logger.exception("requested reload failed")
