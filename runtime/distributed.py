"""Documented import path for rank coordination; the code lives in `draftgraph.runtime.ranks`
(`ranks.coordinator`: RankCoordinator; `ranks.protocol`: the store protocol under it)."""

from __future__ import annotations

from .ranks.coordinator import (
    CoordinatorStats,
    ProposalRejected,
    RankCoordinator,
    RankMismatchError,
    RankTimeout,
    startup_fingerprint,
)

__all__ = [
    "CoordinatorStats",
    "ProposalRejected",
    "RankCoordinator",
    "RankMismatchError",
    "RankTimeout",
    "startup_fingerprint",
]
