"""A runtime state: one speculative configuration with the buffers and graphs it owns.

A worker serves from exactly one active state; reconfiguration builds another state and swaps
one reference, so a step always sees a complete state. A state's graphs return (static
topologies: the chain, a static tree) or read its own topology buffers; the state keeps both
alive together and releases them together.

Counting (STYLE.md §6.13): a step run under a state is counted once, where it happens: a
graph replay in the `ReplayCounters` the state hands its graph managers, an eager step (and
what its organize did) in the state's `StepCounts`. `StateStats` and the worker's
`DraftCounters` are views computed from those counts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from draftgraph.graphs import ReplayCounters
from draftgraph.graphs.capture_share import CaptureShare
from draftgraph.runtime.config import SpeculativeConfig
from draftgraph.runtime.topology.buffers import TopologyBuffers
from draftgraph.runtime.worker.host_phases import PhaseGraphs

__all__ = ["DraftCounters", "EAGER_REASONS", "RuntimeState", "StateStats", "StepCounts"]


@dataclass(frozen=True)
class StateStats:
    """Per-state figures at one moment: capture cost and how its steps ran."""

    capture_s: float = 0.0
    capture_bytes: int = 0
    nodes: dict[int, int | None] = field(default_factory=dict)
    steps: int = 0
    graph_replays: int = 0
    eager_steps: int = 0
    pad_rows: int = 0

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for JSON."""
        return asdict(self)


