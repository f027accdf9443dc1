"""Generated sources a long-running engine retains across applied reloads (issue 32, item 15).

Each reload captures new graphs; FX keeps every GraphModule's generated source in its loader
cache and in ``linecache`` unless the released graph evicts it. This serves a few requests per
reload (S cycling 2, 3, 4; sizes 1, 2, 4; blocking capture) and prints, at three reload counts
that are multiples of 3 (the same S at each, so the same graphs live): FX cache entries and
characters, linecache entries and characters, and the Python memory traced by ``tracemalloc``
(flat means nothing grows per reload). ``--adaptive 1,2,3`` adds an adaptive controller (the S
of a reload, 2..4, is then not always a candidate: issue 40's path, where the state a switch
left was dropped unreleased) and ``--capture background`` captures beside serving; the last
line is the least-squares slope of FX entries per reload over every reload.

    python -m scripts.fx_sources_growth [--backend trace] [--reloads 30] [--adaptive 1,2,3]
                                        [--capture background]
"""

from __future__ import annotations

import argparse
import gc
import json
import linecache
import tracemalloc

import torch.fx as fx

from draftgraph.runtime import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.engine import SpecDecodeEngine
from draftgraph.runtime.models import default_models
from draftgraph.runtime.models.corpus import held_out_prompts


def _args(s: int) -> RuntimeArgs:
    return RuntimeArgs(SpeculativeConfig(s, 1), max_running_requests=4,
                       cuda_graph_config=CudaGraphConfig(decode=PhaseGraphConfig(bs=[1, 2, 4])))


def _sources() -> dict[str, int]:
    cache = getattr(getattr(fx.graph_module, "_loader", None), "eval_cache", {}) or {}
    lines = [v for v in linecache.cache.values() if isinstance(v, tuple) and len(v) > 2 and v[2]]
    return {"fx_entries": len(cache), "fx_chars": sum(len(v) for v in cache.values()),
            "linecache_entries": len(linecache.cache), "linecache_chars": sum(len("".join(v[2])) for v in lines)}


def _serve(engine: SpecDecodeEngine) -> None:
    while engine.has_work():
        for rid in engine.step():
            engine.pop_result(rid)


def _slope(ys: list[int]) -> float:
    """Least-squares slope of ``ys`` against 0, 1, 2, ..."""
    n = len(ys)
    if n < 2:
        return 0.0
    mx, my = (n - 1) / 2, sum(ys) / n
    return sum((x - mx) * (y - my) for x, y in enumerate(ys)) / sum((x - mx) ** 2 for x in range(n))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="trace", choices=["trace", "compile", "eager"])
    p.add_argument("--reloads", type=int, default=30)
    p.add_argument("--adaptive", default="", help="candidate S values ('' = off)")
    p.add_argument("--capture", default="blocking", choices=["blocking", "background"])
    ns = p.parse_args()
    adaptive = tuple(int(x) for x in ns.adaptive.split(",") if x.strip()) or None
    target, head = default_models(seed=0, draft="eagle")
    engine = SpecDecodeEngine(_args(3), target, head, backend=ns.backend, capture=ns.capture,
                              adaptive_steps=adaptive)
    prompts = [list(q) for q in held_out_prompts(4, seed=5, min_len=8, max_len=32)]
    marks = {3, 3 * max(1, ns.reloads // 6), 3 * max(1, ns.reloads // 3)}
    rows = []
    every: list[int] = []
    tracemalloc.start()
    for i in range(1, ns.reloads + 1):
        for q in prompts:
            engine.add_request(q, 6)
        engine.request_reload(_args(2 + i % 3))
        _serve(engine)
        if engine.worker.capture.wait(120):  # a background reload commits at the next step: serve again
            for q in prompts:
                engine.add_request(q, 6)
            _serve(engine)
        gc.collect()
        every.append(_sources()["fx_entries"])
        if i in marks:
            rows.append({"reloads": i, **_sources(), "traced_mb": round(tracemalloc.get_traced_memory()[0] / 1e6, 2)})
    engine.close()
    applied = engine.stats()["reloads"]["applied"]
    print(json.dumps({"backend": ns.backend, "adaptive": ns.adaptive, "capture": ns.capture, "applied": applied,
                      "rows": rows, "fx_entries_per_reload": round(_slope(every), 4)}))
    cols = list(rows[0])
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r[c]) for c in cols))
    print(f"FX entries per reload (slope over {len(every)} reloads): {_slope(every):.4f}")


if __name__ == "__main__":
    main()
