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

When the inner policy can serve a given S (an `AdaptivePolicy`: ``candidate_steps`` and
``serve``), the kinds are every candidate S and 0, each measured on its own: the gate serves
the S that has delivered the most, not the one the acceptance rule would pick. On a CPU a
verify row costs almost as much as a decode (the int4 products run per row), so the best S for
a head is often smaller than "expected acceptance + 1"; measured here on SmolLM2 (q4, the
shipped head, 1 request): S = 1 25.2, S = 2 22.5, S = 4 14.5 tokens per CPU-second against
22.2 plain. Probes then visit the other kinds in turn.

With graph phases (the host's verify / extend captured), plain steps serve from a target-only
state of their own (`PlainSteps`: the width-1 verify and extend graphs, `build_target_state`),
made active for each plain step and left for the speculative state at the next speculative one,
so a plain step never runs its verify eagerly beside graphs (measured on SmolLM2 q4, compile
backend: a compiled width-1 verify 15.7 ms against 26 ms eager).

Tokens never change: every step, plain or speculative, emits the target's own tokens (the
verify is lossless), so only speed depends on the clock. It is the engine's choice on one
process: a rank group needs the same step on every rank and keeps its schedule's bands instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PayoffGate", "PlainSteps"]


SPECULATIVE = -1  # the kind "the inner policy's own S" (an inner policy that cannot serve a given S)


class PlainSteps:
    """The target-only ``state`` a plain step serves from on ``worker`` (see the module
    docstring): `activate` makes it active and remembers the state it replaced, `restore` puts
    that one back (for an inner policy that does not switch states itself)."""

    def __init__(self, worker: Any, state: Any) -> None:
        self.worker, self.state = worker, state
        self._before: Any = None

    def activate(self) -> None:
        if self.worker.state is not self.state:
            self._before = self.worker.state
            self.worker.apply_runtime_state(self.state)

    def restore(self) -> None:
        if self.worker.state is self.state and self._before is not None:
            self.worker.apply_runtime_state(self._before)

    def release(self) -> None:
        """Release the state's graphs unless it is the active one."""
        if self.worker.state is not self.state:
            self.state.release()


@dataclass
class _Band:
    """One batch-size band's measurements: rate and steps served by kind (0: plain, else an S or
    `SPECULATIVE`), the steps since the last probe and the probe turn."""

    kinds: tuple[int, ...]
    rate: dict[int, float | None] = field(default_factory=dict)
    served: dict[int, int] = field(default_factory=dict)
    since_probe: int = 0
    turn: int = 0

    def __post_init__(self) -> None:
        self.rate = {k: None for k in self.kinds}
        self.served = {k: 0 for k in self.kinds}


class PayoffGate:
    """Wraps ``inner`` (a `StepPolicy`): `begin` returns 0 (a plain step) or the inner policy's S.

    In each band: ``warmup`` steps of each speculative kind first (the largest S first), then
    ``warmup`` plain ones; afterwards the fastest kind by EMA (weight ``alpha``), another one
    (in turn) every ``probe_every`` steps. ``plain``: the state plain steps serve from (None:
    the active state, its verify eager)."""

    def __init__(self, inner: Any, probe_every: int = 16, alpha: float = 0.25, warmup: int = 3,
                 clock: Callable[[], float] = time.perf_counter, plain: PlainSteps | None = None) -> None:
        for name, value in (("probe_every", probe_every), ("warmup", warmup)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r}: must be an int >= 1")
        if not 0.0 < float(alpha) <= 1.0:
            raise ValueError(f"alpha={alpha!r}: must be in (0, 1]")
        self.inner = inner
        self.plain = plain
        self.probe_every, self.alpha, self.warmup = probe_every, float(alpha), warmup
        self._clock = clock
        servable = callable(getattr(inner, "serve", None)) and hasattr(inner, "candidate_steps")
        # warm-up order: the speculative kinds, largest S first, then plain
        self.kinds: tuple[int, ...] = (*sorted(inner.candidate_steps, reverse=True), 0) if servable \
            else (SPECULATIVE, 0)
        self.bands: dict[int, _Band] = {}  # by batch_size.bit_length()
        self.served = {k: 0 for k in self.kinds}
        self._open: tuple[_Band, int] | None = None  # the band and kind of the step in flight
        self._started = 0.0
        self._accepted = 0.0

    def _close(self, now: float) -> None:
        """Fold the step that just ended into its band's rate for its kind."""
        if self._open is None:
            return
        band, kind = self._open
        r = ((1.0 + self._accepted) if kind else 1.0) / max(now - self._started, 1e-9)
        old = band.rate[kind]
        band.rate[kind] = r if old is None else self.alpha * r + (1.0 - self.alpha) * old

    def _choose(self, band: _Band) -> int:
        for kind in self.kinds:
            if band.served[kind] < self.warmup:
                return kind
        best = max(self.kinds, key=lambda k: band.rate[k] or 0.0)
        if band.since_probe >= self.probe_every:  # a probe of another kind, in turn
            band.since_probe = 0
            others = [k for k in self.kinds if k != best]
            band.turn = (band.turn + 1) % len(others)
            return others[band.turn]
        band.since_probe += 1
        return best

    def begin(self, batch_size: int) -> int:
        self._close(self._clock())
        band = self.bands.setdefault(max(int(batch_size), 1).bit_length(), _Band(self.kinds))
        kind = self._choose(band)
        band.served[kind] += 1
        self.served[kind] += 1
        self._open, self._started, self._accepted = (band, kind), self._clock(), 0.0
        if kind == 0:
            if self.plain is not None:
                self.plain.activate()
            return 0
        if self.plain is not None:
            self.plain.restore()
        if kind == SPECULATIVE:
            return self.inner.begin(batch_size)
        self.inner.serve(kind)
        return kind

    def observe(self, accepted: float) -> None:
        self._accepted = float(accepted)
        self.inner.observe(accepted)

    def states(self) -> list[Any]:
        return self.inner.states() + ([self.plain.state] if self.plain is not None else [])

    def release(self) -> None:
        self.inner.release()
        if self.plain is not None:
            self.plain.release()

    def as_dict(self) -> dict[str, Any]:
        """The inner policy's figures and ``payoff``: steps by kind (``steps_by_s``, the
        speculative kinds summed), and per band the steps and rates (the best speculative
        kind's as ``speculative_tokens_per_s``)."""
        def spec(d: dict[int, Any], pick: Any) -> Any:
            values = [v for k, v in d.items() if k and v is not None]
            return pick(values) if values else None

        out = dict(self.inner.as_dict())
        bands = {f"{1 << (k - 1)}-{(1 << k) - 1}": {
            "speculative_steps": spec(b.served, sum) or 0, "plain_steps": b.served[0],
            "speculative_tokens_per_s": spec(b.rate, max), "plain_tokens_per_s": b.rate[0],
            "tokens_per_s_by_s": {str(k): v for k, v in b.rate.items() if k != SPECULATIVE}}
            for k, b in sorted(self.bands.items())}
        out["payoff"] = {"speculative_steps": spec(self.served, sum) or 0, "plain_steps": self.served[0],
                         "steps_by_s": {str(k): v for k, v in self.served.items() if k != SPECULATIVE},
                         "bands": bands}
        return out
