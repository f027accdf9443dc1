"""What an engine reports: `stats()`, `startup()` and the snapshot metrics and profiling read.

Every reader goes through here, never through the engine's parts: `snapshot` (totals for the life
of the engine, one consistent copy: a metrics scrape) and `stats` (figures since the last
`reset_stats`, with the worker's counters and per-state statistics) are safe from any thread.
"""

from __future__ import annotations

import time
from typing import Any

from draftgraph.runtime.counting import read_consistent
from draftgraph.runtime.phases import phase_totals
from draftgraph.runtime.stored_steps import compiled_unit_seconds, source_counts

from .acceptance import AcceptanceMonitor
from .boundary import StepBoundary
from .stats import EngineStats

__all__ = ["EngineReport", "graphs_eta"]


class EngineReport:
    """The figures of one engine (see the module docstring). ``t0`` is the engine's construction
    time (perf_counter); ``capture`` its capture mode."""

    def __init__(self, t0: float, stats: EngineStats, boundary: StepBoundary,
                 acceptance: AcceptanceMonitor | None, backend: str, capture: str) -> None:
        self.t0 = t0
        self.counts = stats
        self.boundary = boundary
        self.worker = boundary.worker
        self.acceptance = acceptance
        self.backend = backend
        self.capture = capture
        self.startup_s = 0.0  # construction to the first servable step (set by the engine)

    def mark_started(self) -> None:
        self.startup_s = time.perf_counter() - self.t0

    def snapshot(self) -> dict[str, Any]:
        """Totals for the life of the engine (they never go down: `reset_stats` moves only
        `stats`'s baseline) plus ``startup_s``, ``graphs_ready_s``, the draft weights' version and
        update time, and ``acceptance_low``. What metrics scrapes and profiles read."""
        out = self.counts.snapshot()
        weights = self.boundary.weights
        out.update(startup_s=self.startup_s, graphs_ready_s=self.graphs_ready_s(),
                   draft_weights_version=weights.version, draft_weights_updated_at=weights.updated_at,
                   acceptance_low=None if self.acceptance is None else self.acceptance.low)
        return out

    def graphs_ready_s(self) -> float | None:
        """Construction until no capture unit is pending (0.0 eager; None while some are)."""
        if self.backend == "eager":
            return 0.0
        queue = self.worker.capture_queue
        idle = queue.idle_since if queue.pending() == 0 else None
        # units loaded from the compiled-code store are ready when construction ends
        return None if idle is None else max(self.startup_s, idle - self.t0)

    def stats(self) -> dict[str, Any]:
        """Engine figures since the last mark plus the worker's counters and per-state statistics;
        the worker's are re-read when a step changed them mid-read."""
        return read_consistent(self._read_stats)

    def _read_stats(self) -> dict[str, Any]:
        c = self.worker.counters.as_dict()
        out = self.counts.snapshot(since_mark=True)  # one consistent copy (safe from any thread)
        recent = out.pop("reloads")
        out.update(graph_replays=c["graph_replays"], eager_fallbacks=c["graph_eager_fallbacks"],
                   eager_steps=c["eager_steps"], fast_path_hits=c["fast_path_hits"],
                   worker=c, spec=list(self.worker.spec.key), backend=self.backend,
                   **self.boundary.policy.as_dict(), state=self.worker.state.describe(), **self.startup())
        # totals for the life of the worker, records of the latest reloads only
        out["reloads"] = {**self.worker.reload_log.totals(), "recent": recent}
        out["phases"] = phase_totals(self.worker.live_states())  # verify / extend graphs, all states
        out["draft_weights"] = self.boundary.weights.as_dict()
        out["acceptance_watch"] = self.acceptance.as_dict() if self.acceptance is not None else None
        return out

    def _graphs_eta(self, states: list[Any], queue: Any, pending: int) -> dict[str, Any] | None:
        if not pending:
            return None
        earlier = compiled_unit_seconds() if not queue.units_run and _compiles(states) else None
        return graphs_eta(queue, pending, earlier)

    def startup(self) -> dict[str, Any]:
        """Start-up as a user feels it: ``startup_s`` (construction to the first servable step),
        ``graphs_ready_s`` (construction until no capture unit is pending; None while some are),
        ``capture_s`` / ``compile_s`` (totals over every state: capture includes compile),
        ``states`` (per state: S, k, N, capture and compile seconds, sizes ready / pending /
        failed), ``eager_steps_by_reason``, the queued units run and failed so far, how long the
        pending ones will take (``graphs_eta``: `graphs_eta`), and where the
        live graphs came from (`runtime.stored_steps.source_counts`: compiled, loaded from the
        compiled-code store, shared)."""
        states = self.boundary.states()
        queue = self.worker.capture_queue
        described = [_describe_capture(s) for s in states]
        return {
            "capture": self.capture,
            "startup_s": self.startup_s,
            "graphs_ready_s": self.graphs_ready_s(),
            "capture_s": sum(s.capture_s for s in states),
            "compile_s": sum(s.compile_s for s in states),
            "states": described,
            "eager_steps_by_reason": dict(self.worker.counters.eager_steps_by_reason),
            "capture_units_run": queue.units_run, "capture_units_failed": queue.units_failed,
            "capture_units_cancelled": queue.units_cancelled,
            "graphs_eta": self._graphs_eta(states, queue, sum(len(s["sizes_pending"]) for s in described)),
            **source_counts(states, self.worker.compile_process_figures()),
        }