@dataclass
class DraftCounters:
    """Draft-step counters (profiling, reports). A worker's `counters` is a snapshot computed
    from its states' counts and its own events (writing to it changes nothing); the SGLang
    drop-in's handle counts into one directly."""

    fast_path_hits: int = 0
    tree_path_calls: int = 0
    capacity_fallbacks: int = 0
    graph_replays: int = 0
    eager_steps: int = 0
    graph_eager_fallbacks: int = 0
    rebuilds: int = 0
    switches: int = 0
    reloads: int = 0
    failed_reloads: int = 0
    eager_steps_by_reason: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for JSON."""
        return asdict(self)

    def add_steps(self, counts: StepCounts, replays: ReplayCounters) -> None:
        """Add the steps of one state: its eager steps as counted, its replays split into
        fast-path hits (padded size within the topology buffers, which the graph returns as
        views) and tree-path calls (everything else the graph organized)."""
        graph = replays.replays
        fast = replays.replays_up_to(counts.static_capacity) if counts.static_capacity else 0
        self.fast_path_hits += counts.fast_path_hits + fast
        self.tree_path_calls += counts.tree_path_calls + graph - fast
        self.capacity_fallbacks += counts.capacity_fallbacks
        self.graph_replays += graph
        self.eager_steps += counts.eager_steps
        self.graph_eager_fallbacks += counts.eager_reasons.get("above_max", 0)
        by_reason = self.eager_steps_by_reason
        for reason, n in counts.eager_reasons.items():
            by_reason[reason] = by_reason.get(reason, 0) + n


EAGER_REASONS = ("no_graphs", "above_max", "not_ready", "capture_failed", "eager_faster", "eager_backend")
"""Why a step ran eagerly: the state has no graphs (an eager engine, no capture sizes, a stale
spec), b is above the largest capture size, its size's graph is still queued, its capture
failed, "auto" timed its replay slower than eager at capture, or the manager's backend is
eager."""


class StepCounts:
    """What the steps a state ran eagerly did: the one count of each (graph replays are
    counted by the graph manager). ``eager_reasons`` counts eager steps by reason (see
    `EAGER_REASONS`); ``static_capacity`` is the rows of the state's topology buffers (0
    without), which tells which replays returned fast-path views."""

    __slots__ = ("capacity_fallbacks", "eager_reasons", "fast_path_hits", "static_capacity",
                 "tree_path_calls")

    def __init__(self) -> None:
        self.eager_reasons: dict[str, int] = {}
        self.fast_path_hits = 0
        self.tree_path_calls = 0
        self.capacity_fallbacks = 0
        self.static_capacity = 0

    @property
    def eager_steps(self) -> int:
        """Steps this state ran eagerly, whatever the reason."""
        return sum(self.eager_reasons.values())


class RuntimeState:
    """(S, N, capture sizes, topology buffers, graph manager, counts) of one configuration.

    ``graph_spec`` is the configuration the graphs were captured for: a state whose ``spec`` was
    changed behind its back (a raw attribute write on the worker) no longer replays them, and
    its buffers no longer match (`static_buffers`).

    ``target_only``: the state of a plain target step (S = 0, nothing drafted): no draft graphs
    and no topology buffers, only the host's phases of a step that drafts nothing (verify and
    extend at width 1); ``spec`` is the configuration it was built under, not one it drafts.
    """

    def __init__(self, spec: SpeculativeConfig, capture_sizes: tuple[int, ...],
                 topology_buffers: TopologyBuffers | None, owner: object, target_only: bool = False) -> None:
        self.spec = spec
        self.target_only = bool(target_only)
        self.capture_sizes = tuple(capture_sizes)
        self.counts = StepCounts()
        self.replays = ReplayCounters()  # handed to every graph manager this state captures
        self._match: tuple[SpeculativeConfig | None, TopologyBuffers | None] = (None, None)
        self._buffers: TopologyBuffers | None = None
        self.topology_buffers = topology_buffers
        self.graphs: Any = None
        self.graph_spec: SpeculativeConfig | None = None
        self.capture_s = 0.0  # seconds spent capturing (compiling included), blocking or queued
        self.compile_s = 0.0  # of which compiling (compile backend)
        self.capture_bytes = 0
        self.nodes: dict[int, int | None] = {}
        self.owner = owner
        self.generation = 0
        self.storage_guard: Any = None  # the draft tensors its graphs read (`weights.StorageGuard`)
        self.phases: PhaseGraphs | None = None  # the host's phases (verify, extend), see `phases`
        self.phase_spec: SpeculativeConfig | None = None  # the spec the phases were captured for
        self.capture_share = CaptureShare()  # CUDA: one pool and stream for the draft step and phases

    @property
    def topology_buffers(self) -> TopologyBuffers | None:
        """The state's topology buffers (None for a dynamic tree)."""
        return self._buffers

    @topology_buffers.setter
    def topology_buffers(self, buffers: TopologyBuffers | None) -> None:
        self._buffers = buffers
        self.counts.static_capacity = buffers.capacity if buffers is not None else 0

    @property
    def num_steps(self) -> int:
        """S of this state."""
        return self.spec.num_steps

    @property
    def num_draft_tokens(self) -> int:
        """N of this state."""
        return self.spec.num_draft_tokens

    def replayable_graphs(self) -> Any:
        """The graph manager when it was captured for the current spec, else None: the one test
        of "this state may replay" (a raw spec write makes the graphs stale)."""
        graphs = self.graphs
        if graphs is not None and (self.graph_spec is self.spec or self.graph_spec == self.spec):
            return graphs
        return None

    def replayable_phases(self) -> PhaseGraphs | None:
        """The host's phases when they were captured for the current spec, else None (the same
        rule as `replayable_graphs`: a verify graph of another (S, N) is never served)."""
        phases = self.phases
        if phases is not None and (self.phase_spec is self.spec or self.phase_spec == self.spec):
            return phases
        return None

    @property
    def has_graphs(self) -> bool:
        """True when captured graphs exist and were captured for the current spec."""
        return self.replayable_graphs() is not None

    @property
    def stats(self) -> StateStats:
        """Snapshot of this state's figures (computed from its counts)."""
        replays, eager = self.replays.replays, self.counts.eager_steps
        return StateStats(self.capture_s, self.capture_bytes, dict(self.nodes), replays + eager, replays,
                          eager, self.replays.pad_rows)

    @property
    def chain_buffers(self) -> TopologyBuffers | None:
        """The topology buffers when their topology is a chain, else None."""
        buf = self.topology_buffers
        return buf if buf is not None and buf.topology.is_chain else None

    def static_buffers(self) -> TopologyBuffers | None:
        """The topology buffers if they were built for the current spec's topology (the fast-path
        key check; the verdict is cached per spec object, so a step pays one identity test)."""
        spec, match = self._match
        if spec is self.spec and match is self._buffers:
            return match
        spec = self.spec
        buf, topo = self._buffers, spec.topology
        match = buf if buf is not None and topo is not None and buf.topology == topo else None
        self._match = (spec, match)
        return match

    def release(self) -> None:
        """Free the graphs (the draft step's and the host's phases, with their pools); the buffers
        go when nothing else holds them."""
        graphs, self.graphs, self.graph_spec = self.graphs, None, None
        phases, self.phases, self.phase_spec = self.phases, None, None
        if graphs is not None:
            graphs.release()
        if phases is not None:
            phases.release()

    def describe(self) -> dict[str, Any]:
        """Summary for logs and JSON."""
        return {
            "target_only": self.target_only,
            "num_steps": 0 if self.target_only else self.spec.num_steps,
            "topk": self.spec.topk,
            "num_draft_tokens": self.spec.num_draft_tokens,
            "tree_choices": self.spec.tree_choices,
            "capture_sizes": list(self.capture_sizes),
            "has_graphs": self.has_graphs,
            "phases": self.phases.describe() if self.phases is not None else {},
            "stats": self.stats.as_dict(),
        }

    def __repr__(self) -> str:
        s = self.spec
        if self.target_only:
            return f"RuntimeState(S=0 target only, sizes={len(self.capture_sizes)})"
        return (f"RuntimeState(S={s.num_steps}, k={s.topk}, N={s.num_draft_tokens}, "
                f"sizes={len(self.capture_sizes)}, graphs={self.has_graphs})")
