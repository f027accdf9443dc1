"""What a registered Prometheus collector costs a draft step: nothing, it only reads at scrape time.

Two identical chain workers (S=3, trace backend, b=4) step in one run, interleaved round by
round: ``registered`` has `register_worker_metrics` in a registry, ``plain`` has none. Then the
roles swap (the other worker registered), so a difference between the two workers cancels.
The ratio is the median over rounds of registered / plain per round; target: <= 1.02 (within
noise). One scrape (``generate_latest`` of that registry) is timed too, for scale: it runs on
Prometheus's schedule, never in a step. Prints a table and JSON (``--json PATH`` writes it).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from draftgraph.runtime import CudaGraphConfig, EagleDraftWorker, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.prometheus import register_worker_metrics
from draftgraph.runtime.testing import TinyDraftModel, make_draft_input
from scripts.benchutil import emit, record, target, time_interleaved

TARGET = 1.02  # registered / plain step time
B = 4


def build() -> EagleDraftWorker:
    args = RuntimeArgs(SpeculativeConfig(3, 1), CudaGraphConfig(PhaseGraphConfig(bs=(1, 2, 4, 8))))
    worker = EagleDraftWorker(args, TinyDraftModel(seed=0))
    worker.capture_graphs("trace")
    return worker


def measure(rounds: int, inner: int) -> tuple[dict[str, list[float]], float]:
    """Per-round seconds per step of the registered and the plain worker (both role
    assignments), and the median seconds of one scrape."""
    a, b = build(), build()
    inp = make_draft_input(B, 1, seed=1)
    per: dict[str, list[float]] = {"registered": [], "plain": []}
    scrape_s: list[float] = []
    for reg, plain in ((a, b), (b, a)):
        registry = CollectorRegistry()
        with register_worker_metrics(reg, registry):
            fns = {"registered": lambda w=reg: w.draft_forward(inp), "plain": lambda w=plain: w.draft_forward(inp)}
            for k, v in time_interleaved(fns, rounds, inner, gc_off=True).items():
                per[k].extend(v.values)
            for _ in range(20):
                start = time.perf_counter()
                generate_latest(registry)
                scrape_s.append(time.perf_counter() - start)
    return per, statistics.median(scrape_s)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--json", default=None)
    p.add_argument("--quick", action="store_true")
    a = p.parse_args(argv)
    rounds, inner = (6, 50) if a.quick else (40, 200)
    per, scrape = measure(rounds, inner)
    ratios = [x / y for x, y in zip(per["registered"], per["plain"])]
    ratio = statistics.median(ratios)
    reg_us, plain_us = (statistics.median(per[k]) * 1e6 for k in ("registered", "plain"))
    verdict = target("registered step <= 1.02x plain step", ratio, "<=", TARGET)
    params = {"num_steps": 3, "b": B, "rounds": 2 * rounds, "inner": inner}
    records = [record("metrics", f"chain S=3 b={B} {k}", params, "step_us", per[k], backend="trace", scale=1e6,
                      ratios={"registered/plain": ratio} if k == "registered" else None,
                      targets=[verdict] if k == "registered" else None) for k in ("registered", "plain")]
    records.append(record("metrics", "one scrape", {"states": 1}, "scrape_us", [scrape], backend="trace",
                          scale=1e6))
    rows = [{"case": f"b={B}", "plain_us": plain_us, "registered_us": reg_us, "ratio": ratio,
             "ratio_p25": statistics.quantiles(ratios, n=4)[0], "ratio_p75": statistics.quantiles(ratios, n=4)[2],
             "scrape_us": scrape * 1e6, "met": verdict["met"]}]
    cols = ["case", "plain_us", "registered_us", "ratio", "ratio_p25", "ratio_p75", "scrape_us", "met"]
    return emit("metrics", rows, cols, {"records": records}, a.json)


if __name__ == "__main__":
    main()
