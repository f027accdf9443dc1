"""Windows of engine steps to profile, and the ``step`` range around every engine step.

`parse_profile_steps` reads ``A-B[,C-D...]`` (inclusive, engine steps counted from 0, as
``simulate --profile-steps`` takes it); `check_windows` validates windows given as pairs.
`engine_step` is what `SpecDecodeEngine.step` runs: the step's index, the ``step`` range (when a
profiler, NVTX or a span tracer listens) and the attached profiler's window hooks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from draftgraph.graphs.spans import span, spans_active

__all__ = ["Window", "check_windows", "engine_step", "parse_profile_steps", "step_attrs"]

logger = logging.getLogger(__name__)

Window = tuple[int, int]
"""First and last engine step of a window, inclusive, counted from 0."""


def parse_profile_steps(text: str, flag: str = "--profile-steps") -> tuple[Window, ...]:
    """``"A-B,C-D"`` (or ``"A"`` for one step) as windows; ValueError naming ``flag`` when a part
    is not ``A-B`` of ints >= 0, when B < A, or when windows overlap or are out of order."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{flag}={text!r}: expected A-B[,C-D...] (engine steps, from 0)")
    windows: list[Window] = []
    for part in text.split(","):
        ends = part.strip().split("-")
        if len(ends) > 2 or not all(e.strip().isdigit() for e in ends):
            raise ValueError(f"{flag}={text!r}: {part.strip()!r} is not A-B with A and B whole "
                             f"numbers >= 0 (engine steps, from 0)")
        a, b = int(ends[0]), int(ends[-1])
        windows.append((a, b))
    return check_windows(windows, flag)


def check_windows(windows: Sequence[Sequence[int]], name: str = "windows") -> tuple[Window, ...]:
    """Windows as a tuple of (first, last) pairs; ValueError naming ``name`` when one is not two
    ints >= 0 with last >= first, or when they overlap or are not in ascending order."""
    out: list[Window] = []
    for w in windows:
        if (len(w) != 2 or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in w)):
            raise ValueError(f"{name}: window {w!r} must be two ints >= 0 (first, last step)")
        a, b = int(w[0]), int(w[1])
        if b < a:
            raise ValueError(f"{name}: window {a}-{b} ends before it starts (need B >= A)")
        if out and a <= out[-1][1]:
            raise ValueError(f"{name}: window {a}-{b} overlaps or precedes {out[-1][0]}-{out[-1][1]}"
                             f" (windows must be disjoint and ascending)")
        out.append((a, b))
    if not out:
        raise ValueError(f"{name}: at least one window is needed")
    return tuple(out)


def step_attrs(engine: Any, index: int) -> dict[str, Any]:
    """The ``step`` range's attributes, as planned when the step starts: its index, the batch
    (running requests plus those admission can take), the active state's S / topk / N, and
    ``graph`` when that state has a ready graph for the batch, else ``eager``."""
    spec = engine.worker.spec
    bs = engine.next_batch_size()
    graphs = engine.worker.state.graphs
    mode = "eager"
    if graphs is not None and bs:
        padded = graphs.padded_size(bs)
        if padded is not None and graphs.captured_graph(padded) is not None:
            mode = "graph"
    return {"i": index, "bs": bs, "S": spec.num_steps, "topk": spec.topk,
            "N": spec.num_draft_tokens, "mode": mode}


def engine_step(engine: Any, body: Callable[[], list[int]]) -> list[int]:
    """Run one engine step ``body()`` as step ``engine.step_index`` (then advanced): inside a
    ``step`` range when anything listens, between the attached profiler's window hooks."""
    index = engine.step_index
    engine.step_index = index + 1
    profiler = engine.profiler
    if profiler is not None:
        profiler.before_step(index)
    # once the step committed its results are returned whatever the profiler does: a hook that
    # raises (it should not: `StepProfiler` logs and counts its own write failures) is logged
    try:
        if spans_active():
            with span("step", **step_attrs(engine, index)):
                out = body()
        else:
            out = body()
    except BaseException:
        if profiler is not None:
            _after_step(profiler, index)
        raise
    if profiler is not None:
        _after_step(profiler, index)
    return out


def _after_step(profiler: Any, index: int) -> None:
    """The profiler's ``after_step``; an Exception from it is logged, never raised."""
    try:
        profiler.after_step(index)
    except Exception:  # the step's results come first
        logger.exception("profiler after_step(%d) raised; the step's results are returned", index)
