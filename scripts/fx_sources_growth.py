"""Generated sources a long-running engine retains across applied reloads (issue 32, item 15).

Each reload captures new graphs; FX keeps every GraphModule's generated source in its loader
cache and in ``linecache`` unless the released graph evicts it. This serves a few requests per
reload (S cycling 2, 3, 4; sizes 1, 2, 4; blocking capture) and prints, at three reload counts
that are multiples of 3 (the same S at each, so the same graphs live): FX cache entries and
characters, linecache entries and characters, and the Python memory traced by ``tracemalloc``
(flat means nothing grows per reload).

    python -m scripts.fx_sources_growth [--backend trace] [--reloads 30]
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="trace", choices=["trace", "compile", "eager"])
    p.add_argument("--reloads", type=int, default=30)
    ns = p.parse_args()
    target, head = default_models(seed=0, draft="eagle")
    engine = SpecDecodeEngine(_args(3), target, head, backend=ns.backend, capture="blocking")
    prompts = [list(q) for q in held_out_prompts(4, seed=5, min_len=8, max_len=32)]
    marks = {3, 3 * max(1, ns.reloads // 6), 3 * max(1, ns.reloads // 3)}
    rows = []
    tracemalloc.start()
    for i in range(1, ns.reloads + 1):
        for q in prompts:
            engine.add_request(q, 6)
        engine.request_reload(_args(2 + i % 3))
        while engine.has_work():
            for rid in engine.step():
                engine.pop_result(rid)
        gc.collect()
        if i in marks:
            rows.append({"reloads": i, **_sources(), "traced_mb": round(tracemalloc.get_traced_memory()[0] / 1e6, 2)})
    engine.close()
    applied = engine.stats()["reloads"]["applied"]
    print(json.dumps({"backend": ns.backend, "applied": applied, "rows": rows}))
    cols = list(rows[0])
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r[c]) for c in cols))


if __name__ == "__main__":
    main()
