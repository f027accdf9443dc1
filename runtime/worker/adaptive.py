"""Adaptive step count: pick S per batch from recent acceptance, switching prebuilt states.

Rule (documented, deliberately simple): keep an exponential moving average (EMA) of the
accepted draft tokens per request (bonus token excluded) and serve the smallest candidate
S >= EMA + margin; if none is that large, the largest. Acceptance is capped by S, so a too
short draft reports ~S and the rule steps up; poor acceptance steps down. Every candidate's
state (buffers and graphs) is built once at start, and a switch is `apply_runtime_state`:
O(1), no capture, no allocation.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Sequence
from typing import Any

from draftgraph.graphs.spans import span
from draftgraph.runtime.validation import require_positive_int
from draftgraph.runtime.worker.state import RuntimeState

__all__ = ["AdaptiveStepController"]

logger = logging.getLogger(__name__)


class AdaptiveStepController:
    """Switches ``worker`` among states for ``candidate_steps`` (ints for a chain, or (S, N)).

    ``alpha`` weights the newest observation in the EMA; ``margin`` is how many tokens beyond
    the expected acceptance to draft. A reload of the worker invalidates the states; they are
    rebuilt for the new args at the next `step`. With a ``coordinator`` (`RankCoordinator`,
    several ranks) every rank serves rank 0's choice as of the latest poll, so all ranks switch
    at the same step; call ``coordinator.step()`` before this controller's `step` each step.
    ``background=True`` queues the candidates' captures behind the active state's (see
    `EagleDraftWorkerBase.capture_graphs`): a candidate serves eager until its graphs are ready.
    """

    def __init__(self, worker: Any, candidate_steps: Sequence[int | tuple[int, int]],
                 alpha: float = 0.2, margin: float = 1.0, capture_bs: Sequence[int] | None = None,
                 backend: str = "auto", coordinator: Any = None, background: bool = False) -> None:
        self._candidates = _check_candidates(candidate_steps)
        if not 0.0 < float(alpha) <= 1.0:
            raise ValueError(f"alpha={alpha!r}: must be in (0, 1]")
        if float(margin) < 0.0:
            raise ValueError(f"margin={margin!r}: must be >= 0")
        self.worker = worker
        self.alpha = float(alpha)
        self.margin = float(margin)
        self._capture_bs = capture_bs
        self._backend = backend
        self._background = bool(background)
        self.coordinator = coordinator
        self.ema: float | None = None
        self.switches = 0
        self.steps_per_state: dict[int, int] = {}
        self._build()

    @property
    def candidate_steps(self) -> tuple[int, ...]:
        """The S of every candidate, ascending."""
        return tuple(s for s, _ in self._candidates)

    @property
    def states(self) -> dict[int, RuntimeState]:
        """Candidate states by S."""
        return dict(self._states)

    def _build(self) -> None:
        """Build every candidate's state; states of an earlier build are released (their graphs
        were captured for arguments the worker no longer serves)."""
        for old in getattr(self, "_states", {}).values():
            if old is not self.worker.state:
                old.release()
        self._generation = self.worker.generation
        active = self.worker.state
        self._states = {}
        for s, n in self._candidates:
            if self._reusable(active, s, n):  # the worker's own state: its graphs are built already
                self._states[s] = active
                continue
            self._states[s] = self.worker.build_runtime_state(
                s, n, capture_bs=self._capture_bs, backend=self._backend, background=self._background)

    def _reusable(self, state: RuntimeState, s: int, n: int | None) -> bool:
        """True when the worker's active state is exactly candidate (S, N) with the capture sizes
        the controller would give it (so one configuration is not captured twice)."""
        if state.target_only or state.generation != self.worker.generation or state.spec.num_steps != s:
            return False
        if n is not None and state.spec.num_draft_tokens != n:
            return False
        sizes = self._capture_bs
        wanted = tuple(sizes) if sizes is not None else state.capture_sizes
        return state.capture_sizes == wanted and (state.graphs is not None or not wanted)

    def choose(self) -> int:
        """The S the rule picks for the current EMA (the largest before any observation)."""
        steps = self.candidate_steps
        if self.ema is None:
            return steps[-1]
        i = bisect.bisect_left(steps, self.ema + self.margin)
        return steps[min(i, len(steps) - 1)]

    def observe(self, accepted_tokens: float) -> None:
        """Feed the mean accepted draft tokens per request of the last verified batch."""
        a = float(accepted_tokens)
        if a < 0.0:
            raise ValueError(f"accepted_tokens={accepted_tokens!r}: must be >= 0")
        self.ema = a if self.ema is None else self.alpha * a + (1.0 - self.alpha) * self.ema

    def step(self, accepted_tokens: float | None = None) -> int:
        """Observe (if given), pick S and make its state active; returns the S now served."""
        if accepted_tokens is not None:
            self.observe(accepted_tokens)
        s = self.choose()
        if self.coordinator is not None:
            s = self.coordinator.shared_choice(s, initial=self._candidates[-1][0])
        return self.serve(s)

    def serve(self, s: int) -> int:
        """Make candidate ``s``'s state active (rebuilding the states after a reload) and count
        it; returns ``s``. `step` serves the rule's pick; a caller that measures what each S
        delivers (`PayoffGate`) serves its own. ValueError for an S that is not a candidate."""
        if s not in self.candidate_steps:
            raise ValueError(f"s={s!r}: not one of the candidate step counts {list(self.candidate_steps)}")
        if self._generation != self.worker.generation:
            logger.info("worker was reloaded: rebuilding %d candidate states", len(self._candidates))
            self._build()
        target = self._states[s]
        if self.worker.state is not target:
            with span("adaptive_switch", num_steps=s):
                self.worker.apply_runtime_state(target)
            self.switches += 1
        self.steps_per_state[s] = self.steps_per_state.get(s, 0) + 1
        return s

    def release(self) -> None:
        """Release every candidate state not currently active."""
        for state in self._states.values():
            if state is not self.worker.state:
                state.release()


def _check_candidates(candidates: Sequence[int | tuple[int, int]]) -> list[tuple[int, int | None]]:
    """[(S, N or None)] ascending by S, unique, non-empty."""
    if isinstance(candidates, (str, bytes)) or not hasattr(candidates, "__iter__"):
        raise TypeError(f"candidate_steps={candidates!r}: must be a sequence of ints or (S, N) pairs")
    out: list[tuple[int, int | None]] = []
    for i, c in enumerate(candidates):
        s, n = (c if isinstance(c, tuple) else (c, None))
        out.append((require_positive_int(f"candidate_steps[{i}]", s), n))
    if not out:
        raise ValueError("candidate_steps=[]: needs at least one candidate")
    steps = [s for s, _ in out]
    if steps != sorted(set(steps)):
        raise ValueError(f"candidate_steps={steps!r}: the steps must be ascending and unique")
    return out
