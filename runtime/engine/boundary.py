"""The step boundary: everything that changes what the engine serves happens here, between steps.

Draft weights (copied in place), reloads (the boundary holds the request: checked by the
worker's `Reloads.request`, from the engine, the worker's own `request_reload` or a signal
handler; proposed to every rank under a coordinator; then one `Reloads.commit`; under
background capture the same call at each boundary until the worker swaps it in, once its graphs
are ready, or drops it when one failed), step-boundary capture units (CUDA), the coordinator's
per-step poll, and the step policy rebuilt for whatever the worker serves after a reload
(DESIGN.md §14: one boundary for every change). A reload that fails leaves the previous state serving and is recorded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from draftgraph.graphs.spans import span
from draftgraph.runtime import ReloadError, RuntimeArgs
from draftgraph.runtime.schedule import SpeculationSchedule
from draftgraph.runtime.worker import CommitStatus, DraftWorker, PendingReload, ReloadRequest

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
        self.capturing: ReloadRequest | None = None  # a reload whose graphs the worker captures aside
        self.capturing_steps = 0  # boundaries it has been committed at
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
        """The active state, the policy's and a reload being captured aside (no repeats)."""
        found = [self.worker.state, *self.policy.states()]
        capturing = self.worker.reloads.capturing_state
        if capturing is not None:
            found.append(capturing)
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
        if self.capturing is not None:
            self._commit_capturing()
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
        if self.background:  # committed at this boundary and the next ones (`_commit_capturing`)
            self.capturing, self.capturing_steps = request, 0  # a newer one supersedes it
            if request.policy == "release_first":
                self.policy.release()
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

    def _follow(self, args: RuntimeArgs) -> None:
        """The engine serves what its worker now serves."""
        self.args = args
        self._generation_seen = self.worker.generation

    def _commit_capturing(self) -> None:
        """Background capture: the held request's one call, `Reloads.commit` (the first builds
        the state with queued graphs; ``release_first`` swaps it in then, eager until ready,
        ``swap`` once its graphs are ready). One that waited `MAX_PREPARE_STEPS` boundaries
        lands now, its missing sizes served eager until their units (queued first now: the
        active state's) are done, counted: units the old state still had pending are released
        with it, so a reload cannot wait behind them for ever. A failed capture drops it."""
        request = self.capturing
        if request is None:
            return
        self.capturing_steps += 1
        try:
            status = self.worker.reloads.commit(request, backend=self.backend, graphs=not self.scheduled(request.args),
                                                background=True, land=self.capturing_steps >= MAX_PREPARE_STEPS)
        except ReloadError as exc:
            self.capturing = None
            self._rejected(exc)
            if request.policy == "release_first":  # its policy was released when it was taken
                self._renew_policy()
            return
        if status is CommitStatus.HOLDING:
            return
        self.capturing = None
        if status is CommitStatus.LANDED_UNREADY:
            self.stats.add("reloads_landed_unready")
            logger.warning("reload to %s lands before its graphs (%d boundaries waited): eager until ready",
                           request.args.speculative, self.capturing_steps)
        self._follow(request.args)
        self._renew_policy()

    def _rejected(self, exc: BaseException) -> None:
        """Logged; the worker's log holds its record."""
        logger.error("reload rejected, the previous state keeps serving: %s", exc)
