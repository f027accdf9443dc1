"""A runtime state: one speculative configuration with the buffers and graphs it owns.

A worker serves from exactly one active state; reconfiguration builds another state and swaps
one reference, so a step always sees a complete state. A state's graphs return (chain) or read
its own buffers; the state keeps both alive together and releases them together.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .chain import ChainBuffers
from .config import SpeculativeConfig

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
    """(S, N, capture sizes, chain buffers, graph manager, stats) of one configuration.

    ``graph_spec`` is the configuration the graphs were captured for: a state whose ``spec`` was
    changed behind its back (a raw attribute write on the worker) no longer replays them.
    """

    def __init__(self, spec: SpeculativeConfig, capture_sizes: tuple[int, ...],
                 chain_buffers: ChainBuffers | None, owner: object) -> None:
        self.spec = spec
        self.capture_sizes = tuple(capture_sizes)
        self.chain_buffers = chain_buffers
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

    def chain_for(self, num_steps: int) -> ChainBuffers | None:
        """The chain buffers if they were built for ``num_steps`` (the fast-path key check)."""
        buf = self.chain_buffers
        if buf is None or buf.num_steps != num_steps or not self.spec.is_chain:
            return None
        return buf

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
            "capture_sizes": list(self.capture_sizes),
            "has_graphs": self.has_graphs,
            "stats": self.stats.as_dict(),
        }

    def __repr__(self) -> str:
        s = self.spec
        return (f"RuntimeState(S={s.num_steps}, k={s.topk}, N={s.num_draft_tokens}, "
                f"sizes={len(self.capture_sizes)}, graphs={self.has_graphs})")
