"""Sampling benchmark: acceptance length, tokens/s and the seconds per engine step at T = 0
(greedy), 0.7 and 1.0, at 1 and 4 concurrent requests, eager and with graphs (trace, the verify
and extend phases captured: the sampled draw runs inside the verify graph). One engine per
(backend, batch), the temperatures interleaved per round; JSON and a table.

    python -m scripts.bench_sampling [--rounds 3] [--max-new 48] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from draftgraph.runtime import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SamplingParams, SpeculativeConfig
from draftgraph.runtime.engine import SpecDecodeEngine
from draftgraph.runtime.models import default_models
from draftgraph.runtime.models.corpus import held_out_prompts

TEMPERATURES = (0.0, 0.7, 1.0)


def _engine(backend: str, bs: int) -> SpecDecodeEngine:
    target, head = default_models(seed=0, draft="eagle")
    args = RuntimeArgs(SpeculativeConfig(3, 1), CudaGraphConfig(PhaseGraphConfig(bs=(bs,))), max_running_requests=bs)
    phases = ("verify", "extend") if backend != "eager" else None
    return SpecDecodeEngine(args, target, head, backend=backend, capture="blocking", graph_phases=phases,
                            acceptance_watch=None)


def _run(engine: SpecDecodeEngine, prompts: list[list[int]], max_new: int, t: float, seed: int) -> dict[str, float]:
    sampling = None if t == 0 else [SamplingParams(t, seed=seed + i) for i in range(len(prompts))]
    engine.reset_stats()
    start = time.perf_counter()
    engine.generate(prompts, max_new, sampling)
    s = time.perf_counter() - start
    st = engine.stats()
    return {"tokens_per_s": st["tokens_generated"] / s, "accept_length": st["accept_length_mean"],
            "step_ms": 1000 * s / max(st["verify_steps"], 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new", type=int, default=48)
    ap.add_argument("--json", default=None, help="write the records here")
    a = ap.parse_args(argv)
    records = []
    for backend in ("eager", "trace"):
        for bs in (1, 4):
            engine = _engine(backend, bs)
            prompts = [list(p) for p in held_out_prompts(bs, seed=7, min_len=16, max_len=64)]
            _run(engine, prompts, 8, 1.0, 0)  # warm-up
            runs: dict[float, list[dict[str, float]]] = {t: [] for t in TEMPERATURES}
            for r in range(a.rounds):
                for t in TEMPERATURES:
                    runs[t].append(_run(engine, prompts, a.max_new, t, 1000 * r))
            greedy_step = statistics.median(x["step_ms"] for x in runs[0.0])
            for t in TEMPERATURES:
                med = {k: statistics.median(x[k] for x in runs[t]) for k in runs[t][0]}
                records.append({"backend": backend, "requests": bs, "temperature": t, **med,
                                "step_vs_greedy": med["step_ms"] / greedy_step})
            engine.close()
    print(f"{'backend':8} {'reqs':>4} {'T':>4} {'accept':>7} {'tok/s':>8} {'step ms':>8} {'vs T=0':>7}")
    for r in records:
        print(f"{r['backend']:8} {r['requests']:>4} {r['temperature']:>4} {r['accept_length']:>7.2f} "
              f"{r['tokens_per_s']:>8.1f} {r['step_ms']:>8.2f} {r['step_vs_greedy']:>7.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"benchmark": "bench_sampling", "records": records}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