def graphs_eta(queue: Any, pending: int, earlier_s: float | None = None) -> dict[str, Any] | None:
    """How long the ``pending`` capture units will take (None when none is pending):
    ``per_unit_s`` is the mean over the units that ran here (``basis`` "measured"); when none
    ran yet, ``earlier_s`` (a unit's mean seconds in earlier runs, from the compiled-code store:
    ``basis`` "earlier runs"), else the longest a unit has run without finishing (the one in
    progress, or one cut off by a stop: ``basis`` "at least"), else None (``basis``
    "unknown"). ``seconds`` is
    ``pending * per_unit_s`` of capture work; a busy server runs a unit every ``paced_s`` at most
    (None when the next unit is not paced: it compiles in the compile process, or
    ``max_wait_s`` is 0)."""
    if pending <= 0:
        return None
    if queue.units_run:
        per_unit, basis = queue.unit_s / queue.units_run, "measured"
    elif earlier_s:
        per_unit, basis = earlier_s, "earlier runs"
    else:
        longest = max(queue.unfinished_s, queue.running_s() or 0.0)
        per_unit, basis = (longest, "at least") if longest > 0 else (None, "unknown")
    paced = queue.max_wait_s if queue.max_wait_s > 0 and queue.paced() else None
    return {"pending": pending, "per_unit_s": per_unit, "seconds": None if per_unit is None else pending * per_unit,
            "basis": basis, "units_measured": queue.units_run, "paced_s": paced}


def _compiles(states: list[Any]) -> bool:
    """True when some state's pending units compile (the store's unit seconds apply)."""
    return any(s.graphs is not None and s.graphs.pending_sizes and s.graphs.backend_name == "compile"
               for s in states)


def _describe_capture(state: Any) -> dict[str, Any]:
    """One state's capture figures for `EngineReport.startup`."""
    graphs = state.graphs
    ready = list(graphs.captured_sizes) if graphs is not None else []
    pending = list(graphs.pending_sizes) if graphs is not None else []
    failed = sorted(graphs.failed_sizes) if graphs is not None else []
    spec = state.spec
    if state.target_only:  # a plain target step's state: its graphs are phases (`stats()["phases"]`)
        return {"num_steps": 0, "topk": None, "num_draft_tokens": 1, "target_only": True,
                "capture_s": state.capture_s, "compile_s": state.compile_s, "sizes_ready": [],
                "sizes_pending": [], "sizes_failed": []}
    return {"num_steps": spec.num_steps, "topk": spec.topk, "num_draft_tokens": spec.num_draft_tokens,
            "capture_s": state.capture_s, "compile_s": state.compile_s, "sizes_ready": ready,
            "sizes_pending": pending, "sizes_failed": failed}
