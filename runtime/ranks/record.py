"""What one rank's coordinator did: its counters (`CoordinatorStats`), the latest 64 events
(``history``: reloads and rejected proposals) and the latest error, kept in one place
(`CoordinatorRecord`) so the coordinator itself only agrees with the other ranks."""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

from .two_phase import ReloadOutcome

__all__ = ["CoordinatorRecord", "CoordinatorStats"]


@dataclass
class CoordinatorStats:
    """What the coordinator did and cost (seconds are wall time on this rank)."""

    steps: int = 0
    polls: int = 0
    poll_s: float = 0.0
    reloads: int = 0
    aborted: int = 0
    rejected: int = 0
    faults: int = 0
    forged: int = 0  # store values refused for a MAC that does not check
    stale: int = 0  # signed values of another moment refused (a replayed proposal or free slot)
    reload_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for JSON."""
        return asdict(self)


@dataclass
class CoordinatorRecord:
    """The counters, the latest 64 events and the latest error of one coordinator."""

    stats: CoordinatorStats = field(default_factory=CoordinatorStats)
    history: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=64))
    last_error: str | None = None

    def rejected(self, msg: str, proposer: int, spec: str | None) -> None:
        """A proposal refused (another in flight, or one no rank of ours wrote)."""
        self.last_error = msg
        self.stats.rejected += 1
        self.history.append({"event": "rejected", "proposer": proposer, "ok": False, "error": msg,
                             "spec": spec, "step": self.stats.steps})

    def fault(self, msg: str) -> None:
        """A peer or the store did not answer, or the ranks diverged."""
        self.stats.faults += 1
        self.last_error = msg

    def reload(self, n: int, out: ReloadOutcome, seconds: float, generation: int) -> None:
        """Reload ``n``'s outcome on this rank (committed when ``out.reason`` is None)."""
        if out.reason is None:
            self.stats.reloads += 1
        else:
            self.stats.aborted += 1
            self.last_error = f"reload {n} (proposed by rank {out.proposer}, {out.spec}) aborted: {out.reason}"
        self.stats.reload_s += seconds
        self.history.append({"event": "reload", "reload": n, "proposer": out.proposer, "spec": str(out.spec),
                             "policy": out.policy, "ok": out.reason is None, "error": out.reason,
                             "step": self.stats.steps - 1, "prepare_s": out.prepare_s, "seconds": seconds,
                             "generation": generation})
