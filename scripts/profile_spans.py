"""Profiling session: a few serving steps under the span recorder and a torch profiler.

Prints how many spans of each name were emitted (with an example of their attributes) and
the profiler's totals for them; ``--trace PATH`` also exports a Chrome trace, ``--nvtx`` turns
NVTX ranges on (run under ``nsys profile`` to see them in the "draftgraph" domain).
"""

from __future__ import annotations

import argparse
import collections
import json

import torch

from draftgraph.graphs import enable_nvtx, record_spans
from draftgraph.runtime import (
    CudaGraphConfig,
    EagleDraftWorker,
    PhaseGraphConfig,
    RuntimeArgs,
    SpeculativeConfig,
    TinyDraftModel,
    make_draft_input,
)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--trace", help="export a Chrome trace here")
    p.add_argument("--nvtx", action="store_true")
    a = p.parse_args(argv)
    if a.nvtx:
        enable_nvtx()
    args = RuntimeArgs(SpeculativeConfig(3, 1), CudaGraphConfig(PhaseGraphConfig(max_bs=16)),
                       max_running_requests=32)
    worker = EagleDraftWorker(args, TinyDraftModel())
    with record_spans() as spans, torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        worker.capture_graphs()
        for step in range(a.steps):
            b = (1, 3, 8, 16, 24)[step % 5]  # 24 is above the largest graph: eager fallback
            worker.draft_forward(make_draft_input(b, 1, seed=step))
        with worker.override_worker_state(2):
            worker.draft_forward(make_draft_input(4, 1))
        worker.reload(args.replace(speculative=SpeculativeConfig(4, 1)))
    counts = collections.Counter(name for name, _ in spans)
    example = {name: attrs for name, attrs in reversed(spans)}
    events = {e.key: e for e in prof.key_averages()}
    rows = []
    for name, n in sorted(counts.items()):
        matched = [e for key, e in events.items() if key == name or key.startswith(name + "[")]
        cpu_us = sum(e.cpu_time_total for e in matched)
        rows.append({"span": name, "count": n, "profiler_events": sum(e.count for e in matched),
                     "profiler_cpu_us": round(cpu_us, 1), "example_attrs": example[name]})
    print(f"{'span':16s} {'count':>6s} {'in profiler':>12s} {'cpu us':>10s}  example attrs")
    for r in rows:
        print(f"{r['span']:16s} {r['count']:6d} {r['profiler_events']:12d} {r['profiler_cpu_us']:10.1f}  "
              f"{json.dumps(r['example_attrs'])}")
    if a.trace:
        prof.export_chrome_trace(a.trace)
        print(f"chrome trace: {a.trace}")
    return {"spans": rows}


if __name__ == "__main__":
    main()
