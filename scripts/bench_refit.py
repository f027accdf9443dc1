"""Draft weight refit benchmark: one in-place update of the default draft against a reload that
recaptures, both while 8 requests are served (trace graphs, chain S=3).

Per round, on the same engine: ``update_draft_weights`` (the caller's cost: check and copy
aside), the step that applies it at its boundary, the step that applies a reload to the same
args (new state, graphs captured again), and plain steps around them. The serving pause of each
is its step's time minus the median plain step of that round.
"""

from __future__ import annotations

import argparse
import statistics
import time

from draftgraph.runtime import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.engine import SpecDecodeEngine
from draftgraph.runtime.models import default_models
from draftgraph.runtime.models.corpus import held_out_prompts
from scripts.benchutil import emit, record, target


def _timed_step(engine: SpecDecodeEngine) -> float:
    start = time.perf_counter()
    engine.step()
    return time.perf_counter() - start


def bench(rounds: int, backend: str) -> dict:
    tgt, head = default_models(seed=0)
    args = RuntimeArgs(SpeculativeConfig(3, 1), CudaGraphConfig(PhaseGraphConfig(max_bs=8)), max_running_requests=8)
    engine = SpecDecodeEngine(args, tgt, head, backend=backend, capture="blocking", acceptance_watch=None)
    weights = {k: v.clone() for k, v in engine.drafter.head.state_dict().items()}
    prompts = [list(p) for p in held_out_prompts(8, seed=3, min_len=8, max_len=32)]
    call, update_pause, reload_pause, plain_all = [], [], [], []
    for _ in range(rounds):
        ids = [engine.add_request(p, 400) for p in prompts]
        for _ in range(3):  # admission and warm-up
            engine.step()
        plain = [_timed_step(engine) for _ in range(5)]
        start = time.perf_counter()
        engine.update_draft_weights(weights)  # the same values: acceptance unchanged
        call.append(time.perf_counter() - start)
        with_update = _timed_step(engine)
        plain += [_timed_step(engine) for _ in range(5)]
        engine.request_reload(args)
        with_reload = _timed_step(engine)
        plain += [_timed_step(engine) for _ in range(5)]
        base = statistics.median(plain)
        plain_all.append(base)
        update_pause.append(max(0.0, with_update - base))
        reload_pause.append(max(0.0, with_reload - base))
        for rid in ids:  # end the round: the next one starts from an empty batch
            engine.abort_request(rid)
        while engine.has_work():
            engine.step()
        for rid in ids:
            engine.pop_result(rid)
    st = engine.stats()
    if st["draft_weights"]["updates"] != rounds or st["reloads"]["applied"] != rounds:
        raise RuntimeError(f"expected {rounds} updates and reloads: {st['draft_weights']}, {st['reloads']}")
    return {"call": call, "update_pause": update_pause, "reload_pause": reload_pause, "step": plain_all,
            "tensors": len(weights), "bytes": sum(v.numel() * v.element_size() for v in weights.values()),
            "copy_s": st["draft_weights"]["last_copy_s"]}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--json")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--backend", default="trace")
    p.add_argument("--quick", action="store_true")
    a = p.parse_args(argv)
    if a.quick:
        a.rounds = 3
    r = bench(a.rounds, a.backend)
    med = {k: statistics.median(r[k]) * 1e3 for k in ("call", "update_pause", "reload_pause", "step")}
    ratio = med["reload_pause"] / med["update_pause"] if med["update_pause"] > 0 else None
    rows = [{"operation": "update_draft_weights (in place)", "call_ms": med["call"],
             "serving_pause_ms": med["update_pause"], "step_ms": med["step"]},
            {"operation": "reload (recapture)", "call_ms": None, "serving_pause_ms": med["reload_pause"],
             "step_ms": med["step"]}]
    params = {"backend": a.backend, "rounds": a.rounds, "tensors": r["tensors"], "bytes": r["bytes"]}
    records = [
        record("refit", "update_draft_weights pause", params, "ms_pause", r["update_pause"], backend=a.backend,
               scale=1e3, ratios={"reload_pause_over_update_pause": ratio} if ratio else {},
               targets=[target("an update pauses serving less than a reload", med["update_pause"], "<=",
                               med["reload_pause"])]),
        record("refit", "reload pause", params, "ms_pause", r["reload_pause"], backend=a.backend, scale=1e3),
        record("refit", "update_draft_weights call", params, "ms_per_call", r["call"], backend=a.backend, scale=1e3),
    ]
    return emit("refit", rows, ["operation", "call_ms", "serving_pause_ms", "step_ms"],
                {"params": params, "copy_ms": r["copy_s"] * 1e3, "records": records}, a.json)


if __name__ == "__main__":
    main()
