"""`PayoffGate`: plain target steps when speculation does not pay, by measured throughput.

A head that accepts little (a real model's first head accepts ~0.3-0.5 draft tokens a step)
makes a speculative step, with its wider verify, its drafting and its extend, slower per token
than a plain decode. The gate wraps the step policy and serves, step by step, whichever of the
two has delivered more tokens per request per second lately at this batch size: a speculative
step delivers 1 + the accepted drafts, a plain step (S = 0: the engine's one-node tree) 1. Both
rates are exponential moving averages of what the engine measured (the wall time from one
step's `begin` to the next), kept per batch-size band (1, 2-3, 4-7, 8-15, ...: what pays at
batch 1 need not at batch 8); in each band the other kind is probed once every
``probe_every`` steps, so a head that starts to pay (or a batch at which it pays) wins the steps
back.

Tokens never change: every step, plain or speculative, emits the target's own tokens (the
verify is lossless), so only speed depends on the clock. It is the engine's choice on one
process: a rank group needs the same step on every rank and keeps its schedule's bands instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PayoffGate"]


@dataclass
class _Band:
    """One batch-size band's measurements: rate by kind (True: speculative), steps served."""

    rate: dict[bool, float | None] = field(default_factory=lambda: {True: None, False: None})
    served: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})
    since_probe: int = 0


class PayoffGate:
    """Wraps ``inner`` (a `StepPolicy`): `begin` returns 0 (a plain step) or the inner policy's S.

    In each band: ``warmup`` speculative steps first (the inner controller settles its S), then
    ``warmup`` plain ones; afterwards the faster kind by EMA (weight ``alpha``), the other every
    ``probe_every`` steps."""

    def __init__(self, inner: Any, probe_every: int = 16, alpha: float = 0.25, warmup: int = 3,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        for name, value in (("probe_every", probe_every), ("warmup", warmup)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r}: must be an int >= 1")
        if not 0.0 < float(alpha) <= 1.0:
            raise ValueError(f"alpha={alpha!r}: must be in (0, 1]")
        self.inner = inner
        self.probe_every, self.alpha, self.warmup = probe_every, float(alpha), warmup
        self._clock = clock
        self.bands: dict[int, _Band] = {}  # by batch_size.bit_length()
        self.served = {True: 0, False: 0}
        self._open: tuple[_Band, bool] | None = None  # the band and kind of the step in flight
        self._started = 0.0
        self._accepted = 0.0

    def _close(self, now: float) -> None:
        """Fold the step that just ended into its band's rate for its kind."""
        if self._open is None:
            return
        band, speculative = self._open
        r = ((1.0 + self._accepted) if speculative else 1.0) / max(now - self._started, 1e-9)
        old = band.rate[speculative]
        band.rate[speculative] = r if old is None else self.alpha * r + (1.0 - self.alpha) * old

    def _choose(self, band: _Band) -> bool:
        if band.served[True] < self.warmup:
            return True
        if band.served[False] < self.warmup:
            return False
        spec, plain = band.rate[True], band.rate[False]
        best = spec is not None and plain is not None and spec >= plain
        if band.since_probe >= self.probe_every:  # a probe of the other kind
            band.since_probe = 0
            return not best
        band.since_probe += 1
        return best

    def begin(self, batch_size: int) -> int:
        self._close(self._clock())
        band = self.bands.setdefault(max(int(batch_size), 1).bit_length(), _Band())
        speculate = self._choose(band)
        band.served[speculate] += 1
        self.served[speculate] += 1
        self._open, self._started, self._accepted = (band, speculate), self._clock(), 0.0
        return self.inner.begin(batch_size) if speculate else 0

    def observe(self, accepted: float) -> None:
        self._accepted = float(accepted)
        self.inner.observe(accepted)

    def states(self) -> list[Any]:
        return self.inner.states()

    def release(self) -> None:
        self.inner.release()

    def as_dict(self) -> dict[str, Any]:
        out = dict(self.inner.as_dict())
        bands = {f"{1 << (k - 1)}-{(1 << k) - 1}": {"speculative_steps": b.served[True], "plain_steps": b.served[False],
                                                    "speculative_tokens_per_s": b.rate[True],
                                                    "plain_tokens_per_s": b.rate[False]}
                 for k, b in sorted(self.bands.items())}
        out["payoff"] = {"speculative_steps": self.served[True], "plain_steps": self.served[False], "bands": bands}
        return out
