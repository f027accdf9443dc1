"""A short run under the torch profiler with spans on, written as a Chrome/Perfetto trace.

``profile_run(step_fn, steps, out_dir)`` runs ``step_fn(i)`` for i in range(steps) under
``torch.profiler.profile`` (CPU, plus CUDA when available) and writes ``trace.json`` in
``out_dir``; draftgraph's spans (capture, replay[bs,padded], organize, eager_fallback, ...)
show up as ranges because a profiler is active. Open the file at https://ui.perfetto.dev or
chrome://tracing. For Nsight Systems on a GPU, run the same with ``DRAFTGRAPH_NVTX=1`` under
``nsys profile -t cuda,nvtx``: the ranges are in the NVTX domain "draftgraph".

The CLI drives EagleDraftWorker with TinyDraftModel (captured graphs, a few batch sizes and
one size above the largest graph, so replays and an eager fallback both appear).
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["main", "profile_run"]

logger = logging.getLogger(__name__)


def profile_run(step_fn: Callable[[int], Any], steps: int, out_dir: str) -> dict[str, Any]:
    """Profile ``steps`` calls of ``step_fn(i)``; write ``out_dir/trace.json``; return a summary.

    The summary holds the trace path, the wall seconds and, per draftgraph span name, how many
    profiler events it produced (labels ``name[attrs]`` are grouped by ``name``).
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r}: must be an int >= 1")
    os.makedirs(out_dir, exist_ok=True)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    start = time.perf_counter()
    with torch.profiler.profile(activities=activities) as prof:
        for i in range(steps):
            step_fn(i)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    wall = time.perf_counter() - start
    path = os.path.join(out_dir, "trace.json")
    prof.export_chrome_trace(path)
    spans: collections.Counter[str] = collections.Counter()
    for event in prof.key_averages():
        name = event.key.split("[", 1)[0]
        if name in _SPAN_NAMES:
            spans[name] += event.count
    return {"trace": path, "steps": steps, "wall_s": round(wall, 4), "spans": dict(sorted(spans.items()))}


_SPAN_NAMES = frozenset((
    "warmup", "capture", "replay", "eager_run", "eager_fallback", "organize_fast", "organize_tree",
    "rebuild", "reload",
))


def _tiny_worker_step(max_bs: int) -> Callable[[int], Any]:
    """A captured chain EagleDraftWorker over TinyDraftModel; step i drafts one batch."""
    from draftgraph.runtime import (
        CudaGraphConfig,
        EagleDraftWorker,
        PhaseGraphConfig,
        RuntimeArgs,
        SpeculativeConfig,
        TinyDraftModel,
        make_draft_input,
    )

    device = "cuda" if torch.cuda.is_available() else "cpu"
    args = RuntimeArgs(SpeculativeConfig(3, 1), CudaGraphConfig(PhaseGraphConfig(max_bs=max_bs)),
                       max_running_requests=2 * max_bs, device=device)
    worker = EagleDraftWorker(args, TinyDraftModel(device=device))
    worker.capture_graphs()
    sizes = (1, 3, max_bs, 2 * max_bs)  # the last is above the largest graph: eager fallback
    inputs = [make_draft_input(b, 1, seed=b, device=device) for b in sizes]
    return lambda i: worker.draft_forward(inputs[i % len(inputs)])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir", nargs="?", default="profile-out")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--max-bs", type=int, default=8)
    a = p.parse_args(argv)
    summary = profile_run(_tiny_worker_step(a.max_bs), a.steps, a.out_dir)
    print(json.dumps(summary, indent=2))
    print(f"open {summary['trace']} at https://ui.perfetto.dev (or chrome://tracing)")
    return summary


if __name__ == "__main__":
    main()
