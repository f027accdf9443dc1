"""Probe (issue 30, item 1): one compile with a symbolic batch dimension against one compile per size.

Records the default EAGLE draft step's forwards (chain S=3, ``organize=False``: the organize
stage keeps per-size view caches that a symbolic size cannot key) once with only dim 0 symbolic
(a FakeTensorMode with a ShapeEnv; the draft model's tensors stay real constants), compiles it
once with inductor (``standalone_compile(dynamic_shapes="from_graph")``), and compares, at each
size, the outputs and input writes bitwise and the per-replay time (interleaved rounds) with a
per-size compile of the same step. Not part of ``make bench``: it compiles cold-ish every size.

    python -m scripts.symbolic_probe [--sizes 1,2,4,8] [--rounds 15]
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import torch
from torch._inductor import standalone_compile
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

from draftgraph.graphs.compile.compare import copies, lift_constants
from draftgraph.graphs.compile.inductor import use_cache_dir
from draftgraph.graphs.core.backend_trace import record_graph
from draftgraph.runtime import CudaGraphConfig, EagleDraftWorker, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.models import default_models


def _median_us(fn, args, rounds: int, inner: int = 50) -> list[float]:
    out = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(inner):
            fn(*args)
        out.append((time.perf_counter() - start) / inner * 1e6)
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sizes", default="1,2,4,8")
    p.add_argument("--rounds", type=int, default=15)
    a = p.parse_args(argv)
    sizes = tuple(int(x) for x in a.sizes.split(","))
    torch.set_num_threads(1)
    _, head = default_models(seed=0)
    args = RuntimeArgs(SpeculativeConfig(3, 1), CudaGraphConfig(PhaseGraphConfig(bs=sizes)),
                       max_running_requests=max(sizes))
    head = copy.deepcopy(head)
    head.allocate_cache(max(sizes) + 1)
    worker = EagleDraftWorker(args, head)
    graph_step = worker.drafting.graph_step(worker.state, max(sizes), worker.args.device, organize=False)
    names = list(graph_step.static_inputs)
    full = tuple(graph_step.static_inputs.values())

    def flat(*xs):
        return (graph_step.step(**dict(zip(names, xs))),)

    use_cache_dir()
    mode = FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True)
    fakes = [mode.from_tensor(t[:max(2, sizes[len(sizes) // 2])], symbolic_context=StatelessSymbolicContext(
        dynamic_sizes=[DimDynamic.DYNAMIC] + [DimDynamic.STATIC] * (t.dim() - 1))) for t in full]
    start = time.perf_counter()
    with mode:
        gm = make_fx(flat, tracing_mode="fake", _allow_non_fake_inputs=True)(*fakes)
    record_s = time.perf_counter() - start
    lifted, consts = lift_constants(gm)
    start = time.perf_counter()
    symbolic = standalone_compile(lifted, [*fakes, *consts], dynamic_shapes="from_graph")
    compile_s = time.perf_counter() - start
    rows = []
    for b in sizes:
        views = tuple(x[:b] for x in full)
        start = time.perf_counter()
        gmb, _ = record_graph(flat, views, b)
        rec_b = time.perf_counter() - start
        lb, cb = lift_constants(gmb)
        start = time.perf_counter()
        per = standalone_compile(lb, list(copies((*views, *cb))), dynamic_shapes="from_example_inputs")
        comp_b = time.perf_counter() - start
        sym_in, per_in = (*views, *consts), (*views, *cb)
        with torch.no_grad():
            s_copy, p_copy = copies(sym_in), copies(per_in)
            s_out, p_out = symbolic(*s_copy), per(*p_copy)
            equal = all(torch.equal(x, y) for x, y in zip(s_out, p_out)) and all(
                torch.equal(x, y) for x, y in zip(s_copy, p_copy))
            sym_t, per_t = [], []
            for _ in range(a.rounds):  # interleaved: both see the same machine
                sym_t += _median_us(symbolic, sym_in, 1)
                per_t += _median_us(per, per_in, 1)
        rows.append({"b": b, "equal": equal, "symbolic_us": sorted(sym_t)[len(sym_t) // 2],
                     "per_size_us": sorted(per_t)[len(per_t) // 2], "per_size_record_s": rec_b,
                     "per_size_compile_s": comp_b})
        rows[-1]["symbolic_over_per_size"] = rows[-1]["symbolic_us"] / rows[-1]["per_size_us"]
        print(json.dumps(rows[-1]), flush=True)
    doc = {"symbolic_record_s": record_s, "symbolic_compile_s": compile_s, "rows": rows}
    print(json.dumps(doc))
    return doc


if __name__ == "__main__":
    main()
