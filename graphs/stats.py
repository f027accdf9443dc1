"""Capture and replay statistics: frozen snapshots (``ManagerStats``) and the counters behind them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["ManagerStats", "SizeCounters", "SizeStats"]


@dataclass(frozen=True)
class SizeStats:
    """One captured size: capture seconds and bytes, graph nodes (None if unknown), replays, pad rows."""

    size: int
    capture_s: float
    capture_bytes: int
    nodes: int | None
    replays: int
    pad_rows: int


@dataclass(frozen=True)
class ManagerStats:
    """A manager's statistics at one moment; ``sizes`` covers the sizes captured now."""

    backend: str
    sizes: Mapping[int, SizeStats] = field(default_factory=lambda: MappingProxyType({}))
    captures: int = 0
    replays: int = 0
    eager_fallbacks: int = 0
    eager_runs: int = 0
    debug_checks: int = 0

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
        }


@dataclass
class SizeCounters:
    """Mutable per-size counters the manager updates; snapshot with ``freeze``."""

    capture_s: float
    capture_bytes: int
    nodes: int | None
    replays: int = 0
    pad_rows: int = 0

    def freeze(self, size: int) -> SizeStats:
        """Immutable copy for ``size``."""
        return SizeStats(size, self.capture_s, self.capture_bytes, self.nodes, self.replays, self.pad_rows)
