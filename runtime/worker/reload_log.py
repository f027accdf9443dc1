"""The one log of a worker's reloads: lifetime totals and the latest records, each counted once.

A reload is counted when its transaction opens (`Reloads.prepare`, or the build inside
`Reloads.commit`), or, never opened, when it ends (superseded before it was taken); a host
stamps each record with its own step and reads `recent` from here (there is no second log).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

__all__ = ["ReloadLog"]


class ReloadLog:
    """Reload outcomes of one worker: totals for its whole life (requested, applied, failed,
    superseded) and the records of the latest ``keep`` reloads only, so a long-running server
    does not grow. ``stamp`` (a host's: `ReloadHost.reload_stamp`) gives each record its epoch
    and step; `recent` lists the records of one epoch without it."""

    __slots__ = ("failed", "history", "requested", "succeeded", "superseded")

    def __init__(self, keep: int = 64) -> None:
        self.history: deque[dict[str, Any]] = deque(maxlen=keep)
        self.requested = 0  # reloads counted: opened, or ended without opening
        self.succeeded = 0  # applied
        self.failed = 0
        self.superseded = 0  # replaced by a newer request before they were applied

    def opened(self) -> None:
        """A reload's transaction starts (counted here, once)."""
        self.requested += 1

    def record(self, policy: str, start: float, ok: bool, error: str | None, state: Any = None, *,
               stamp: tuple[int, int] | None = None) -> None:
        """Keep the outcome of one opened reload (counted when it opened)."""
        if ok:
            self.succeeded += 1
        else:
            self.failed += 1
        record: dict[str, Any] = {
            "policy": policy, "seconds": time.perf_counter() - start, "ok": ok, "error": error,
            "capture_s": state.capture_s if state is not None else 0.0,
            "capture_bytes": state.capture_bytes if state is not None else 0,
        }
        if stamp is not None:
            record["epoch"], record["step"] = stamp
        self.history.append(record)

    def count_superseded(self, opened: bool) -> None:
        """One reload replaced by a newer one (``opened=False``: before it was taken)."""
        if not opened:
            self.requested += 1
        self.superseded += 1

    def recent(self, epoch: int) -> list[dict[str, Any]]:
        """The records stamped with ``epoch`` (a host's statistics since its last reset), each
        with its ``step``."""
        return [{k: v for k, v in r.items() if k != "epoch"} for r in self.history if r.get("epoch") == epoch]

    def totals(self) -> dict[str, int]:
        """Lifetime counts: requested, applied, failed, superseded."""
        return {"requested": self.requested, "applied": self.succeeded, "failed": self.failed,
                "superseded": self.superseded}
