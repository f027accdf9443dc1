"""Speculation schedules: the step count S follows the batch size, speculation off included.

Speculation pays most at small batches and can cost at large ones, and the best S moves with
the batch. A `SpeculationSchedule` maps batch-size bands to step counts: ``"1:5,4:3,16:1,32:0"``
serves S=5 for batch sizes 1-3, S=3 for 4-15, S=1 for 16-31 and no speculation (S=0: a plain
target decode of one token per request) from 32 up. A band may list several candidates
(``"1:3|4|5"``): an acceptance-fed adaptive controller picks among them inside that band.

The schedule is configuration only (frozen, validated, no torch state): the engine builds one
state per (band, S) capturing only the batch sizes that band can reach, and takes the band and
the choice at the same step on every rank (see `runtime.engine.scheduling`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from draftgraph.runtime.bounds import MAX_NUM_STEPS

from .validation import ConfigTypeError

__all__ = ["ScheduleBand", "SpeculationSchedule"]


@dataclass(frozen=True)
class ScheduleBand:
    """Batch sizes ``min_bs``..``max_bs`` (None: no upper end) serve one of ``steps`` (ascending;
    0 alone means speculation off)."""

    min_bs: int
    max_bs: int | None
    steps: tuple[int, ...]

    @property
    def off(self) -> bool:
        """True when this band serves no speculation."""
        return self.steps == (0,)

    def label(self) -> str:
        """``"4-15"`` or ``"32+"``."""
        return f"{self.min_bs}-{self.max_bs}" if self.max_bs is not None else f"{self.min_bs}+"


@dataclass(frozen=True)
class SpeculationSchedule:
    """Batch-size thresholds to step counts; see the module docstring. ``hysteresis``: a band is
    left downward only when the batch size falls ``hysteresis`` below its threshold (0: at once),
    so a batch that hovers at a threshold does not flap between two bands."""

    thresholds: tuple[int, ...]
    steps: tuple[tuple[int, ...], ...]
    hysteresis: int = 0

    def __post_init__(self) -> None:
        th = tuple(self.thresholds)
        st = tuple(tuple(s) for s in self.steps)
        object.__setattr__(self, "thresholds", th)
        object.__setattr__(self, "steps", st)
        if not th:
            raise ValueError("schedule: needs at least one band (\"B:S\", the first B being 1)")
        if len(th) != len(st):
            raise ValueError(f"schedule: {len(th)} thresholds but {len(st)} step lists")
        for i, b in enumerate(th):
            if isinstance(b, bool) or not isinstance(b, int) or b < 1:
                raise ValueError(f"schedule band {i}: threshold {b!r} must be an int >= 1")
            if i and b <= th[i - 1]:
                raise ValueError(f"schedule band {i}: threshold {b} must be above the previous one "
                                 f"({th[i - 1]}): thresholds ascend")
        if th[0] != 1:
            raise ValueError(f"schedule band 0: the first threshold is {th[0]}: it must be 1 (every "
                             f"batch size needs a band)")
        for i, cands in enumerate(st):
            where = f"schedule band {i} ({th[i]}:)"
            if not cands:
                raise ValueError(f"{where}: no step count")
            for s in cands:
                if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s <= MAX_NUM_STEPS:
                    raise ValueError(f"{where}: step count {s!r} must be an int in [0, {MAX_NUM_STEPS}]")
            if list(cands) != sorted(set(cands)):
                raise ValueError(f"{where}: candidates {list(cands)} must ascend without repeats")
            if 0 in cands and len(cands) > 1:
                raise ValueError(f"{where}: 0 (speculation off) cannot be a candidate beside others")
        h = self.hysteresis
        if isinstance(h, bool) or not isinstance(h, int) or h < 0:
            raise ValueError(f"schedule hysteresis={h!r}: must be an int >= 0")

    # ---- reading it ---------------------------------------------------------------------------
    @classmethod
    def parse(cls, text: str, hysteresis: int = 0) -> SpeculationSchedule:
        """``"1:5,4:3,16:1,32:0"``; a band's candidates separated by ``|`` (``"1:3|4|5"``)."""
        if not isinstance(text, str):
            raise ConfigTypeError(f"schedule={text!r}: must be a string such as \"1:5,4:3,16:1,32:0\"")
        thresholds, steps = [], []
        for i, part in enumerate(p.strip() for p in text.split(",")):
            b, sep, s = part.partition(":")
            if not sep:
                raise ValueError(f"schedule band {i} {part!r}: must be B:S (batch size : step count)")
            try:
                thresholds.append(int(b))
                steps.append(tuple(int(x) for x in s.split("|")))
            except ValueError:
                raise ValueError(f"schedule band {i} {part!r}: B and S must be integers "
                                 f"(B:S or B:S1|S2)") from None
        return cls(tuple(thresholds), tuple(steps), hysteresis)

    @classmethod
    def from_data(cls, data: Any) -> SpeculationSchedule:
        """From an args file: the text form, a table ``{"1": 5, "4": [2, 3]}``, or
        ``{"bands": <text or table>, "hysteresis": 2}``."""
        if isinstance(data, SpeculationSchedule):
            return data
        if isinstance(data, str):
            return cls.parse(data)
        if isinstance(data, dict) and "bands" in data:
            unknown = sorted(set(data) - {"bands", "hysteresis"})
            if unknown:
                raise ValueError(f"schedule: unknown keys {unknown}; allowed: ['bands', 'hysteresis']")
            inner = cls.from_data(data["bands"])
            return cls(inner.thresholds, inner.steps, data.get("hysteresis", 0))
        if isinstance(data, dict):
            items = []
            for k, v in data.items():
                try:
                    b = int(k)
                except (TypeError, ValueError):
                    raise ValueError(f"schedule key {k!r}: must be a batch size") from None
                items.append((b, tuple(v) if isinstance(v, list) else (v,)))
            items.sort()
            return cls(tuple(b for b, _ in items), tuple(s for _, s in items))
        raise ConfigTypeError(f"schedule={data!r}: must be a string like \"1:5,4:3,32:0\" or a table")

    def text(self) -> str:
        """The text form (round-trips through `parse`)."""
        return ",".join(f"{b}:{'|'.join(map(str, s))}" for b, s in zip(self.thresholds, self.steps))

    @property
    def bands(self) -> tuple[ScheduleBand, ...]:
        """The bands in ascending batch size."""
        th = self.thresholds
        return tuple(ScheduleBand(b, th[i + 1] - 1 if i + 1 < len(th) else None, s)
                     for i, (b, s) in enumerate(zip(th, self.steps)))

    def band_index(self, batch_size: int, current: int | None = None) -> int:
        """The band serving ``batch_size``; with ``current`` (the band served last) and
        hysteresis, a band is left downward only below its threshold minus the hysteresis."""
        th = self.thresholds
        i = 0
        for j, b in enumerate(th):
            if batch_size >= b:
                i = j
        if current is not None and self.hysteresis and i < current:
            if batch_size >= th[current] - self.hysteresis:
                return current
        return i

    def step_counts(self) -> tuple[int, ...]:
        """Every S the schedule may serve, ascending (0 included when a band is off)."""
        return tuple(sorted({s for cands in self.steps for s in cands}))
