"""A runtime state: one speculative configuration with the buffers and graphs it owns.

A worker serves from exactly one active state; reconfiguration builds another state and swaps
one reference, so a step always sees a complete state. A state's graphs return (static
topologies: the chain, a static tree) or read its own topology buffers; the state keeps both
alive together and releases them together.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .config import SpeculativeConfig
from .topology import TopologyBuffers

__all__ = ["StateStats", "RuntimeState", "DraftCounters"]


@dataclass
class StateStats:
    """Per-state figures: capture cost and how its steps ran."""

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
    """Per-worker counters over all states (profiling and the demo summary)."""

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

    def as_dict(self) -> dict[str, int]:
        """Plain dict for JSON."""
        return asdict(self)


class RuntimeState:
    """(S, N, capture sizes, topology buffers, graph manager, stats) of one configuration.

    ``graph_spec`` is the configuration the graphs were captured for: a state whose ``spec`` was
    changed behind its back (a raw attribute write on the worker) no longer replays them, and
    its buffers no longer match (`static_buffers`).
    """

    def __init__(self, spec: SpeculativeConfig, capture_sizes: tuple[int, ...],
                 topology_buffers: TopologyBuffers | None, owner: object) -> None:
        self.spec = spec
        self.capture_sizes = tuple(capture_sizes)
        self.topology_buffers = topology_buffers
        self._match: tuple[SpeculativeConfig | None, TopologyBuffers | None] = (None, None)
        self.graphs: Any = None
        self.graph_spec: SpeculativeConfig | None = None
        self.stats = StateStats()
        self.owner = owner
        self.generation = 0

    @property
    def num_steps(self) -> int:
        """S of this state."""
        return self.spec.num_steps

    @property
    def num_draft_tokens(self) -> int:
        """N of this state."""
        return self.spec.num_draft_tokens

    @property
    def has_graphs(self) -> bool:
        """True when captured graphs exist and were captured for the current spec."""
        return self.graphs is not None and self.graph_spec == self.spec

    @property
    def chain_buffers(self) -> TopologyBuffers | None:
        """The topology buffers when their topology is a chain, else None."""
        buf = self.topology_buffers
        return buf if buf is not None and buf.topology.is_chain else None

    def static_buffers(self) -> TopologyBuffers | None:
        """The topology buffers if they were built for the current spec's topology (the fast-path
        key check; the verdict is cached per spec object, so a step pays one identity test)."""
        spec, match = self._match
        if spec is self.spec:
            return match
        spec = self.spec
        buf, topo = self.topology_buffers, spec.topology
        match = buf if buf is not None and topo is not None and buf.topology == topo else None
        self._match = (spec, match)
        return match

    def release(self) -> None:
        """Free the graphs (and their pool); the buffers go when nothing else holds them."""
        graphs, self.graphs, self.graph_spec = self.graphs, None, None
        if graphs is not None:
            graphs.release()

    def describe(self) -> dict[str, Any]:
        """Summary for logs and JSON."""
        return {
            "num_steps": self.spec.num_steps,
            "topk": self.spec.topk,
            "num_draft_tokens": self.spec.num_draft_tokens,
            "tree_choices": self.spec.tree_choices,
            "capture_sizes": list(self.capture_sizes),
            "has_graphs": self.has_graphs,
            "stats": self.stats.as_dict(),
        }

    def __repr__(self) -> str:
        s = self.spec
        return (f"RuntimeState(S={s.num_steps}, k={s.topk}, N={s.num_draft_tokens}, "
                f"sizes={len(self.capture_sizes)}, graphs={self.has_graphs})")
