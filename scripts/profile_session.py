"""A short run under the torch profiler with spans on, written as a Chrome/Perfetto trace.

By default it drives EagleDraftWorker with TinyDraftModel (captured graphs, a few batch sizes and
one size above the largest graph, so replays and an eager fallback both appear) through
``profile_run``; ``--engine`` profiles a short ``draftgraph simulate`` run instead (the default
models, a few requests, no greedy baseline), like ``draftgraph simulate --profile DIR``.
Either way ``OUT_DIR/trace.json`` opens at https://ui.perfetto.dev or chrome://tracing. For
Nsight Systems on a GPU: ``DRAFTGRAPH_NVTX=1 nsys profile -t cuda,nvtx -o out python
-m scripts.profile_session OUT_DIR`` (NVTX domain "draftgraph"; see
draftgraph.runtime.engine.profiling).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

import torch

from draftgraph.runtime.engine.profiling import parse_profile_steps, profile_run

__all__ = ["main", "profile_run"]


def _tiny_worker_step(max_bs: int) -> Callable[[int], Any]:
    """A captured chain EagleDraftWorker over TinyDraftModel; step i drafts one batch."""
    from draftgraph.runtime import CudaGraphConfig, EagleDraftWorker, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
    from draftgraph.runtime.testing import TinyDraftModel, make_draft_input

    device = "cuda" if torch.cuda.is_available() else "cpu"
    args = RuntimeArgs(SpeculativeConfig(3, 1), CudaGraphConfig(PhaseGraphConfig(max_bs=max_bs)),
                       max_running_requests=2 * max_bs, device=device)
    worker = EagleDraftWorker(args, TinyDraftModel(device=device))
    worker.capture_graphs("trace")
    sizes = (1, 3, max_bs, 2 * max_bs)  # the last is above the largest graph: eager fallback
    inputs = [make_draft_input(b, 1, seed=b, device=device) for b in sizes]
    return lambda i: worker.draft_forward(inputs[i % len(inputs)])


def _engine_run(a: argparse.Namespace) -> dict[str, Any]:
    """A short simulate run with --profile: the engine's trace and its profile summary."""
    from draftgraph.runtime import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
    from draftgraph.runtime.commands.simulate import SimulationConfig, run_simulation

    args = RuntimeArgs(SpeculativeConfig(3, 1), CudaGraphConfig(PhaseGraphConfig(max_bs=a.max_bs)),
                       max_running_requests=a.max_bs)
    cfg = SimulationConfig(args=args, requests=a.requests, min_new=8, max_new=24, greedy=False,
                           profile_dir=a.out_dir, progress=False, profile_steps=a.profile_steps,
                           profile_spans_only=a.spans_only)
    report = run_simulation(cfg, sighup=None)
    return {**report["profile"], "loop_steps": report["loop_steps"],
            "tokens_generated": report["tokens_generated"]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir", nargs="?", default="profile-out")
    p.add_argument("--steps", type=int, default=40, help="tiny-worker steps")
    p.add_argument("--max-bs", type=int, default=8)
    p.add_argument("--engine", action="store_true", help="profile a short `draftgraph simulate` run")
    p.add_argument("--requests", type=int, default=4, help="requests of the --engine run")
    p.add_argument("--profile-steps", type=parse_profile_steps, default=None, metavar="A-B[,C-D]",
                   help="--engine: profile only these engine steps (inclusive, from 0)")
    p.add_argument("--spans-only", action="store_true", help="--engine: draftgraph's ranges, no aten ops")
    a = p.parse_args(argv)
    summary = _engine_run(a) if a.engine else profile_run(_tiny_worker_step(a.max_bs), a.steps, a.out_dir)
    print(json.dumps(summary, indent=2))
    print(f"open {summary['trace']} at https://ui.perfetto.dev (or chrome://tracing)")
    return summary


if __name__ == "__main__":
    main()
