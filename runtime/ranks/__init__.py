"""Rank coordination: one runtime state across ranks (`coordinator`), the store protocol under
it (`protocol`), and a CPU launcher for tests, benchmarks and ``simulate`` (`launch`)."""

from __future__ import annotations

from .coordinator import (
    CoordinatorStats,
    ProposalRejected,
    RankCoordinator,
    RankDivergenceError,
    RankMismatchError,
    RankTimeout,
    startup_fingerprint,
)
from .launch import RankLaunchError, spawn_ranks

__all__ = [
    "CoordinatorStats",
    "ProposalRejected",
    "RankCoordinator",
    "RankDivergenceError",
    "RankLaunchError",
    "RankMismatchError",
    "RankTimeout",
    "spawn_ranks",
    "startup_fingerprint",
]
