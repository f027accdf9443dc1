"""Topology benchmark: organize + build_tree per step for a chain, a static tree and a dynamic tree.

At equal N (8 and 16) and b in (1, 64, 256), all variants interleaved in one process: seconds per
call of organize + build_tree (the draft forwards excluded: they are the same work in all three),
aten ops dispatched per call, and the captured step's graph nodes with and without organize
(trace backend). The engine's acceptance length and tokens/s per topology come from
`engine_topology_rows` (a hook the engine fills in). Prints a table and JSON (``--json PATH``).
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from draftgraph.graphs import GraphCaptureManager
from draftgraph.runtime.config import (
    CudaGraphConfig,
    PhaseGraphConfig,
    RuntimeArgs,
    SpeculativeConfig,
)
from draftgraph.runtime.models import TinyDraftModel, make_draft_input
from draftgraph.runtime.topology.organize import organize_draft_results
from draftgraph.runtime.topology.verify_tree import build_tree
from draftgraph.runtime.worker import EagleDraftWorker
from scripts.benchutil import count_ops, emit, record, synced, target, time_interleaved

BATCHES = (1, 64, 256)
STATIC_TREES = {  # EAGLE-1-like shapes: wide near the root, one long spine
    8: ((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)),
    16: ((0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0),
         (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0), (0, 0, 0, 0)),
}


def specs(n: int) -> dict[str, SpeculativeConfig]:
    """Chain, static tree and dynamic tree with N = n verify tokens."""
    tree = STATIC_TREES[n]
    depth = max(map(len, tree))
    return {"chain": SpeculativeConfig(n - 1, 1),
            "static": SpeculativeConfig(depth, 4, tree_choices=tree),
            "dynamic": SpeculativeConfig(depth, 4, n)}


def make_worker(spec: SpeculativeConfig, device: str, capture: tuple[int, ...] | None = None
                ) -> EagleDraftWorker:
    graphs = CudaGraphConfig(PhaseGraphConfig(bs=capture)) if capture else None
    args = RuntimeArgs(spec, graphs, max_running_requests=max(BATCHES), device=device)
    return EagleDraftWorker(args, TinyDraftModel(device=device))


def organize_and_build(worker: EagleDraftWorker, b: int, device: str):
    """A callable running one step's organize + build_tree for ``worker`` at batch b."""
    state, spec = worker.state, worker.state.spec
    inp = make_draft_input(b, spec.topk, device=device)
    verified = inp.topk_index[:, 0].clone()
    seq_lens = torch.full((b,), 100, dtype=torch.int32, device=device)
    n, s = spec.num_draft_tokens, spec.num_steps
    buf = state.static_buffers()
    if buf is not None:
        tokens = worker.drafting.tokens(state, inp.topk_p, inp.topk_index, inp.hidden_states)

        def run() -> Any:
            parents, indices = buf.view(b)  # the whole static organize
            return build_tree(verified, parents, indices, tokens, seq_lens, spec.layout_topk, s, n,
                              validate=False, layout=buf.layout)
    else:
        lists = worker.drafting.tree_lists(s, spec.topk, inp.topk_p, inp.topk_index, inp.hidden_states)

        def run() -> Any:
            parents, indices, tokens = organize_draft_results(*lists, n)
            return build_tree(verified, parents, indices, tokens, seq_lens, spec.topk, s, n,
                              validate=False)
    return run


def graph_nodes(spec: SpeculativeConfig, size: int) -> dict[str, int | None]:
    """Trace-backend nodes of the captured draft step, with and without its organize stage."""
    w = make_worker(spec, "cpu", capture=(size,))
    w.capture_graphs("trace")
    step, static, pads = w.drafting.graph_step(w.state, size, w.args.device, organize=False)[:3]
    bare = GraphCaptureManager(step, static, (size,), backend="trace", pad_values=pads)
    bare.capture()
    out = {"nodes": w.state.graphs.node_count(size), "nodes_no_organize": bare.node_count(size)}
    bare.release()
    w.state.release()
    return out


