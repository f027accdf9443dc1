"""Plain target steps (S = 0) in width-1 graphs against eager (issue 31, item: the S = 0 state).

Two engines over the default models, trace backend (or ``--backend``), schedule "1:3,2:0" (from
two requests on every step is a plain target decode), graphs at 4 and 8: one with the verify and
extend phases (the S = 0 band's target-only state replays them), one without (eager). Both serve
``--requests`` held-out prompts for ``--new`` tokens each, interleaved round by round; prints the
median seconds per round of each and the phase replays, then the JSON (``--json PATH`` writes it).
Figures only, no targets.
"""

from __future__ import annotations

import argparse
import time

import torch

from draftgraph.runtime import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.engine import SpecDecodeEngine
from draftgraph.runtime.models import default_models
from draftgraph.runtime.models.corpus import held_out_prompts
from scripts.benchutil import emit

SCHEDULE = "1:3,2:0"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="trace")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--new", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    ns = ap.parse_args(argv)
    torch.set_num_threads(ns.threads)
    target, head = default_models(seed=0, draft="eagle")
    prompts = [list(p) for p in held_out_prompts(ns.requests, seed=5, min_len=8, max_len=96)]
    args = RuntimeArgs(SpeculativeConfig(3, 1), CudaGraphConfig(PhaseGraphConfig(bs=(4, 8))),
                       max_running_requests=max(8, ns.requests))
    engines = {name: SpecDecodeEngine(args, target, head, backend=ns.backend, capture="blocking",
                                      graph_phases=phases, schedule=SCHEDULE)
               for name, phases in (("eager", ()), ("graphs", ("verify", "extend")))}
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    try:
        for engine in engines.values():
            engine.generate(prompts, 8)  # warm up
        for _ in range(ns.rounds):
            for name, engine in engines.items():
                engine.reset_stats()
                start = time.perf_counter()
                engine.generate(prompts, ns.new)
                seconds[name].append(time.perf_counter() - start)
        rows = []
        for name, engine in engines.items():
            phases = engine.stats()["phases"]
            rows.append({"path": name, "median_s": sorted(seconds[name])[len(seconds[name]) // 2],
                         "verify_replays": phases.get("verify", {}).get("replays", 0),
                         "extend_replays": phases.get("extend", {}).get("replays", 0)})
    finally:
        for engine in engines.values():
            engine.close()
    return emit("plain target steps (S=0): width-1 graphs vs eager", rows,
                ["path", "median_s", "verify_replays", "extend_replays"],
                {"schedule": SCHEDULE, "backend": ns.backend, "requests": ns.requests, "new": ns.new,
                 "rounds": ns.rounds, "threads": ns.threads}, ns.json)


if __name__ == "__main__":
    main()
