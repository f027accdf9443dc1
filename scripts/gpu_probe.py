"""GPU probe for scripts/gpu_check.sh: torch's CUDA-graph features, then per state the capture
time, capture memory and node counts, and replay vs eager at b in {1, 8, 64}.

Features are detected, never assumed (a GPU image may carry torch 2.11). Each state is
measured on its own and a failure is recorded in its record, so one bad state does not hide
the others. Prints a table and JSON (``--json PATH`` writes it). Without CUDA it still
reports the features and runs the states on the CPU trace backend (a smoke run).
"""

from __future__ import annotations

import argparse
import inspect
import sys
import time
import traceback
from typing import Any

import torch

from scripts.benchutil import emit, synced, time_interleaved

BATCHES = (1, 8, 64)
STATES = {"chain_s2": (2, 1, None), "chain_s3": (3, 1, None), "chain_s4": (4, 1, None),
          "tree_s3_k4_n8": (3, 4, 8)}


def _params(fn: Any) -> set[str]:
    """Parameter names of ``fn`` (empty when they cannot be read)."""
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def features() -> dict[str, Any]:
    """What this torch (and the machine) offers for CUDA graphs and profiling."""
    cls = getattr(torch.cuda, "CUDAGraph", None)
    graph_params = _params(torch.cuda.graph.__init__) if hasattr(torch.cuda, "graph") else set()
    out: dict[str, Any] = {
        "torch": torch.__version__, "cuda_runtime": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    for attr in ("retain_object", "register_destroy_callback", "raw_cuda_graph", "get_graph_data",
                 "register_capture_end_hook", "enable_debug_mode"):
        out[f"CUDAGraph.{attr}"] = cls is not None and hasattr(cls, attr)
    out["CUDAGraph(keep_graph=)"] = cls is not None and "keep_graph" in _params(cls.__init__)
    for name in ("capture_error_mode", "enable_annotations", "check_input_liveness"):
        out[f"torch.cuda.graph({name}=)"] = name in graph_params
    for mod in ("cuda.bindings", "cuda.cudart", "nvtx"):
        try:
            __import__(mod)
            out[f"import {mod}"] = True
        except Exception:
            out[f"import {mod}"] = False
    return out


def measure_state(name: str, device: str, repeats: int, inner: int) -> list[dict[str, Any]]:
    """Rows for one state: capture s/bytes/peak once, then nodes and replay vs eager per b."""
    from draftgraph.runtime import CudaGraphConfig, EagleDraftWorker, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
    from draftgraph.runtime.testing import TinyDraftModel, make_draft_input

    s, k, n = STATES[name]
    args = RuntimeArgs(SpeculativeConfig(s, k, n), CudaGraphConfig(PhaseGraphConfig(bs=BATCHES)),
                       max_running_requests=BATCHES[-1], device=device)
    worker = EagleDraftWorker(args, TinyDraftModel(device=device))
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    start = time.perf_counter()
    worker.capture_graphs("cuda" if cuda else "trace")
    wall = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() - base if cuda else None
    stats = worker.state.stats
    rows = []
    for b in BATCHES:
        inp = make_draft_input(b, k, seed=b, device=device)
        fns = {"eager": lambda i=inp: worker.drafting.step(worker.state, i.topk_p, i.topk_index,
                                                         i.hidden_states, count=False),
               "replay": lambda i=inp: worker.draft_forward(i)}
        if cuda:
            fns = {key: synced(f) for key, f in fns.items()}
        t = time_interleaved(fns, repeats=repeats, inner=inner)
        rows.append({"state": name, "b": b, "nodes": stats.nodes.get(b),
                     "eager_us": t["eager"] * 1e6, "replay_us": t["replay"] * 1e6,
                     "eager/replay": t["eager"] / t["replay"], "capture_s": stats.capture_s,
                     "capture_wall_s": wall, "capture_bytes": stats.capture_bytes,
                     "capture_peak_bytes": peak})
    worker.state.release()
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--json")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--inner", type=int, default=50)
    p.add_argument("--quick", action="store_true")
    a = p.parse_args(argv)
    if a.quick:
        a.repeats, a.inner = 3, 5
    feats = features()
    rows, failures = [], {}
    for name in STATES:
        try:
            rows.extend(measure_state(name, a.device, a.repeats, a.inner))
        except Exception as exc:  # record and go on: the other states still tell something
            failures[name] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}"
            print(f"{name} failed: {exc!r}", file=sys.stderr)
    cols = ["state", "b", "nodes", "eager_us", "replay_us", "eager/replay", "capture_s",
            "capture_bytes", "capture_peak_bytes"]
    doc = emit("gpu_probe", rows, cols, {"device": a.device, "features": feats, "failures": failures},
               a.json)
    if failures:
        raise SystemExit(1)
    return doc


if __name__ == "__main__":
    main()
