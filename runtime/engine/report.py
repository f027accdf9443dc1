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
from draftgraph.runtime.stored_steps import source_counts

from .acceptance import AcceptanceMonitor
from .boundary import StepBoundary
from .stats import EngineStats

__all__ = ["EngineReport"]


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

    def startup(self) -> dict[str, Any]:
        """Start-up as a user feels it: ``startup_s`` (construction to the first servable step),
        ``graphs_ready_s`` (construction until no capture unit is pending; None while some are),
        ``capture_s`` / ``compile_s`` (totals over every state: capture includes compile),
        ``states`` (per state: S, k, N, capture and compile seconds, sizes ready / pending /
        failed), ``eager_steps_by_reason``, the queued units run and failed so far, and where the
        live graphs came from (`runtime.stored_steps.source_counts`: compiled, loaded from the
        compiled-code store, shared)."""
        states = self.boundary.states()
        queue = self.worker.capture_queue
        return {
            "capture": self.capture,
            "startup_s": self.startup_s,
            "graphs_ready_s": self.graphs_ready_s(),
            "capture_s": sum(s.capture_s for s in states),
            "compile_s": sum(s.compile_s for s in states),
            "states": [_describe_capture(s) for s in states],
            "eager_steps_by_reason": dict(self.worker.counters.eager_steps_by_reason),
            "capture_units_run": queue.units_run, "capture_units_failed": queue.units_failed,
            "capture_units_cancelled": queue.units_cancelled,
            **source_counts(states, self.worker.compile_process_figures()),
        }


def _describe_capture(state: Any) -> dict[str, Any]:
    """One state's capture figures for `EngineReport.startup`."""
    graphs = state.graphs
    ready = list(graphs.captured_sizes) if graphs is not None else []
    pending = list(graphs.pending_sizes) if graphs is not None else []
    failed = sorted(graphs.failed_sizes) if graphs is not None else []
    spec = state.spec
    return {"num_steps": spec.num_steps, "topk": spec.topk, "num_draft_tokens": spec.num_draft_tokens,
            "capture_s": state.capture_s, "compile_s": state.compile_s, "sizes_ready": ready,
            "sizes_pending": pending, "sizes_failed": failed}
