"""Capture and replay statistics: the counters a manager keeps and frozen snapshots of them.

One count per event (STYLE.md §6.13): a replay is counted once, in the `SizeUsage` of the
size it replayed; every total (a manager's, a state's, a worker's) is a sum over those.
`ReplayCounters` can be handed to several managers in turn (a state that recaptures), so
the usage of a size outlives the graph that served it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["CaptureRecord", "ManagerStats", "ReplayCounters", "SizeStats", "SizeUsage", "manager_stats"]


@dataclass(frozen=True)
class SizeStats:
    """One captured size: capture seconds (compile included) and bytes, graph nodes (None if
    unknown), replays, pad rows; compile seconds, the replay engine ("fx", "inductor", "cuda",
    ...), why a compiled replay was not used (None when it was, or none was tried) and where
    the graph came from and the compiles its capture ran (`CaptureRecord`)."""

    size: int
    capture_s: float
    capture_bytes: int
    nodes: int | None
    replays: int
    pad_rows: int
    compile_s: float = 0.0
    engine: str = ""
    fallback: str | None = None
    source: str = "recorded"
    compiles: int = 0  # compiles its capture ran: its own, or its state's one symbolic compile


@dataclass(frozen=True)
class ManagerStats:
    """A manager's statistics at one moment; ``sizes`` covers the sizes captured now, the
    totals every run since the manager (or its `ReplayCounters`) was created."""

    backend: str
    sizes: Mapping[int, SizeStats] = field(default_factory=lambda: MappingProxyType({}))
    captures: int = 0
    replays: int = 0
    eager_fallbacks: int = 0
    eager_runs: int = 0
    debug_checks: int = 0

    @property
    def compile_fallbacks(self) -> int:
        """Captured sizes that kept the FX replay because compiling failed or disagreed."""
        return sum(1 for v in self.sizes.values() if v.fallback is not None)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict (size keys become strings)."""
        return {
            "backend": self.backend,
            "sizes": {str(s): asdict(v) for s, v in sorted(self.sizes.items())},
            "captures": self.captures,
            "replays": self.replays,
            "eager_fallbacks": self.eager_fallbacks,
            "eager_runs": self.eager_runs,
            "debug_checks": self.debug_checks,
            "compile_fallbacks": self.compile_fallbacks,
        }


@dataclass(frozen=True)
class CaptureRecord:
    """What capturing one size cost: seconds, pool bytes, kernel-launching nodes (None if unknown),
    compile seconds, the replay engine, a compile fallback's reason and where the graph came
    from ("recorded"; "loaded": compiled code from a store; "shared": code this process
    compiled for an identical graph, loaded from the store) and how many compiles its capture ran
    (the compile backend: a size's own, or the symbolic compile every size of the step shares:
    the size whose capture waited for it counts it)."""

    capture_s: float
    capture_bytes: int
    nodes: int | None
    compile_s: float = 0.0
    engine: str = ""
    fallback: str | None = None
    source: str = "recorded"
    compiles: int = 0


class SizeUsage:
    """Replays of one padded size and the pad rows they carried: the one count of a replay."""

    __slots__ = ("pad_rows", "replays")

    def __init__(self) -> None:
        self.replays = 0
        self.pad_rows = 0


class ReplayCounters:
    """Every run a manager made: `SizeUsage` per padded size, eager fallbacks (above the largest
    size), eager runs (the eager backend) and debug comparisons. Totals are sums, never kept
    twice."""

    __slots__ = ("debug_checks", "eager_fallbacks", "eager_runs", "sizes")

    def __init__(self) -> None:
        self.sizes: dict[int, SizeUsage] = {}
        self.eager_fallbacks = 0
        self.eager_runs = 0
        self.debug_checks = 0

    def usage(self, size: int) -> SizeUsage:
        """The usage record of ``size`` (created on first use)."""
        usage = self.sizes.get(size)
        if usage is None:
            usage = self.sizes[size] = SizeUsage()
        return usage

    @property
    def replays(self) -> int:
        """Replays of every size."""
        return sum(u.replays for u in self.sizes.values())

    @property
    def pad_rows(self) -> int:
        """Pad rows of every replay."""
        return sum(u.pad_rows for u in self.sizes.values())

    def replays_up_to(self, size: int) -> int:
        """Replays of padded sizes <= ``size``."""
        return sum(u.replays for s, u in self.sizes.items() if s <= size)


def manager_stats(backend: str, records: Mapping[int, CaptureRecord], counters: ReplayCounters,
                  captures: int) -> ManagerStats:
    """A manager's `ManagerStats`: one `SizeStats` per live graph (its capture ``records`` with
    the usage ``counters`` hold for its size) and the run totals of ``counters``."""
    sizes = {}
    for s, rec in sorted(records.items()):
        usage = counters.usage(s)
        sizes[s] = SizeStats(s, rec.capture_s, rec.capture_bytes, rec.nodes, usage.replays, usage.pad_rows,
                             rec.compile_s, rec.engine, rec.fallback, rec.source, rec.compiles)
    return ManagerStats(backend=backend, sizes=MappingProxyType(sizes), captures=captures,
                        replays=counters.replays, eager_fallbacks=counters.eager_fallbacks,
                        eager_runs=counters.eager_runs, debug_checks=counters.debug_checks)
