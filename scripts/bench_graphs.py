"""Graph benchmark: eager vs replay of the EagleDraftWorker step per batch size, node counts
of the chain vs tree step graphs, and capture time of the whole size list.

CPU: the trace backend, replayed through FX (default) and TorchScript (DRAFTGRAPH_TRACE_REPLAY=jit),
side by side; with a GPU: the cuda backend. Prints a table and JSON (``--json PATH`` writes it).
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from draftgraph.graphs import GraphCaptureManager
from draftgraph.runtime import CudaGraphConfig, EagleDraftWorker, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.testing import TinyDraftModel, make_draft_input
from scripts.benchutil import emit, record, synced, target, time_interleaved

SIZES = (1, 2, 4, 8, 16, 32, 64)
CONFIGS = {"chain": (3, 1, None), "tree": (3, 4, 8)}


def build(kind: str, device: str, backend: str, engine: str | None) -> tuple[EagleDraftWorker, float]:
    """A captured worker for ``kind`` and the seconds its whole size list took to capture."""
    s, k, n = CONFIGS[kind]
    args = RuntimeArgs(SpeculativeConfig(s, k, n), CudaGraphConfig(PhaseGraphConfig(bs=SIZES)),
                       device=device)
    worker = EagleDraftWorker(args, TinyDraftModel(device=device))
    old = os.environ.get("DRAFTGRAPH_TRACE_REPLAY")
    if engine:
        os.environ["DRAFTGRAPH_TRACE_REPLAY"] = engine
    try:
        start = time.perf_counter()
        worker.capture_graphs(backend)
        if device != "cpu":
            torch.cuda.synchronize()
        return worker, time.perf_counter() - start
    finally:
        if old is None:
            os.environ.pop("DRAFTGRAPH_TRACE_REPLAY", None)
        else:
            os.environ["DRAFTGRAPH_TRACE_REPLAY"] = old


def organize_free_nodes(worker: EagleDraftWorker) -> dict[int, int | None]:
    """Node counts of the same chain step with the organize stage left out."""
    step, static, pads = worker.drafting.graph_step(worker.state, SIZES[-1], worker.args.device, organize=False)[:3]
    mgr = GraphCaptureManager(step, static, SIZES, backend=worker.state.graphs.backend_name,
                              pad_values=pads)
    mgr.capture()
    nodes = {s: mgr.node_count(s) for s in SIZES}
    mgr.release()
    return nodes


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--json")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--inner", type=int, default=40)
    p.add_argument("--quick", action="store_true")
    a = p.parse_args(argv)
    if a.quick:
        a.repeats, a.inner = 3, 10
    backend = "cuda" if a.device.startswith("cuda") else "trace"
    engines = [None, "jit"] if backend == "trace" else [None]
    rows, capture, nodes, records = [], {}, {}, []
    for kind in CONFIGS:
        workers = {}
        for engine in engines:
            w, secs = build(kind, a.device, backend, engine)
            label = f"{backend}-{engine or 'fx'}" if backend == "trace" else backend
            workers[label] = w
            capture[f"{kind}/{label}"] = round(secs, 3)
        first = next(iter(workers.values()))
        nodes[kind] = {s: first.state.graphs.node_count(s) for s in SIZES}
        if kind == "chain":
            nodes["chain_without_organize"] = organize_free_nodes(first)
        for b in SIZES:
            inp = make_draft_input(b, first.spec.topk, seed=b, device=a.device)
            fns = {"eager": lambda w=first, i=inp: w.drafting.step(w.state, i.topk_p, i.topk_index,
                                                                i.hidden_states, count=False)}
            for label, w in workers.items():
                fns[label] = lambda w=w, i=inp: w.draft_forward(i)
            if a.device != "cpu":
                fns = {k: synced(f) for k, f in fns.items()}
            t = time_interleaved(fns, repeats=a.repeats, inner=a.inner)
            row = {"kind": kind, "b": b, "nodes": nodes[kind][b], "eager_us": t["eager"] * 1e6}
            params = {"kind": kind, "b": b, "device": a.device, "S": CONFIGS[kind][0],
                      "topk": CONFIGS[kind][1]}
            records.append(record("graphs", f"{kind} b={b} eager", {**params, "replay": "eager"},
                                  "us_per_step", t["eager"], backend="eager", scale=1e6))
            for label in workers:
                row[f"{label}_us"] = t[label] * 1e6
                row[f"eager/{label}"] = t["eager"] / t[label]
                records.append(record("graphs", f"{kind} b={b} {label}", {**params, "replay": label},
                                      "us_per_step", t[label], backend=backend, scale=1e6,
                                      ratios={"eager/replay": row[f"eager/{label}"],
                                              "nodes": nodes[kind][b]}))
            rows.append(row)
    cols = ["kind", "b", "nodes", "eager_us"] + [c for c in rows[0] if c.endswith("_us") and c != "eager_us"]
    cols += [c for c in rows[0] if c.startswith("eager/")]
    no_node = nodes["chain"] == nodes["chain_without_organize"]
    for key, secs in capture.items():
        kind, label = key.split("/")
        records.append(record("graphs", f"capture {kind} {label}",
                              {"kind": kind, "replay": label, "sizes": len(SIZES), "device": a.device},
                              "s_capture_all_sizes", [secs], backend=backend))
    records.append(record("graphs", "chain nodes vs no organize", {"kind": "chain", "b": SIZES[-1]},
                          "graph_nodes", [nodes["chain"][SIZES[-1]] or 0], backend=backend,
                          targets=[target("organize adds no graph node (all sizes)", int(no_node),
                                          "==", 1)]))
    extra = {"device": a.device, "backend": backend, "capture_s_whole_size_list": capture,
             "sizes": list(SIZES), "nodes": nodes, "chain_organize_adds_no_node": no_node,
             "records": records}
    return emit("graphs", rows, cols, extra, a.json)



if __name__ == "__main__":
    main()
