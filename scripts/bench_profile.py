"""Profiling benchmark: what a profiled engine step costs and how big its trace is.

One engine (default models, chain S=3, 4 requests kept running, graphs captured first) serves
rounds of steps; each round runs the three modes in turn, so drift hits all alike: profiler off,
on with spans only (draftgraph's ranges, no torch profiler) and on with aten ops (the torch
profiler). Per mode: seconds per step (the window's first and last step, which start and stop
the recording, are left out) and trace bytes per step. A micro line times what a step pays for
its ranges with nothing listening (the ``step`` wrapper and seven null stage spans), against the
step itself. JSON and a table.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from draftgraph.graphs.spans import span, spans_active
from draftgraph.runtime import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.engine import SpecDecodeEngine
from draftgraph.runtime.engine.profiling import engine_step, profile_steps
from draftgraph.runtime.engine.stats import STAGES
from draftgraph.runtime.models import default_models
from draftgraph.runtime.models.corpus import held_out_prompts
from scripts.benchutil import emit, record, time_interleaved
from scripts.benchutil import target as stated_target

MODES = ("off", "spans_only", "ops")
BATCH = 4


class _Feeder:
    """Keeps ``BATCH`` requests running: a request that ends is taken and replaced."""

    def __init__(self, engine: SpecDecodeEngine, max_len: int) -> None:
        self.engine = engine
        self.prompts = [list(p) for p in held_out_prompts(64, seed=7, min_len=16, max_len=48)]
        self.max_len = max_len
        self.n = 0
        for _ in range(BATCH):
            self._add()

    def _add(self) -> None:
        p = self.prompts[self.n % len(self.prompts)]
        self.n += 1
        self.engine.add_request(p, min(96, self.max_len - len(p) - 32))

    def step(self) -> None:
        for rid in self.engine.step():
            self.engine.pop_result(rid)
            self._add()


def _round(feeder: _Feeder, mode: str, steps: int, out_dir: str) -> tuple[list[float], int | None]:
    """``steps`` steps in one window under ``mode``: seconds of the inner steps, trace bytes."""
    eng = feeder.engine
    first = eng.step_index
    ctx = (profile_steps(eng, out_dir, [(first, first + steps - 1)], spans_only=mode == "spans_only",
                         cuda_profiler=False) if mode != "off" else None)
    summary = ctx.__enter__() if ctx is not None else {}
    times = []
    try:
        for _ in range(steps):
            start = time.perf_counter()
            feeder.step()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)
    return times[1:-1], summary.get("trace_bytes")


def _off_hooks() -> dict[str, float]:
    """Seconds per step of the range hooks with nothing listening, and of the bare body."""
    def body() -> list[int]:
        return []

    def hooked() -> None:
        engine_step(0, None, body)
        for s in STAGES:
            with span(s):
                pass

    assert not spans_active(), "bench_profile: spans are on (DRAFTGRAPH_NVTX?): the off line needs them off"
    t = time_interleaved({"bare": body, "hooked": hooked}, repeats=9, inner=2000)
    return {"bare_s": float(t["bare"]), "hooked_s": float(t["hooked"]),
            "hooks_s": max(0.0, float(t["hooked"]) - float(t["bare"])), "_sample": t["hooked"]}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--json")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--steps", type=int, default=12, help="steps per window (its first and last are not timed)")
    a = p.parse_args(argv)
    if a.quick:
        a.rounds, a.steps = 2, 6
    device = "cuda" if torch.cuda.is_available() else "cpu"
    backend = "cuda" if device == "cuda" else "trace"
    target, draft = default_models(seed=0, device=device)
    args = RuntimeArgs(SpeculativeConfig(3, 1), CudaGraphConfig(PhaseGraphConfig(max_bs=BATCH)),
                       max_running_requests=BATCH, device=device)
    engine = SpecDecodeEngine(args, target, draft, backend=backend, capture="blocking")
    feeder = _Feeder(engine, target.cfg.max_len)
    for _ in range(5):  # warm-up
        feeder.step()
    secs: dict[str, list[float]] = {m: [] for m in MODES}
    bytes_per_step: dict[str, list[float]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for mode in MODES:
                times, size = _round(feeder, mode, a.steps, f"{tmp}/{mode}-{r}")
                secs[mode].append(statistics.median(times))
                if size is not None:
                    bytes_per_step[mode].append(size / a.steps)
    engine.close()
    hooks = _off_hooks()
    off = statistics.median(secs["off"])
    rows, records = [], []
    params = {"S": 3, "topk": 1, "bs": BATCH, "steps": a.steps, "rounds": a.rounds}
    for mode in MODES:
        med = statistics.median(secs[mode])
        kb = statistics.median(bytes_per_step[mode]) / 1e3 if bytes_per_step[mode] else None
        rows.append({"mode": mode, "ms_per_step": med * 1e3, "vs_off": med / off, "trace_kb_per_step": kb})
        records.append(record("profile", f"step {mode}", params, "ms_per_step", secs[mode], backend=backend,
                              scale=1e3, ratios={"vs_off": med / off}))
        if kb is not None:
            records.append(record("profile", f"trace bytes {mode}", params, "bytes_per_step",
                                  bytes_per_step[mode], backend=backend))
    share = hooks["hooked_s"] / off  # the wrapper and 7 null spans, an upper bound on their cost
    rows.append({"mode": "off: range hooks", "ms_per_step": hooks["hooked_s"] * 1e3, "vs_off": share,
                 "trace_kb_per_step": None})
    records.append(record("profile", "off range hooks", params, "us_per_step", hooks["_sample"],
                          backend=backend, scale=1e6, ratios={"share_of_step": share},
                          targets=[stated_target("off hooks share of a step", share, "<=", 0.01)]))
    del hooks["_sample"]
    return emit("profile", rows, ["mode", "ms_per_step", "vs_off", "trace_kb_per_step"],
                {"device": device, "backend": backend, "off_hooks": hooks, "records": records}, a.json)


if __name__ == "__main__":
    main()
