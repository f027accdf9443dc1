"""Profiling: windows of engine steps, the ``step`` range, and traces of a run or of windows.

Windows. `parse_profile_steps` reads ``A-B[,C-D...]`` (inclusive, engine steps counted from 0, as
``simulate --profile-steps`` takes it); `check_windows` validates windows given as pairs.

The step. `engine_step` is what `SpecDecodeEngine.step` runs: the step's index, the ``step`` range
(``step[i=..]``, when a profiler, NVTX or a span tracer listens; the pipeline opens a ``served``
range inside it once the dispatch is known) and the attached profiler's window hooks.

A run. ``profiled(out_dir)`` wraps any code under the torch profiler with draftgraph's spans on;
``profile_run(step_fn, steps, out_dir)`` profiles a number of calls (``scripts/profile_session.py``
uses them; ``draftgraph simulate --profile DIR`` profiles windows, below). While the profiler runs, every
``span(name, **attrs)`` of graphs/ and runtime/ becomes a range labelled ``name[k=v,...]``
(``replay[bs=3,padded=4]``, ``eager_fallback[bs=16]``, ``capture[size=8,backend=trace]``,
``organize_fast[bs=3]``, ``reload[policy=...]``, ...). Open ``DIR/trace.json`` at
https://ui.perfetto.dev (drag the file in) or chrome://tracing.

Windows of an engine's steps. `profile_steps(engine, out_dir, windows)` (a context manager) or a
`StepProfiler` attached as ``engine.profiler`` records only the engine steps inside the windows
(inclusive, counted from 0 by ``engine.step_index``): ``spans_only`` records draftgraph's ranges
with the span tracer (no torch profiler, a few KB per step), otherwise the torch profiler records
them with the aten ops. When CUDA is available the same windows call ``torch.cuda.profiler.start``
/ ``stop`` (cudaProfilerStart / Stop), so ``nsys profile -c cudaProfilerApi`` records the same
steps; ``out_dir=None`` does only that. At the end ``out_dir/trace.json`` holds every window, and
the summary carries the range table (`profile_report.range_table`) and the per-step stage times.
Each step is a ``step`` range holding one range per stage.

A failure to write (a full disk: an OSError from the exporter) never reaches the engine's step:
the window is dropped, the error is logged and counted (``export_failures``, ``errors`` in the
summary) and no further window opens. The torch profiler (ops mode) records at most
`MAX_OPS_STEPS` steps in all, with or without windows (each step holds megabytes of events in
memory until the end; a window such as ``0-10**20`` is no exception), then stops with a warning:
give shorter windows (``--profile-steps``) to record later steps.

Nsight Systems (GPU): no torch profiler needed. ``DRAFTGRAPH_NVTX=1`` (or ``true``/``yes``/``on``)
makes ``draftgraph.graphs`` call ``enable_nvtx()`` at import, so the same spans are pushed as
NVTX ranges in the domain "draftgraph" (the ``nvtx`` package is required; without it a warning
is logged and NVTX stays off)::

    DRAFTGRAPH_NVTX=1 nsys profile -t cuda,nvtx -o out draftgraph simulate --requests 8 --no-greedy

Reading a trace back (the range table, stage times, the plot) lives in `profile_report`.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from draftgraph.graphs.spans import record_spans, span, span_label, spans_active, trace_spans

from .profile_report import base_name, range_table, step_stages, trace_ranges, write_stage_plot

__all__ = ["MAX_OPS_STEPS", "STAGES_PLOT", "TRACE_FILE", "StepProfiler", "Window", "check_windows",
           "engine_step", "parse_profile_steps", "profile_run", "profile_steps", "profiled"]

logger = logging.getLogger(__name__)

TRACE_FILE = "trace.json"
"""The file name `profiled` and `StepProfiler` write in their directory."""
STAGES_PLOT = "stages.svg"
MAX_OPS_STEPS = 100
"""Steps the torch profiler records in all, windows or not (measured: about 5.7 MiB of
events per step of the demo engine, held in memory until the trace is written)."""

Window = tuple[int, int]
"""First and last engine step of a window, inclusive, counted from 0."""
ALL_STEPS: Window = (0, sys.maxsize)


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


def engine_step(index: int, profiler: Any, body: Callable[[], list[int]]) -> list[int]:
    """Run one engine step ``body()`` as step ``index`` (the engine counts its steps): inside a
    ``step`` range when anything listens, between ``profiler``'s window hooks (None: none)."""
    if profiler is not None:
        profiler.before_step(index)
    # once the step committed its results are returned whatever the profiler does: a hook that
    # raises (it should not: `StepProfiler` logs and counts its own write failures) is logged
    try:
        if spans_active():
            with span("step", i=index):
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


