"""Engine counters and per-stage timings (host wall time), reported by `SpecDecodeEngine.stats`."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

from draftgraph.graphs.spans import span

__all__ = ["EngineStats", "STAGES"]

RECENT_RELOADS = 64  # reload records kept (a long-running server reloads without bound)
STAGES = ("admit", "draft", "build_tree", "verify", "accept_commit", "extend", "adapt")
"""The engine's stages, in step order: the keys of ``stats()["stage_s"]`` and the names of the
profiler / NVTX ranges `EngineStats.timed` opens (one vocabulary for timers, ranges and metrics)."""


@dataclass
class EngineStats:
    """What the decode loop did: steps, tokens, acceptance, stage seconds."""

    steps: int = 0
    verify_steps: int = 0
    request_verifies: int = 0  # sum over verify steps of the batch size
    committed: int = 0  # tokens committed by verifies (accepted drafts + bonus)
    drafts: int = 0  # requests drafted for (per verify step with speculation on: not S=0 steps)
    draft_tokens: int = 0  # draft tokens verified (N - 1 per request per verify step)
    accepted_per_pos: dict[int, int] = field(default_factory=dict)  # drafts accepted at position i
    tokens_generated: int = 0
    requests_finished: int = 0
    requests_aborted: int = 0  # ended by abort_request
    requests_failed: int = 0  # failed while admitted (their prefill raised)
    batch_sizes: dict[int, int] = field(default_factory=dict)
    stage_s: dict[str, float] = field(default_factory=lambda: {s: 0.0 for s in STAGES})
    # the engine's records of its latest reloads (step, ok, error, seconds...); totals live in
    # the worker's ReloadLog, for the life of the process
    reloads: deque[dict] = field(default_factory=lambda: deque(maxlen=RECENT_RELOADS))

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        """Add the body's wall time to ``stage_s[stage]``; the body is also a range named ``stage``
        (profiler, NVTX, span tracer) when one listens."""
        start = time.perf_counter()
        try:
            with span(stage):
                yield
        finally:
            self.stage_s[stage] += time.perf_counter() - start

    def count_accepted(self, accepted: int) -> None:
        """One draft's accepted tokens (bonus not counted): positions 0..accepted-1 each count it."""
        per_pos = self.accepted_per_pos
        for pos in range(accepted):
            per_pos[pos] = per_pos.get(pos, 0) + 1

    @property
    def accept_length_mean(self) -> float:
        """Tokens committed per request per verify step, bonus included (1.0 = no draft accepted)."""
        return self.committed / self.request_verifies if self.request_verifies else 0.0

    def as_dict(self) -> dict:
        d = asdict(self)
        d["reloads"] = list(self.reloads)
        d["accept_length_mean"] = self.accept_length_mean
        return d
