"""How an engine gets its graphs when asked for ``capture="auto"``: beside serving, or before it.

Capturing beside serving pays only where serving keeps its cores. On a CPU a unit records in
this process (the interpreter lock) and compiles in a compile process that takes a core; on a
machine with few cores both come out of serving (measured on 2 cores, default demo: 0.28-0.72x
the eager backend while units were pending, 0 of 62 steps from graphs in a 5 s run). There the
right order is the one first-use training takes: fill the graphs before serving, with a
progress bar, once (a later run loads them from the compiled-code store in seconds), compiling
in one process per core while nothing else runs. With cores to spare (or CUDA, whose units run
between steps), background capture stays: the first step is served at once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from draftgraph.graphs import capabilities

__all__ = ["CaptureChoice", "MIN_CORES_BESIDE", "choose_capture", "usable_cores"]

MIN_CORES_BESIDE = 4  # below this many usable cores a CPU engine fills its graphs before serving
MAX_FILL_PROCESSES = 4  # compile processes during a fill (each holds inductor: ~0.5 GB)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS tells; else the count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class CaptureChoice:
    """``mode``: "background" (units beside serving), "fill" (every unit before the first step,
    compiled in ``compile_processes`` processes), "blocking" (captured in the constructor's
    thread) or "none" (the eager backend); ``reason``: why, in words (shown by `startup`)."""

    mode: str
    reason: str
    cores: int
    compile_processes: int = 1

    def as_dict(self) -> dict[str, object]:
        return {"mode": self.mode, "reason": self.reason, "cores": self.cores,
                "compile_processes": self.compile_processes}


def choose_capture(requested: str, backend: str, cores: int | None = None) -> CaptureChoice:
    """The capture mode for ``requested`` ("auto", "background", "blocking" or "fill") on the
    resolved ``backend`` ("cuda", "compile", "trace" or "eager") with ``cores`` usable cores
    (default `usable_cores`); see the module docstring for the rule."""
    cores = usable_cores() if cores is None else cores
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        raise ValueError(f"cores={cores!r}: must be an int >= 1")
    fill_processes = max(1, min(cores, MAX_FILL_PROCESSES))
    can = capabilities(backend)
    if not can.captures:
        return CaptureChoice("none", f"the {can.name} backend captures no graph", cores)
    if requested != "auto":
        return CaptureChoice(requested, f"asked for capture={requested!r}", cores,
                             fill_processes if requested == "fill" else 1)
    if can.replays_on_device:
        return CaptureChoice("background", "CUDA: units run between steps, within a time budget", cores)
    if cores >= MIN_CORES_BESIDE:
        return CaptureChoice("background", f"{cores} usable cores: capture and compile beside serving "
                             f"leave serving its own", cores)
    return CaptureChoice("fill", f"{cores} usable cores (< {MIN_CORES_BESIDE}): capturing beside serving "
                         f"would take serving's core, so every graph is filled before serving, compiled in "
                         f"{fill_processes} process{'es' if fill_processes > 1 else ''} (a later run loads "
                         f"them from the store)", cores, fill_processes)
