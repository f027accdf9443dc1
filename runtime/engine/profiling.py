"""A run under the torch profiler with draftgraph's spans on, written as a Chrome/Perfetto trace.

``profiled(out_dir)`` wraps any code; ``profile_run(step_fn, steps, out_dir)`` profiles a number
of calls; ``draftgraph simulate --profile DIR`` and ``scripts/profile_session.py`` use them.
While the profiler runs, every ``span(name, **attrs)`` of graphs/ and runtime/ becomes a range
labelled ``name[k=v,...]`` (``replay[bs=3,padded=4]``, ``eager_fallback[bs=16]``,
``capture[size=8,backend=trace]``, ``organize_fast[bs=3]``, ``reload[policy=...]``, ...).

Open ``DIR/trace.json`` at https://ui.perfetto.dev (drag the file in) or chrome://tracing.

An engine's steps are profiled by windows of steps instead (``simulate --profile-steps``): see
`step_profiler.profile_steps`; each step is a ``step`` range holding one range per stage.

Nsight Systems (GPU): no torch profiler needed. ``DRAFTGRAPH_NVTX=1`` (or ``true``/``yes``/``on``)
makes ``draftgraph.graphs`` call ``enable_nvtx()`` at import, so the same spans are pushed as
NVTX ranges in the domain "draftgraph" (the ``nvtx`` package is required; without it a warning
is logged and NVTX stays off)::

    DRAFTGRAPH_NVTX=1 nsys profile -t cuda,nvtx -o out draftgraph simulate --requests 8 --no-greedy
"""

from __future__ import annotations

import collections
import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from draftgraph.graphs.spans import record_spans, span_label

__all__ = ["TRACE_FILE", "profile_run", "profiled"]

TRACE_FILE = "trace.json"
"""The file name `profiled` writes in its directory."""


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
