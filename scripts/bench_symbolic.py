"""Issue 30 item 1: the default EAGLE draft state captured with one symbolic compile against
one compile per size (compile backend, ``organize`` on, as the engine runs it).

Builds two draft workers over the default models (chain S=3, k=1, sizes --sizes), the first
per size (DRAFTGRAPH_COMPILE_SYMBOLIC=0), the second symbolic (=1), each capturing every size,
then times each size's graph replay, both interleaved round by round. Prints one JSON line per
size and a summary: capture seconds (record + compile + check, all sizes) for each route, the
symbolic compile's own seconds, and symbolic/per-size replay time. The compiled-code store is
off here. Run it with an empty ``TORCHINDUCTOR_CACHE_DIR`` for cold figures. Not part of
``make bench`` (minutes of compiles).

    python -m scripts.bench_symbolic [--sizes 1,2,3,4,5,6,7,8] [--rounds 15] [--symbolic-only]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time

import torch

from draftgraph.runtime import CudaGraphConfig, EagleDraftWorker, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.models import default_models


def _worker(head, sizes: tuple[int, ...], symbolic: bool) -> tuple[EagleDraftWorker, float]:
    os.environ["DRAFTGRAPH_COMPILE_SYMBOLIC"] = "1" if symbolic else "0"
    args = RuntimeArgs(SpeculativeConfig(3, 1), CudaGraphConfig(PhaseGraphConfig(bs=sizes)),
                       max_running_requests=max(sizes))
    head = copy.deepcopy(head)
    head.allocate_cache(max(sizes) + 1)
    w = EagleDraftWorker(args, head)
    start = time.perf_counter()
    w.capture_graphs("compile")
    return w, time.perf_counter() - start


def _us(fn, inner: int = 50) -> float:
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - start) / inner * 1e6


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sizes", default="1,2,3,4,5,6,7,8")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--symbolic-only", action="store_true",
                   help="capture the symbolic worker alone (its cold compile without the per-size kernels cached)")
    a = p.parse_args(argv)
    sizes = tuple(int(x) for x in a.sizes.split(","))
    torch.set_num_threads(1)
    os.environ["DRAFTGRAPH_COMPILED"] = "0"  # no stored code: the symbolic worker would load the per-size one's
    _, head = default_models(seed=0)
    if a.symbolic_only:
        sym, sym_s = _worker(head, sizes, symbolic=True)
        backend = sym.state.graphs._backend
        doc = {"sizes": sizes, "symbolic_capture_s": sym_s, "symbolic_compiles": backend.symbolic_compiles,
               "symbolic_compile_s": backend.symbolic_compile_s, "symbolic_sizes": sorted(backend.symbolic_sizes)}
        print(json.dumps(doc))
        return doc
    per, per_s = _worker(head, sizes, symbolic=False)
    sym, sym_s = _worker(head, sizes, symbolic=True)
    backend = sym.state.graphs._backend
    rows = []
    for b in sizes:
        gp, gs = per.state.graphs.captured_graph(b), sym.state.graphs.captured_graph(b)
        tp, ts = [], []
        with torch.no_grad():
            for _ in range(a.rounds):
                tp.append(_us(gp.replay))
                ts.append(_us(gs.replay))
        row = {"b": b, "symbolic": b in backend.symbolic_sizes, "per_size_us": sorted(tp)[len(tp) // 2],
               "symbolic_us": sorted(ts)[len(ts) // 2],
               "per_size_compile_s": per.state.graphs.stats.sizes[b].compile_s,
               "symbolic_size_compile_s": sym.state.graphs.stats.sizes[b].compile_s}
        row["symbolic_over_per_size"] = row["symbolic_us"] / row["per_size_us"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    doc = {"sizes": sizes, "per_size_capture_s": per_s, "symbolic_capture_s": sym_s,
           "symbolic_compiles": backend.symbolic_compiles, "symbolic_compile_s": backend.symbolic_compile_s,
           "per_size_compile_s_total": sum(r["per_size_compile_s"] for r in rows), "rows": rows}
    print(json.dumps({k: v for k, v in doc.items() if k != "rows"}))
    return doc


if __name__ == "__main__":
    main()