@contextlib.contextmanager
def profiled(out_dir: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Run the body under ``torch.profiler.profile`` (CPU, plus CUDA when available).

    Yields a dict that is filled at exit, after CUDA is synchronized and ``out_dir/trace.json``
    is written: ``trace`` (the path), ``wall_s`` (the body plus the sync) and ``spans`` (per
    draftgraph span name, how many profiler ranges it produced; labels ``name[attrs]`` are
    grouped by ``name``). When the body raises, no trace is written.
    """
    if not isinstance(out_dir, (str, os.PathLike)) or not os.fspath(out_dir):
        raise ValueError(f"out_dir={out_dir!r}: must be a non-empty path")
    path = os.path.join(os.fspath(out_dir), TRACE_FILE)
    os.makedirs(os.fspath(out_dir), exist_ok=True)
    cuda = torch.cuda.is_available()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    summary: dict[str, Any] = {"trace": path}
    with record_spans() as records, torch.profiler.profile(activities=activities) as prof:
        start = time.perf_counter()
        yield summary
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
    prof.export_chrome_trace(path)
    summary["wall_s"] = round(wall, 4)
    summary["spans"] = _span_counts(prof, records)


def _span_counts(prof: Any, records: list[tuple[str, dict[str, Any]]]) -> dict[str, int]:
    """Host-side profiler ranges whose label is one a draftgraph span used, counted per name."""
    names = {span_label(name, attrs): name for name, attrs in records}
    counts: collections.Counter[str] = collections.Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CPU and event.name in names:
            counts[names[event.name]] += 1
    return dict(sorted(counts.items()))


def profile_run(step_fn: Callable[[int], Any], steps: int, out_dir: str) -> dict[str, Any]:
    """Profile ``steps`` calls of ``step_fn(i)``; write ``out_dir/trace.json``; return the
    `profiled` summary plus ``steps``."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r}: must be an int >= 1")
    with profiled(out_dir) as summary:
        for i in range(steps):
            step_fn(i)
    return {"trace": summary["trace"], "steps": steps, "wall_s": summary["wall_s"],
            "spans": summary["spans"]}


