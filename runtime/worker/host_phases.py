"""The host's graph phases of a runtime state: target verify and draft extend beside the draft step.

A runtime state's draft decode step is the worker's own graph manager (`RuntimeState.graphs`).
A host that runs a whole speculative step (the engine, a serving engine's TARGET_VERIFY and
DRAFT_EXTEND runners) hands the worker a `PhaseProvider`: for a state's spec and largest capture
size it returns the phases to capture beside the draft step, by name, each a `GraphStep` over its
own static inputs (verify and extend at the state's width N, one per KV-length tier). The worker
builds, captures, swaps and releases them with the state: a step that reads the active state's
phases can never pair the draft graphs of one (S, N) with the verify graphs of another.

`PhaseGraphs` is a state's set: one graph manager per phase, the capture figures of each, and the
eager steps of each by reason (a replay is counted by its manager, an eager step here: one count
each, STYLE.md §6.13).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple, Protocol

import torch

from draftgraph.graphs import GraphCaptureManager, Miss, ReplayPlan
from draftgraph.runtime.config import SpeculativeConfig

from .phase_key import PhaseKey

__all__ = ["GraphStep", "PhaseFigures", "PhaseGraphs", "PhaseProvider", "phase_totals"]


class GraphStep(NamedTuple):
    """What a worker hands the graph manager for one state: the capturable ``step(**inputs)``,
    its named static inputs (allocated at the largest capture size) and their pad values.
    A host's phase may add what its compiled code is stored under: ``structure`` (everything
    the code depends on besides shapes: models, configuration, widths) and ``constants()``
    (every tensor the step reads besides its inputs, by stable name); see `runtime.worker.stored_steps`."""

    step: Callable[..., Any]
    static_inputs: dict[str, torch.Tensor]
    pad_values: dict[str, float | int]
    structure: str = ""
    constants: Callable[[], Any] | None = None


class PhaseProvider(Protocol):
    """``provider(spec, max_size)`` -> phase name -> `GraphStep` (step, static inputs with
    ``max_size`` rows, pad values); an empty mapping when the host has no phase for ``spec``.
    ``spec`` None: the phases of a plain target step (S = 0, nothing drafted; a worker's
    `build_target_state`)."""

    def __call__(self, spec: SpeculativeConfig | None, max_size: int) -> Mapping[str, Any]: ...


@dataclass
class PhaseFigures:
    """One phase's capture cost: seconds (compiling included), compile seconds, graph bytes and
    kernel nodes per captured size."""

    capture_s: float = 0.0
    compile_s: float = 0.0
    capture_bytes: int = 0
    nodes: dict[int, int | None] = field(default_factory=dict)

    def add_size(self, manager: GraphCaptureManager, size: int, seconds: float | None = None) -> None:
        """Record one captured size (blocking capture or a queued unit) from its manager
        (``seconds``: the unit's wall time; None: the manager's record of the size)."""
        record = manager.stats.sizes.get(size)
        if seconds is None:
            seconds = record.capture_s if record is not None else 0.0
        self.capture_s += seconds
        if record is not None:
            self.compile_s += record.compile_s
            self.capture_bytes += record.capture_bytes or 0
        self.nodes[size] = manager.node_count(size)


class PhaseGraphs:
    """A state's phases: ``managers`` (name -> `GraphCaptureManager`), ``figures`` and the eager
    steps per phase by reason. Built by the worker; released with the state."""

    def __init__(self) -> None:
        self.managers: dict[str, GraphCaptureManager] = {}
        self.figures: dict[str, PhaseFigures] = {}
        self.eager: dict[str, dict[str, int]] = {}
        self.failed: dict[str, str] = {}  # phase -> why its blocking capture failed (it serves eager)

    def add(self, name: str, manager: GraphCaptureManager | None) -> None:
        """Register ``name`` (None: no graphs, e.g. its capture failed: every step eager)."""
        if manager is not None:
            self.managers[name] = manager
        self.figures.setdefault(name, PhaseFigures())
        self.eager.setdefault(name, {})

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.figures)

    def lookup(self, name: str, b: int) -> tuple[GraphCaptureManager, ReplayPlan] | Miss:
        """The graph that serves ``b`` rows of phase ``name``, or a `Miss` naming why none does
        ("no_graphs" when the phase has no manager, e.g. its capture failed)."""
        manager = self.managers.get(name)
        if manager is None:
            return Miss("capture_failed" if name in self.failed else "no_graphs")
        found = manager.lookup(b)
        if type(found) is ReplayPlan:
            return manager, found
        return found  # a Miss

    def count_eager(self, name: str, reason: str) -> None:
        """Count one eager step of phase ``name`` (the caller ran it eagerly for ``reason``)."""
        by_reason = self.eager.setdefault(name, {})
        by_reason[reason] = by_reason.get(reason, 0) + 1

    def release(self) -> None:
        """Free every phase's graphs; idempotent."""
        managers, self.managers = self.managers, {}
        for manager in managers.values():
            manager.release()

    def describe(self) -> dict[str, dict[str, Any]]:
        """Per phase: captured sizes, replays, eager steps by reason, capture figures."""
        out: dict[str, dict[str, Any]] = {}
        for name in self.figures:
            manager = self.managers.get(name)
            stats = manager.stats if manager is not None else None
            out[name] = {
                "backend": stats.backend if stats is not None else None,
                "captured_sizes": list(manager.captured_sizes) if manager is not None else [],
                "pending_sizes": list(manager.pending_sizes) if manager is not None else [],
                "replays": stats.replays if stats is not None else 0,
                "eager_steps_by_reason": dict(self.eager.get(name, {})),
                **asdict(self.figures[name]),
                **({"failed": self.failed[name]} if name in self.failed else {}),
            }
        return out



def phase_totals(states: Any) -> dict[str, dict[str, Any]]:
    """Per phase kind ("verify", "extend": `PhaseKey.kind` of each phase's name), summed over
    ``states`` (each a `RuntimeState`): graphs captured, replays, eager steps by reason, capture
    and compile seconds, graph bytes. Counts for the life of the states."""
    out: dict[str, dict[str, Any]] = {}
    for state in states:
        phases = state.phases
        if phases is None:
            continue
        for name, figures in phases.describe().items():
            kind = PhaseKey.parse(name).kind
            t = out.setdefault(kind, {"graphs": 0, "replays": 0, "eager_steps_by_reason": {}, "capture_s": 0.0,
                                      "compile_s": 0.0, "capture_bytes": 0, "failed": 0})
            t["graphs"] += len(figures["captured_sizes"])
            t["replays"] += figures["replays"]
            for reason, n in figures["eager_steps_by_reason"].items():
                t["eager_steps_by_reason"][reason] = t["eager_steps_by_reason"].get(reason, 0) + n
            t["capture_s"] += figures["capture_s"]
            t["compile_s"] += figures["compile_s"]
            t["capture_bytes"] += figures["capture_bytes"]
            t["failed"] += "failed" in figures
    return out
