"""The two-phase reload one rank runs for reload n: build aside, vote, follow the one decision.

Every rank validates, builds and captures the new state aside (``worker.reloads.prepare``) and
votes; any failure there is a "no" vote, so the others never wait for it. The leader collects
the votes and decides (all ready: commit; else abort naming the failing or missing ranks), the
others await that decision, and every rank then commits or discards what it built: all swap, or
all keep the old state. `RankCoordinator` calls `run_reload` and keeps the record.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from draftgraph.runtime.worker import DraftWorker, ReloadError

from ..config import RuntimeArgs
from .protocol import STORE_ERRORS, RankProtocol, RankTimeout

__all__ = ["ReloadOutcome", "abort_reason", "run_reload"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReloadOutcome:
    """How reload ``n`` ended on this rank: who proposed it (-1: unknown), the args and policy,
    ``reason`` (None: committed on every rank, else why every rank keeps the old state) and the
    seconds spent preparing."""

    n: int
    proposer: int
    args: RuntimeArgs | None
    policy: str
    reason: str | None
    prepare_s: float

    @property
    def spec(self) -> Any:
        """The proposed `SpeculativeConfig` (None when the proposal could not be read)."""
        return getattr(self.args, "speculative", None)


def abort_reason(votes: dict[int, str | None], missing: tuple[int, ...], timeout_s: float,
                 n: int) -> str | None:
    """None when every rank is ready, else which ranks failed (with their errors) or are missing."""
    parts = [f"rank {r} failed: {err}" for r, err in sorted(votes.items()) if err is not None]
    if missing:
        parts.append(f"rank {', '.join(map(str, missing))} did not vote on reload {n} "
                     f"within {timeout_s:g} s")
    return "; ".join(parts) or None


def run_reload(proto: RankProtocol, worker: DraftWorker, n: int, timeout_s: float,
               fault: Callable[[str], None]) -> ReloadOutcome:
    """Prepare, vote, follow the one decision and commit or discard on ``worker``; a store that
    fails during the vote is reported through ``fault`` and aborts the reload on this rank."""
    rank = proto.rank
    start = time.perf_counter()
    proposer, args, policy, prepared, error = -1, None, "swap", None, None
    try:
        proposer, args, policy = proto.read_reload(n)
        prepared = worker.reloads.prepare(args, policy)
    except Exception as exc:  # any failure is a "no" vote: the others must not wait for it
        error = f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, (ReloadError, TypeError, ValueError, RankTimeout)):
            logger.exception("rank %d: unexpected error preparing reload %d", rank, n)
    prepare_s = time.perf_counter() - start
    try:
        proto.vote(n, error)
        if proto.is_leader:
            votes, missing = proto.collect_votes(n)
            reason = proto.decide(n, abort_reason(votes, missing, timeout_s, n))
            proto.release()
        else:
            reason = proto.await_decision(n)
        proto.finish(n)
    except STORE_ERRORS as exc:
        reason = f"rank {rank} lost the store during reload {n}: {exc}"
        fault(reason)
    if reason is None and prepared is not None:
        worker.reloads.commit(prepared)
    else:
        reason = reason or f"rank {rank} has no prepared state for reload {n}"
        if prepared is not None:
            worker.reloads.discard(prepared, reason)
    return ReloadOutcome(n, proposer, args, policy, reason, prepare_s)