def engine_topology_rows(quick: bool) -> list[dict[str, Any]]:
    """Hook for the engine: acceptance length and tokens/s of chain vs static vs dynamic at equal
    N = 7 on the default models (rows with keys n, kind, accept_len, tokens_per_s); every output
    is checked against greedy decoding."""
    import time

    from draftgraph.runtime import RuntimeArgs, SpeculativeConfig
    from draftgraph.runtime.engine import SpecDecodeEngine
    from draftgraph.runtime.models import default_models, greedy_generate
    from draftgraph.runtime.models.corpus import held_out_prompts

    target, head = default_models()
    prompts = [list(p) for p in held_out_prompts(2 if quick else 4, seed=77)]
    max_new = 32 if quick else 64
    ref = greedy_generate(target, prompts, max_new)
    specs = {"chain": SpeculativeConfig(6, 1),
             "static": SpeculativeConfig(3, 2, tree_choices=((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))),
             "dynamic": SpeculativeConfig(3, 2, 7)}
    rows = []
    for kind, spec in specs.items():
        engine = SpecDecodeEngine(RuntimeArgs(spec, max_running_requests=8), target, head, backend="eager")
        start = time.perf_counter()
        out = engine.generate(prompts, max_new)
        secs = time.perf_counter() - start
        if out != ref:
            raise AssertionError(f"engine with the {kind} topology differs from greedy")
        rows.append({"n": 7, "kind": kind, "accept_len": engine.stats()["accept_length_mean"],
                     "tokens_per_s": len(prompts) * max_new / secs})
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--json", default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args(argv)
    repeats, inner = (5, 20) if a.quick else (15, 100)
    batches = (1, 64) if a.quick else BATCHES
    rows: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []
    for n in (8, 16):
        cases = specs(n)
        nodes = {kind: graph_nodes(spec, 4 if a.quick else 64) for kind, spec in cases.items()}
        for b in batches:
            fns = {kind: organize_and_build(make_worker(spec, a.device), b, a.device)
                   for kind, spec in cases.items()}
            if a.device.startswith("cuda"):
                fns = {kind: synced(fn) for kind, fn in fns.items()}
            times = time_interleaved(fns, repeats=repeats, inner=inner)
            for kind, fn in fns.items():
                ops = count_ops(fn)
                row = {"n": n, "b": b, "kind": kind, "us": times[kind] * 1e6,
                       "vs_dynamic": times["dynamic"] / times[kind],
                       "compute_ops": ops["compute_ops"], "view_ops": ops["view_ops"], **nodes[kind]}
                rows.append(row)
                records.append(_record(row, times[kind], a.device))
    by = {(r["n"], r["b"], r["kind"]): r for r in rows}
    targets = {
        "static_ops_le_2": all(r["compute_ops"] <= 2 for r in rows if r["kind"] != "dynamic"),
        "static_20x_dynamic_at_b64": all(by[(n, 64, "static")]["vs_dynamic"] >= 20 for n in (8, 16)),
        "static_nodes_eq_no_organize": all(r["nodes"] == r["nodes_no_organize"]
                                           for r in rows if r["kind"] != "dynamic"),
    }
    engine = engine_topology_rows(a.quick)
    for r in engine:
        records.append(record("topology", f"engine N={r['n']} {r['kind']}",
                              {"n": r["n"], "kind": r["kind"], "device": "cpu"}, "tokens_per_s",
                              [r["tokens_per_s"]], backend="eager",
                              ratios={"accept_length": r["accept_len"]}))
    columns = ["n", "b", "kind", "us", "vs_dynamic", "compute_ops", "view_ops", "nodes",
               "nodes_no_organize"]
    return emit("bench_topology", rows, columns,
                {"targets": targets, "engine": engine, "device": a.device, "records": records},
                a.json)


def _record(row: dict[str, Any], times: Any, device: str) -> dict[str, Any]:
    """The summary record of one (N, b, kind) row, with the targets that concern its kind."""
    n, b, kind = row["n"], row["b"], row["kind"]
    targets = []
    if kind != "dynamic":
        targets.append(target(f"{kind}: at most 2 compute ops", row["compute_ops"], "<=", 2))
        if row["nodes"] is not None:
            targets.append(target(f"{kind}: organize adds no graph node",
                                  int(row["nodes"] == row["nodes_no_organize"]), "==", 1))
    if kind == "static" and b == 64:
        targets.append(target("static >= 20x faster than dynamic at b=64", row["vs_dynamic"], ">=", 20))
    return record("topology", f"N={n} b={b} {kind}", {"n": n, "b": b, "kind": kind, "device": device},
                  "us_per_call", times, backend="eager", scale=1e6,
                  ratios={"vs_dynamic": row["vs_dynamic"], "compute_ops": row["compute_ops"],
                          "nodes": row["nodes"], "nodes_no_organize": row["nodes_no_organize"]},
                  targets=targets)


if __name__ == "__main__":
    main()
