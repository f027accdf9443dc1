"""The step boundary: everything that changes what the engine serves happens here, between steps.

Draft weights (copied in place), reloads (the boundary holds the request: checked by the
worker's `Reloads.request`, from the engine, the worker's own `request_reload` or a signal
handler; proposed to every rank under a coordinator; then one `Reloads.commit`), a reload
prepared under background capture (swapped in once its graphs are ready, or dropped when one
failed), step-boundary capture units (CUDA), the coordinator's per-step poll, and the step policy
rebuilt for whatever the worker serves after a reload (DESIGN.md §14: one boundary for every
change). A reload that fails leaves the previous state serving and is recorded.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from draftgraph.graphs.spans import span
from draftgraph.runtime import ReloadError, RuntimeArgs
from draftgraph.runtime.schedule import SpeculationSchedule
from draftgraph.runtime.worker import DraftWorker, PendingReload, PreparedState, ReloadRequest

from .policy import StepPolicy, build_policy
from .stats import EngineStats

__all__ = ["StepBoundary", "CUDA_CAPTURE_BUDGET_S", "MAX_PREPARE_STEPS"]

logger = logging.getLogger(__name__)

CUDA_CAPTURE_BUDGET_S = 0.05  # step-boundary capture time per step (CUDA units)
MAX_PREPARE_STEPS = 4  # a swap reload waits this many steps for its graphs, then lands serving eager


class StepBoundary:
    """Reloads, weights, capture units and the coordinator of one engine's ``worker``.

    ``args`` is what the engine serves now (it follows the worker after every reload);
    ``policy`` the step policy for it; ``on_weights`` is called after an applied weights update
    (the drafter resets its carried state). It is the worker's `ReloadHost`: it holds the
    requests and stamps each reload record with the engine's step."""

    name = "a SpecDecodeEngine"

    def __init__(self, worker: DraftWorker, weights: Any, stats: EngineStats, args: RuntimeArgs,
                 schedule: SpeculationSchedule | None, adaptive_steps: tuple[int, ...], backend: str,
                 background: bool, on_weights: Callable[[], None]) -> None:
        self.worker = worker
        self.weights = weights
        self.stats = stats
        self.args = args
        self.schedule = schedule
        self.adaptive_steps = adaptive_steps
        self.backend = backend
        self.background = background
        self.on_weights = on_weights
        self.coordinator: Any = None
        self.served: list[int] = []  # generation served at every step (with a coordinator)
        self.pending = PendingReload()  # the request for the next boundary
        self.prepared: PreparedState | None = None  # a reload waiting for its graphs
        self.prepared_steps = 0  # boundaries the prepared reload has waited at
        self._generation_seen = worker.generation
        self.policy: StepPolicy = self._new_policy()
        # one way in: every reload of this worker (the engine's, its own request_reload, a
        # signal handler's) is held here, applied at our step boundary, checked against our limits
        worker.reloads.attach_host(self)

    def attach_coordinator(self, coordinator: Any) -> None:
        self.coordinator = coordinator
        self.policy.release()
        self.policy = self._new_policy()

    def scheduled(self, args: RuntimeArgs) -> bool:
        """True when a schedule will serve ``args`` (its band states capture; the args' own
        state needs no graphs)."""
        return args.schedule is not None or self.schedule is not None

    def _new_policy(self) -> StepPolicy:
        if self.args.schedule is not None:
            self.schedule = self.args.schedule
        return build_policy(self.worker, self.args, self.schedule, self.adaptive_steps, self.backend,
                            self.background, self.coordinator)

    def _renew_policy(self) -> None:
        self.policy.release()
        self.policy = self._new_policy()

    def states(self) -> list[Any]:
        """The active state, the policy's and a reload being prepared (no repeats)."""
        found = [self.worker.state, *self.policy.states()]
        if self.prepared is not None:
            found.append(self.prepared.state)
        out: list[Any] = []
        for s in found:
            if all(s is not o for o in out):
                out.append(s)
        return out

    # ---- at the boundary -----------------------------------------------------------------------
    def run(self) -> None:
        """Between steps: draft weights, reloads (requested, prepared, coordinated), step-boundary
        capture, and the engine following whatever its worker now serves."""
        if self.weights.pending:
            with self.worker.slot.lock, span("update_draft_weights"):
                if self.weights.apply_pending():
                    self.on_weights()
        self._take_reload()
        if self.prepared is not None:
            with span("commit_reload") if self.prepared.ready else contextlib.nullcontext():
                self._commit_prepared()
        queue = self.worker.capture.queue
        if self.background and not queue.threaded and queue.pending():
            self.worker.capture.run_pending(CUDA_CAPTURE_BUDGET_S)  # CUDA: units at step boundaries
        if self.coordinator is not None:
            self.served.append(self.coordinator.step())
        if self.worker.generation != self._generation_seen:  # reloaded past _follow (the coordinator)
            self._generation_seen = self.worker.generation
            self.args = self.worker.args
            self._renew_policy()

    # ---- the reload host ---------------------------------------------------------------------
    def hold_reload(self, request: ReloadRequest) -> ReloadRequest | None:
        """A checked request (`Reloads.request`): held for the next boundary, or proposed to
        every rank under a coordinator (ProposalRejected when one is waiting already); the
        request it supersedes, if any. Safe from a signal handler."""
        if self.coordinator is not None:
            self.coordinator.propose_reload(request.args, request.policy)
            return None
        return self.pending.hold(request)

    def reload_stamp(self) -> tuple[int, int]:
        """(epoch, step) of the engine's statistics, stamped on each reload record."""
        return self.stats.reload_stamp()

    def _take_reload(self) -> None:
        request = self.pending.take()
        if request is None:
            return
        if self.background:
            self._prepare(request)
            return
        self.policy.release()
        with span("apply_reload"):
            try:
                self.worker.reloads.commit(request, graphs=not self.scheduled(request.args))
            except ReloadError as exc:
                self._rejected(exc)
            else:
                self._follow(request.args)
        self._renew_policy()

    def _prepare(self, request: ReloadRequest) -> None:
        """Background capture: build the new state with queued graphs; ``release_first`` swaps
        now (eager until ready), ``swap`` when they are ready (`_commit_prepared`)."""
        if self.prepared is not None:  # a newer request supersedes one still capturing
            self.worker.reloads.discard(self.prepared, f"superseded by a reload to {request.args.speculative}",
                                       superseded=True)
            self.prepared = None
        self.prepared_steps = 0
        policy = request.policy
        if policy == "release_first":
            self.policy.release()
        try:
            prepared = self.worker.reloads.prepare(request, backend=self.backend, background=True,
                                                  graphs=not self.scheduled(request.args))
        except ReloadError as exc:
            self._rejected(exc)
            if policy == "release_first":
                self._renew_policy()
            return
        if policy == "release_first":
            self._commit(prepared)
        else:
            self.prepared = prepared

    def _commit(self, prepared: PreparedState) -> None:
        self.policy.release()
        try:
            self.worker.reloads.commit(prepared)  # a stale one is discarded there
        except ReloadError as exc:
            self._rejected(exc)
        else:
            self._follow(prepared.args)
        self._renew_policy()

    def _follow(self, args: RuntimeArgs) -> None:
        """The engine serves what its worker now serves."""
        self.args = args
        self._generation_seen = self.worker.generation

    def _commit_prepared(self) -> None:
        """Swap in a prepared reload whose graphs are all ready (or drop it when one of its
        captures failed: build-then-swap stays transactional). One that waited
        `MAX_PREPARE_STEPS` boundaries lands now, its missing sizes served eager until their
        units (queued first now: the active state's) are done, counted: units the old state
        still had pending are released with it, so a reload cannot wait behind them for ever."""
        prepared = self.prepared
        if prepared is None:
            return
        if not prepared.ready:
            self.prepared_steps += 1
            if self.prepared_steps < MAX_PREPARE_STEPS:
                return
            if not prepared.failed_sizes:
                self.stats.add("reloads_landed_unready")
                logger.warning("reload to %s lands before its graphs (%d boundaries waited): eager until ready",
                               prepared.args.speculative, self.prepared_steps)
        self.prepared = None
        failed = prepared.failed_sizes
        if failed:
            reason = f"capture failed at sizes {sorted(failed)}: {next(iter(failed.values()))}"
            self.worker.reloads.discard(prepared, reason)
            self._rejected(ReloadError(reason))
            return
        self._commit(prepared)

    def _rejected(self, exc: BaseException) -> None:
        """Logged; the worker's log holds its record."""
        logger.error("reload rejected, the previous state keeps serving: %s", exc)