class StepProfiler:
    """Records the engine steps inside ``windows`` (None: every step). The engine calls
    `before_step` / `after_step` around each step; `close` stops a window still open, writes
    the trace and returns the summary."""

    def __init__(self, out_dir: str | os.PathLike[str] | None, windows: Sequence[Sequence[int]] | None = None,
                 spans_only: bool = False, cuda_profiler: bool | None = None) -> None:
        if out_dir is not None and (not isinstance(out_dir, (str, os.PathLike)) or not os.fspath(out_dir)):
            raise ValueError(f"out_dir={out_dir!r}: must be a non-empty path or None")
        self.out_dir = None if out_dir is None else os.fspath(out_dir)
        self.windows = (ALL_STEPS,) if windows is None else check_windows(windows)
        self.spans_only = bool(spans_only)
        self.cuda_profiler = torch.cuda.is_available() if cuda_profiler is None else bool(cuda_profiler)
        self._stack: contextlib.ExitStack | None = None
        self._window_events: list[dict[str, Any]] = []  # the span tracer's, in a spans-only window
        self._window_records: list[tuple[str, dict[str, Any]]] = []  # spans seen by the torch profiler
        self._torch_prof: Any = None
        self._events: list[dict[str, Any]] = []
        self._labels: set[str] = set()
        self._meta: dict[str, Any] = {}
        self._steps_recorded = 0
        self._wall_s = 0.0
        self._t0 = 0.0
        self._closed = False
        self._window_steps = 0
        self.export_failures = 0
        self.errors: list[str] = []
        self.capped = False
        if self.out_dir is not None:
            os.makedirs(self.out_dir, exist_ok=True)

    @property
    def recording(self) -> bool:
        """True inside a window."""
        return self._stack is not None

    def before_step(self, index: int) -> None:
        """Open a window when step ``index`` lies in one (its first step, or a later one when
        the profiler was attached mid-window)."""
        if self._stack is None and not self._closed and any(a <= index <= b for a, b in self.windows):
            self._start()
        if self._stack is not None:
            self._steps_recorded += 1
            self._window_steps += 1

    def after_step(self, index: int) -> None:
        """Close the window when step ``index`` ends one (or when an ops recording
        reached `MAX_OPS_STEPS` steps in all). Never raises for a failed write (see the module)."""
        if self._stack is None:
            return
        if self._ops_recording() and self._steps_recorded >= MAX_OPS_STEPS:
            self.capped = True
            logger.warning("profiling stopped after %d steps (MAX_OPS_STEPS): the torch profiler holds every "
                           "recorded step's events in memory until the end, whatever the windows; give "
                           "--profile-steps windows of fewer steps in all, or --profile-spans-only",
                           self._steps_recorded)
            self._stop()
            self._closed = True  # no further window
        elif any(index == b for _, b in self.windows):
            self._stop()

    def _ops_recording(self) -> bool:
        return not self.spans_only and self.out_dir is not None

    def _start(self) -> None:
        stack = contextlib.ExitStack()
        if self.cuda_profiler:
            torch.cuda.profiler.start()
            stack.callback(torch.cuda.profiler.stop)
        if self.out_dir is not None:
            if self.spans_only:
                self._window_events = stack.enter_context(trace_spans())
            else:
                self._window_records = stack.enter_context(record_spans())
                activities = [torch.profiler.ProfilerActivity.CPU]
                if torch.cuda.is_available():
                    activities.append(torch.profiler.ProfilerActivity.CUDA)
                self._torch_prof = stack.enter_context(torch.profiler.profile(activities=activities))
        self._stack = stack
        self._t0 = time.perf_counter()
        logger.info("profiling window opened (%s)", "spans only" if self.spans_only else "torch profiler")

    def _stop(self) -> None:
        """End the window; a failed write drops it (logged, counted) and ends the profiling."""
        try:
            self._stop_window()
        except OSError as exc:
            self._failed(exc)

    def _failed(self, exc: OSError) -> None:
        self.export_failures += 1
        self.errors.append(f"{type(exc).__name__}: {exc}"[:300])
        self._torch_prof = None
        self._closed = True  # a full disk stays full: open no further window
        logger.error("profile export to %s failed; the window is dropped and profiling stops (serving goes on): %s",
                     self.out_dir, exc)

    def _stop_window(self) -> None:
        stack, self._stack = self._stack, None
        self._window_steps = 0
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self._wall_s += time.perf_counter() - self._t0
        stack.close()
        if self.out_dir is None:
            return
        if self.spans_only:
            self._events.extend(sorted(self._window_events, key=lambda e: e["ts"]))
            return
        self._labels.update(span_label(n, a) for n, a in self._window_records)
        part = os.path.join(self.out_dir, f".window-{len(self._meta.get('windows', []))}.json")
        prof, self._torch_prof = self._torch_prof, None
        try:
            prof.export_chrome_trace(part)
            with open(part) as f:
                doc = json.load(f)
        finally:
            with contextlib.suppress(OSError):
                os.remove(part)
        self._events.extend(doc.pop("traceEvents", []))
        self._meta.setdefault("windows", []).append(doc)

    def close(self) -> dict[str, Any]:
        """Stop an open window; write ``out_dir/trace.json`` (and ``stages.svg`` with matplotlib);
        return the summary: trace path and bytes, windows, steps recorded, the range table
        (``ranges``), the per-step stage times (``steps``) and span counts per name (``spans``)."""
        if self._stack is not None:
            self._stop()
        self._closed = True
        summary: dict[str, Any] = {"windows": [list(w) for w in self.windows if w != ALL_STEPS] or "all",
                                   "mode": "spans_only" if self.spans_only else "ops",
                                   "cuda_profiler_api": self.cuda_profiler,
                                   "steps_recorded": self._steps_recorded, "wall_s": round(self._wall_s, 4),
                                   "capped_at": MAX_OPS_STEPS if self.capped else None}
        if self.out_dir is None:
            return summary
        try:
            self._write(summary)
        except OSError as exc:
            self._failed(exc)
        summary.update(export_failures=self.export_failures, errors=list(self.errors))
        return summary

    def _write(self, summary: dict[str, Any]) -> None:
        """Write the trace (and the plot) into ``out_dir`` and add their figures to ``summary``."""
        out_dir = os.fspath(self.out_dir or ".")
        path = os.path.join(out_dir, TRACE_FILE)
        doc = {"traceEvents": self._events, "displayTimeUnit": "ms"}
        if self._meta.get("windows"):
            first = self._meta["windows"][0]
            doc.update({k: v for k, v in first.items() if k not in doc})
            doc["traceName"] = path  # not the first window's temporary file
        with open(path, "w") as f:
            json.dump(doc, f)
        ranges = trace_ranges(self._events, None if self.spans_only else self._labels)
        steps = step_stages(ranges)
        counts: dict[str, int] = {}
        for e in ranges:
            name = base_name(e["name"])
            counts[name] = counts.get(name, 0) + 1
        summary.update(trace=path, trace_bytes=os.path.getsize(path), ranges=range_table(ranges),
                       steps=steps, spans=dict(sorted(counts.items())),
                       stages_svg=write_stage_plot(steps, os.path.join(out_dir, STAGES_PLOT)))


@contextlib.contextmanager
def profile_steps(engine: Any, out_dir: str | os.PathLike[str] | None,
                  windows: Sequence[Sequence[int]] | None = None, spans_only: bool = False,
                  cuda_profiler: bool | None = None) -> Iterator[dict[str, Any]]:
    """Attach a `StepProfiler` to ``engine`` for the body (for hosts that drive ``engine.step()``
    themselves); yields a dict filled with the summary at exit (also when the body raises)."""
    if engine.profiler is not None:
        raise ValueError("engine.profiler: a StepProfiler is already attached")
    profiler = StepProfiler(out_dir, windows, spans_only, cuda_profiler)
    summary: dict[str, Any] = {}
    engine.profiler = profiler
    try:
        yield summary
    finally:
        engine.profiler = None
        summary.update(profiler.close())
