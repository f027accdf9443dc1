"""A worker's counters as one view over counts kept where the events happen.

Steps are counted by the state they ran under (`StepCounts`, and the graph manager's
`ReplayCounters` for replays); rebuilds and switches by the worker, reloads by its reload
log. `CounterLedger.snapshot` sums them. States come and go (reloads, adaptive rebuilds,
overrides), so when one is garbage collected its counts are folded into a retired total:
the worker's figures never go down and a long-running worker keeps no per-state record.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import TypeVar

from draftgraph.graphs import ReplayCounters
from draftgraph.runtime.worker.state import DraftCounters, RuntimeState, StepCounts

__all__ = ["CounterLedger", "WorkerEvents", "read_consistent"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
_RETRIES = 8


def read_consistent(read: Callable[[], T]) -> T:
    """``read()``, again when a container changed size under it: counters are read without a
    lock from another thread (a metrics scrape, ``stats()``) while the serving thread adds a
    padded size or an eager reason ("dictionary changed size during iteration")."""
    for attempt in range(_RETRIES):
        try:
            return read()
        except RuntimeError as exc:
            if attempt == _RETRIES - 1 or "during iteration" not in str(exc):
                raise
            logger.debug("read retried: %s", exc)
    raise AssertionError("unreachable")


class WorkerEvents:
    """Events of the worker itself: topology-buffer rebuilds and state switches."""

    __slots__ = ("rebuilds", "switches")

    def __init__(self) -> None:
        self.rebuilds = 0
        self.switches = 0


def _retire(total: DraftCounters, counts: StepCounts, replays: ReplayCounters) -> None:
    """Fold a collected state's counts into ``total`` (a weakref finalizer: no reference to
    the worker or the state)."""
    total.add_steps(counts, replays)


class CounterLedger:
    """Live states' counts plus the retired total; `snapshot` gives the worker's counters."""

    def __init__(self) -> None:
        self.events = WorkerEvents()
        self._retired = DraftCounters()
        self._live: weakref.WeakSet[RuntimeState] = weakref.WeakSet()

    def track(self, state: RuntimeState) -> None:
        """Count ``state``'s steps in this worker's figures, also after it is gone."""
        self._live.add(state)
        fin = weakref.finalize(state, _retire, self._retired, state.counts, state.replays)
        fin.atexit = False

    def live_states(self) -> list[RuntimeState]:
        """The tracked states not collected yet (active, candidates, a reload being prepared)."""
        return list(self._live)

    def snapshot(self, reloads: int, failed_reloads: int) -> DraftCounters:
        """The worker's counters now."""
        r = self._retired
        out = DraftCounters(r.fast_path_hits, r.tree_path_calls, r.capacity_fallbacks, r.graph_replays,
                            r.eager_steps, r.graph_eager_fallbacks, self.events.rebuilds,
                            self.events.switches, reloads, failed_reloads, dict(r.eager_steps_by_reason))
        for state in list(self._live):
            out.add_steps(state.counts, state.replays)
        return out
