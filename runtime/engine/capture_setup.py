"""An engine's graphs at start-up: the capture mode chosen, the host's phases, the first capture.

One job, out of `SpecDecodeEngine`'s constructor: choose how the graphs come
(`capture_choice.choose_capture`: "background", "fill", "blocking" or "none"), give the worker
the engine's verify / extend phases (`phases.engine_phases`), start the capture of the active
state (or, under a schedule, only name the backend its band states capture with), and, for
"fill", wait for every unit before serving, compiling in one process per usable core meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from draftgraph.graphs import capabilities, resolve_backend
from draftgraph.runtime.schedule import SpeculationSchedule
from draftgraph.runtime.worker import DraftWorker

from .capture_choice import CaptureChoice, choose_capture
from .phases import EnginePhases, engine_phases

__all__ = ["CaptureSetup", "fill_graphs", "start_capture"]


@dataclass(frozen=True)
class CaptureSetup:
    """What `start_capture` decided: the choice (its ``mode`` is what the engine reports),
    whether units are queued (``background``) and the host's phases (None: none)."""

    choice: CaptureChoice
    background: bool
    phases: EnginePhases | None


def start_capture(worker: DraftWorker, target: Any, cache: Any, drafter: Any, backend: str, capture: str,
                  schedule: SpeculationSchedule | None, graph_phases: Sequence[str] | None,
                  kv_tiers: Sequence[int] | None) -> CaptureSetup:
    """Choose the mode for ``capture`` on the cache's device, set the worker up and start
    capturing (see the module docstring)."""
    resolved = resolve_backend(backend, device=cache.k[0].device)
    choice = choose_capture(capture, resolved)
    captures = capabilities(resolved).captures
    background = choice.mode in ("background", "fill") and captures
    if choice.mode == "fill":  # nothing is served meanwhile: a compile process per core
        worker.capture.set_compile_processes(choice.compile_processes)
    phases = engine_phases(target, cache, drafter, backend, graph_phases, kv_tiers)
    if phases is not None:
        worker.capture.set_phase_provider(phases)
    if captures:
        if schedule is None:
            worker.capture_graphs(backend, background=background)
        else:  # the band states capture their own sizes; the active state none
            worker.capture.use_backend(backend)
    return CaptureSetup(choice, background, phases)


def fill_graphs(worker: DraftWorker, progress: Callable[[], None] | None) -> None:
    """Wait for every queued unit (``progress`` waits when given), then compile in one process
    again: from then on serving runs beside any later unit (a reload's)."""
    try:
        if progress is not None:
            progress()
        worker.capture.wait()
    finally:
        worker.capture.set_compile_processes(1)  # and the queue's threads back to MAX_THREADS
