"""Compiled replay and start-up: does a graph pay for itself on this CPU?

1. The engine's EAGLE draft step (default models, chain S=3): eager vs the FX replay (trace)
   vs the compiled replay (compile), per batch size, on the captured graph's own static rows.
   Targets: compiled >= 3x eager at b=1 and >= 2x at b=8.
2. The tiny 15-node test step (TinyDraftModel): the same three, figures only.
3. Start-up of an engine with adaptive S in 1..5 (default models, background capture, "auto"):
   time to the first servable step (target <= 2 s) and until every graph is ready (target
   <= 30 s with a warm compile cache). Compile seconds are figures: the run says whether the
   inductor cache held this step's kernels before it started (warm) or not (cold).

``--quick`` (CI): the tiny step at b=1 and the start-up with the trace backend only.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import torch

from draftgraph.graphs.compile.inductor import compiler_available, inductor_cache_dir
from draftgraph.runtime import CudaGraphConfig, EagleDraftWorker, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.engine import SpecDecodeEngine
from draftgraph.runtime.models import default_models
from draftgraph.runtime.testing import TinyDraftModel
from scripts.benchutil import emit, record, target, time_interleaved

EAGLE_TARGETS = {1: 3.0, 8: 2.0}  # compiled / eager speedup at b
STARTUP_TARGET_S = 2.0
READY_TARGET_S = 30.0


def _worker_graphs(worker: EagleDraftWorker, backend: str) -> EagleDraftWorker:
    worker.capture_graphs(backend)
    return worker


def _step_timings(workers: dict[str, Any], sizes: tuple[int, ...], rounds: int, inner: int
                  ) -> list[dict[str, Any]]:
    """Per b: eager step, FX replay, compiled replay (median seconds per call)."""
    out = []
    eager_worker = workers["trace"]
    for b in sizes:
        fx = workers["trace"].state.graphs.captured_graph(b)
        fns = {"fx": fx.replay}
        if "compile" in workers:
            fns["compiled"] = workers["compile"].state.graphs.captured_graph(b).replay
        views = fx.inputs
        state = eager_worker.state
        rows = eager_worker.drafting.row_layout.assemble(list(views[2:]))  # the head's rows from their static fields
        fns["eager"] = lambda v=views, s=state, r=rows: eager_worker.drafting.step(s, v[0], v[1], r, count=False)
        with torch.no_grad():
            samples = time_interleaved(fns, repeats=rounds, inner=inner, gc_off=True)
        out.append({"b": b, "samples": samples})
    return out


def _eagle_workers(sizes: tuple[int, ...], backends: tuple[str, ...]) -> dict[str, EagleDraftWorker]:
    """Engine-style EAGLE workers over the default draft head, one per backend."""
    import copy

    _, head = default_models(seed=0)
    args = RuntimeArgs(SpeculativeConfig(3, 1), CudaGraphConfig(PhaseGraphConfig(bs=sizes)),
                       max_running_requests=max(sizes))
    workers = {}
    for be in backends:
        h = copy.deepcopy(head)
        h.allocate_cache(max(sizes) + 1)
        workers[be] = _worker_graphs(EagleDraftWorker(args, h), be)
    return workers


def _tiny_workers(sizes: tuple[int, ...], backends: tuple[str, ...]) -> dict[str, EagleDraftWorker]:
    args = RuntimeArgs(SpeculativeConfig(3, 1), CudaGraphConfig(PhaseGraphConfig(bs=sizes)))
    return {be: _worker_graphs(EagleDraftWorker(args, TinyDraftModel(seed=0)), be) for be in backends}


def _rows(step: str, timings: list[dict[str, Any]], workers: dict[str, Any], targets: dict[int, float]
          ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rows, records = [], []
    for t in timings:
        b, s = t["b"], t["samples"]
        eager = float(s["eager"])
        row: dict[str, Any] = {"step": step, "b": b, "eager_us": eager * 1e6, "fx_us": float(s["fx"]) * 1e6}
        if "compiled" in s:
            sizes = workers["compile"].state.graphs.stats.sizes
            row.update(compiled_us=float(s["compiled"]) * 1e6, speedup=eager / float(s["compiled"]),
                       engine=sizes[b].engine, compile_s=sizes[b].compile_s)
        rows.append(row)
        for name, sample in s.items():
            ratios, tg = {}, []
            if name == "compiled":
                ratios = {"speedup_vs_eager": row["speedup"], "speedup_vs_fx": float(s["fx"]) / float(sample)}
                if b in targets:
                    tg = [target(f"{step} compiled >= {targets[b]:g}x eager at b={b}", row["speedup"], ">=",
                                 targets[b])]
            backend = {"eager": "eager", "fx": "trace", "compiled": "compile"}[name]
            records.append(record("compile", f"{step} b={b} {name}", {"step": step, "b": b, "timed": name},
                                  "us_per_call", sample, backend=backend, scale=1e6, ratios=ratios, targets=tg))
    return rows, records


def _startup(backend: str, wait_s: float) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    target_model, head = default_models(seed=0)
    args = RuntimeArgs(SpeculativeConfig(3, 1), CudaGraphConfig(PhaseGraphConfig(max_bs=8)),
                       max_running_requests=8)
    start = time.perf_counter()
    engine = SpecDecodeEngine(args, target_model, head, backend=backend, adaptive_steps=[1, 2, 3, 4, 5])
    first = time.perf_counter() - start
    engine.worker.capture.wait(wait_s)
    st = engine.startup()
    engine.close()
    units = sum(len(s["sizes_ready"]) + len(s["sizes_pending"]) + len(s["sizes_failed"]) for s in st["states"])
    row = {"backend": backend, "startup_s": first, "graphs_ready_s": st["graphs_ready_s"], "units": units,
           "capture_s": st["capture_s"], "compile_s": st["compile_s"]}
    ready = st["graphs_ready_s"] if st["graphs_ready_s"] is not None else float("inf")
    records = [
        record("compile", f"startup adaptive 1..5 {backend} first step", {"backend": backend}, "seconds",
               [first], backend=backend,
               targets=[target(f"first step within {STARTUP_TARGET_S:g} s", first, "<=", STARTUP_TARGET_S)]),
        record("compile", f"startup adaptive 1..5 {backend} all graphs ready", {"backend": backend, "units": units},
               "seconds", [min(ready, wait_s)], backend=backend,
               targets=[target(f"every graph ready within {READY_TARGET_S:g} s (warm cache)", ready, "<=",
                               READY_TARGET_S)]),
    ]
    return row, records


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--json")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int, default=15)
    a = p.parse_args(argv)
    cache = inductor_cache_dir()
    warm_before = cache.is_dir() and any(cache.iterdir())
    can_compile = compiler_available()
    backends = ("trace", "compile") if can_compile else ("trace",)
    rows: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []
    if a.quick:
        timings = _step_timings(w := _tiny_workers((1,), backends), (1,), 3, 20)
        r, rec = _rows("tiny", timings, w, {})
        rows += r
        records += rec
        srow, srec = _startup("trace", 120.0)
    else:
        w = _eagle_workers((1, 8), backends)
        r, rec = _rows("eagle", _step_timings(w, (1, 8), a.rounds, 50), w, EAGLE_TARGETS)
        rows += r
        records += rec
        w = _tiny_workers((1, 8), backends)
        r, rec = _rows("tiny", _step_timings(w, (1, 8), a.rounds, 200), w, {})
        rows += r
        records += rec
        srow, srec = _startup("auto", 600.0)
    records += srec
    cols = ["step", "b", "eager_us", "fx_us", "compiled_us", "speedup", "engine", "compile_s"]
    extra = {"startup": srow, "inductor_cache": str(cache), "cache_warm_before": warm_before,
             "compiler": can_compile, "cpu_threads": torch.get_num_threads(),
             "pid_env_cache": os.environ.get("TORCHINDUCTOR_CACHE_DIR"), "records": records}
    return emit("compile", rows, cols, extra, a.json)


if __name__ == "__main__":
    main()
