"""What an engine reports: `stats()`, `startup()` and the snapshot metrics and profiling read.

Every reader goes through here, never through the engine's parts: `snapshot` (totals for the life
of the engine, one consistent copy: a metrics scrape) and `stats` (figures since the last
`reset_stats`, with the worker's counters and per-state statistics) are safe from any thread.
"""

from __future__ import annotations

import time
from typing import Any

from draftgraph.graphs import capabilities
from draftgraph.runtime.worker import DraftWorker, compiled_unit_seconds, phase_totals, read_consistent, source_counts

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
        self.worker: DraftWorker = boundary.worker
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
                   acceptance_low=None if self.acceptance is None else self.acceptance.low,
                   misfit_warnings=None if self.acceptance is None else self.acceptance.misfit_warnings)
        return out

    def graphs_ready_s(self) -> float | None:
        """Construction until no capture unit is pending (0.0 eager; None while some are)."""
        if not capabilities(self.backend).captures:
            return 0.0
        queue = self.worker.capture.queue
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
        epoch = out.pop("epoch")
        out.update(graph_replays=c["graph_replays"], eager_fallbacks=c["graph_eager_fallbacks"],
                   eager_steps=c["eager_steps"], fast_path_hits=c["fast_path_hits"],
                   worker=c, spec=list(self.worker.spec.key), backend=self.backend,
                   **self.boundary.policy.as_dict(), state=self.worker.state.describe(), **self.startup())
        # totals for the life of the worker, records of the latest reloads only
        log = self.worker.reloads.log  # the one log: the engine's records are its current epoch
        out["reloads"] = {**log.totals(), "recent": log.recent(epoch)}
        out["phases"] = phase_totals(self.worker.live_states())  # verify / extend graphs, all states
        out["draft_weights"] = self.boundary.weights.as_dict()
        out["acceptance_watch"] = self.acceptance.as_dict() if self.acceptance is not None else None
        return out

    def _graphs_eta(self, states: list[Any], queue: Any, pending: int) -> dict[str, Any] | None:
        if not pending:
            return None
        compiles = sum(s.graphs.pending_compiles for s in states if s.graphs is not None and not s.target_only)
        earlier = (compiled_unit_seconds(True), compiled_unit_seconds(False)) if _compiles(states) else (None, None)
        return graphs_eta(queue, pending, compiles, *earlier)

    def startup(self) -> dict[str, Any]:
        """Start-up as a user feels it: ``startup_s`` (construction to the first servable step),
        ``graphs_ready_s`` (construction until no capture unit is pending; None while some are),
        ``capture_s`` / ``compile_s`` (totals over every state: capture includes compile),
        ``states`` (per state: S, k, N, capture and compile seconds, sizes ready / pending /
        failed), ``eager_steps_by_reason``, the queued units run and failed so far, how long the
        pending ones will take (``graphs_eta``: `graphs_eta`), and where the
        live graphs came from (`runtime.worker.stored_steps.source_counts`: compiled, loaded from the
        compiled-code store, shared)."""
        states = self.boundary.states()
        queue = self.worker.capture.queue
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
            **source_counts(states, self.worker.capture.compile_process_figures()),
        }


_BASES = ("measured", "earlier runs", "at least", "unknown")  # strongest first


def graphs_eta(queue: Any, pending: int, compiles: int = 0, earlier_compile_s: float | None = None,
               earlier_check_s: float | None = None) -> dict[str, Any] | None:
    """How long the ``pending`` capture units will take (None when none is pending).

    Two kinds of unit cost very differently: ``compiles`` of them run a compile (the compile
    backend: with its one symbolic compile per state, a state's first unit; per size, every unit),
    the other ``checks`` only record (and check against their state's compile): measured, 3-15 s
    each against 0.1-0.5 s. Each kind's seconds (``per_compile_s``, ``per_check_s``) is the mean
    of that kind's units run here (``compile_basis`` / ``check_basis`` "measured"); when none ran,
    ``earlier_compile_s`` / ``earlier_check_s`` (that kind's mean in earlier runs, from the
    compiled-code store: "earlier runs"); else, for the kind the unit in progress is (a compile
    while any is pending), the longest a unit has run without finishing (the one in progress, or
    one cut off by a stop: "at least"); else None ("unknown"). ``seconds`` sums count x seconds
    over the pending kinds with a figure (None when none has one); ``basis`` is the weakest basis
    of the pending kinds, "at least" when one of them has no figure (it counts 0 seconds).
    ``units_measured`` / ``compiles_measured``: units run here / of them, those that compiled. A
    busy server runs a unit every ``paced_s`` at most (None when the next unit is not paced: it
    compiles in the compile process, or ``max_wait_s`` is 0)."""
    if pending <= 0:
        return None
    compiles = max(0, min(int(compiles), pending))
    checks = pending - compiles
    longest = max(queue.unfinished_s, queue.running_s() or 0.0)
    ran_checks = queue.units_run - queue.compile_units
    per_compile, compile_basis = _figure(queue.compile_units, queue.compile_unit_s, earlier_compile_s,
                                         longest if compiles else 0.0)
    per_check, check_basis = _figure(ran_checks, queue.unit_s - queue.compile_unit_s, earlier_check_s,
                                     0.0 if compiles else longest)
    kinds = [(n, per, basis) for n, per, basis in ((compiles, per_compile, compile_basis),
                                                   (checks, per_check, check_basis)) if n]
    known = [(n, per) for n, per, _ in kinds if per is not None]
    if known:
        seconds: float | None = sum(n * per for n, per in known)
        basis = max((b if per is not None else "at least" for _, per, b in kinds), key=_BASES.index)
    else:
        seconds, basis = None, "unknown"
    paced = queue.max_wait_s if queue.max_wait_s > 0 and queue.paced() else None
    return {"pending": pending, "compiles": compiles, "checks": checks, "per_compile_s": per_compile,
            "per_check_s": per_check, "compile_basis": compile_basis, "check_basis": check_basis,
            "seconds": seconds, "basis": basis, "units_measured": queue.units_run,
            "compiles_measured": queue.compile_units, "paced_s": paced}


def _figure(units: int, total_s: float, earlier_s: float | None, longest_s: float) -> tuple[float | None, str]:
    """One kind's seconds a unit and its basis (see `graphs_eta`)."""
    if units:
        return total_s / units, "measured"
    if earlier_s:
        return earlier_s, "earlier runs"
    if longest_s > 0:
        return longest_s, "at least"
    return None, "unknown"


def _compiles(states: list[Any]) -> bool:
    """True when some state's pending units compile (the store's unit seconds apply)."""
    return any(s.graphs is not None and s.graphs.pending_sizes and s.graphs.capabilities.compiles_code
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
