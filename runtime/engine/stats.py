"""Engine counters and per-stage timings (host wall time), reported by `SpecDecodeEngine.stats`.

Thread safety: the serving thread changes the counters under one lock (a few uncontended
acquisitions per step), and every reader takes a `snapshot` under the same lock, so a metrics
scrape or a `stats()` call from another thread sees a whole step or none of it, and never a
container changing under it. The counters only rise for the life of the engine; `mark` (the
engine's `reset_stats`) records a baseline that `snapshot(since_mark=True)` subtracts, so the
exported counters stay monotonic while `stats()` starts afresh.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from draftgraph.graphs.spans import span

__all__ = ["EngineStats", "STAGES", "accept_length"]

STAGES = ("admit", "draft", "build_tree", "verify", "accept_commit", "extend", "adapt")
"""The engine's stages, in step order: the keys of ``stats()["stage_s"]`` and the names of the
profiler / NVTX ranges `EngineStats.timed` opens (one vocabulary for timers, ranges and metrics)."""

def accept_length(accepted: int | float, drafts: int) -> float:
    """The engine's one acceptance length: tokens committed per request per verify step that
    drafted, the bonus included (1 + accepted draft tokens / drafts; vLLM's definition). Steps
    without speculation (a schedule's S=0 band) draft nothing and are not counted. 0.0 before
    any draft. Used by `stats()`, the CLI, the metrics and the acceptance watch."""
    return 1.0 + accepted / drafts if drafts else 0.0


_COUNTS = ("steps", "verify_steps", "request_verifies", "committed", "drafts", "draft_tokens", "accepted",
           "tokens_generated", "requests_finished", "requests_aborted", "requests_failed", "reloads_landed_unready",
           "prefills_shared")
_MAPS = ("accepted_per_pos", "batch_sizes", "stage_s")


@dataclass
class EngineStats:
    """What the decode loop did: steps, tokens, acceptance, stage seconds (totals for the life
    of the engine; change them only through the methods, which hold the lock)."""

    steps: int = 0
    verify_steps: int = 0
    request_verifies: int = 0  # sum over verify steps of the batch size
    committed: int = 0  # tokens committed by verifies (accepted drafts + bonus)
    drafts: int = 0  # requests drafted for (per verify step with speculation on: not S=0 steps)
    draft_tokens: int = 0  # draft tokens verified (N - 1 per request per verify step)
    accepted: int = 0  # draft tokens accepted (bonus not counted; S=0 steps accept none)
    accepted_per_pos: dict[int, int] = field(default_factory=dict)  # drafts accepted at position i
    tokens_generated: int = 0
    requests_finished: int = 0
    requests_aborted: int = 0  # ended by abort_request
    requests_failed: int = 0  # failed while admitted (their prefill raised)
    reloads_landed_unready: int = 0  # swap reloads committed before their graphs (boundary.MAX_PREPARE_STEPS)
    prefills_shared: int = 0  # admissions that copied an earlier admission's prefill of the same prompt
    batch_sizes: dict[int, int] = field(default_factory=dict)
    stage_s: dict[str, float] = field(default_factory=lambda: {s: 0.0 for s in STAGES})
    # resets so far: the epoch stamped on the worker's reload records (its ReloadLog is the one
    # log of reloads; the engine reports the records of the current epoch)
    epoch: int = 0
    _lock: Any = field(default_factory=threading.Lock, repr=False, compare=False)
    _mark: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        """Add the body's wall time to ``stage_s[stage]``; the body is also a range named ``stage``
        (profiler, NVTX, span tracer) when one listens."""
        start = time.perf_counter()
        try:
            with span(stage):
                yield
        finally:
            dt = time.perf_counter() - start
            with self._lock:
                self.stage_s[stage] += dt

    def add(self, name: str, n: int = 1) -> None:
        """Add ``n`` to the counter ``name`` (one of the int fields)."""
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    def count_verify(self, batch: int, width: int, drafted: bool, paths: Sequence[int], tokens: int) -> None:
        """One verify step of ``batch`` requests, ``width`` tokens each (N), ``paths`` the
        committed tokens per request (bonus included), ``tokens`` those emitted: every figure
        of the step at once (a reader sees all of them or none)."""
        with self._lock:
            self.steps += 1
            self.verify_steps += 1
            self.request_verifies += batch
            self.draft_tokens += batch * (width - 1)
            if drafted:
                self.drafts += batch
            self.batch_sizes[batch] = self.batch_sizes.get(batch, 0) + 1
            per_pos = self.accepted_per_pos
            for length in paths:
                self.committed += length
                self.accepted += length - 1
                for pos in range(length - 1):
                    per_pos[pos] = per_pos.get(pos, 0) + 1
            self.tokens_generated += tokens

    def reload_stamp(self) -> tuple[int, int]:
        """(epoch, steps since the last `mark`) for a reload record."""
        with self._lock:
            base = self._mark["steps"] if self._mark is not None else 0
            return self.epoch, self.steps - base

    def snapshot(self, since_mark: bool = False) -> dict[str, Any]:
        """A copy of every figure, taken under the lock (safe from any thread). ``since_mark``:
        the figures since the last `mark` (the engine's ``stats()``), else the totals for the
        life of the engine (the exported counters, which never go down)."""
        with self._lock:
            d: dict[str, Any] = {k: getattr(self, k) for k in _COUNTS}
            for k in _MAPS:
                d[k] = dict(getattr(self, k))
            d["epoch"] = self.epoch
            base = self._mark
        if since_mark and base is not None:
            for k in _COUNTS:
                d[k] -= base[k]
            for k in _MAPS:
                old = base[k]
                d[k] = {key: v - old.get(key, 0) for key, v in d[k].items()
                        if k == "stage_s" or v != old.get(key, 0)}
        d["accept_length_mean"] = accept_length(d["accepted"], d["drafts"])
        return d

    def mark(self) -> None:
        """Start `snapshot(since_mark=True)` afresh from now (the totals keep rising) and start a
        new epoch of reload records (the ones before are no longer reported)."""
        totals = self.snapshot()
        with self._lock:
            self._mark = totals
            self.epoch += 1

    def as_dict(self) -> dict[str, Any]:
        """The figures since the last `mark` (`snapshot`)."""
        return self.snapshot(since_mark=True)
