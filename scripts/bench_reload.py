"""Reload benchmark: reload time and peak memory per policy, and the apply_runtime_state switch.

Peak memory: on CUDA, torch.cuda.max_memory_allocated above the pre-reload level; on the CPU,
RSS sampled every millisecond during the reload above the pre-reload RSS, plus the bytes the
live states own at the peak (static inputs, static outputs, chain buffers), by accounting.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import threading
import time

import psutil
import torch

from draftgraph.runtime import CudaGraphConfig, EagleDraftWorker, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.testing import TinyDraftModel
from scripts.benchutil import emit, record, target

POLICIES = ("swap", "release_first")


def args_for(s: int, device: str) -> RuntimeArgs:
    return RuntimeArgs(SpeculativeConfig(s, 1), CudaGraphConfig(PhaseGraphConfig(max_bs=32)),
                       max_running_requests=64, device=device)


def state_bytes(state) -> int:
    """Bytes a state owns: static inputs, static outputs (capture bytes), chain buffers."""
    total = state.chain_buffers.nbytes if state.chain_buffers is not None else 0
    if state.graphs is not None:
        total += sum(t.numel() * t.element_size() for t in state.graphs.static_inputs.values())
        total += state.stats.capture_bytes
    return total


class RssSampler:
    """Peak RSS in a background thread (1 ms period) while the context is active."""

    def __init__(self) -> None:
        self.proc = psutil.Process()
        self.peak = 0
        self._stop = threading.Event()

    def __enter__(self):
        self.base = self.proc.memory_info().rss
        self.peak = self.base
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.001)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)


def _backend(device: str) -> str:
    """cuda on a GPU; on the CPU trace, as these figures were always measured ("auto" would now
    compile every size: a compile benchmark, bench_compile)."""
    return "cuda" if device.startswith("cuda") else "trace"


def bench_policy(policy: str, device: str, reps: int) -> dict:
    worker = EagleDraftWorker(args_for(3, device), TinyDraftModel(device=device))
    worker.capture_graphs(_backend(device))
    worker.reload(args_for(4, device), policy=policy)  # warm-up: tracer and allocator caches
    times, rss_peaks, cuda_peaks, accounted = [], [], [], []
    for i in range(reps):
        new = args_for(3 + (i % 2), device)
        gc.collect()
        old_bytes = state_bytes(worker.state)
        if device != "cpu":
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        with RssSampler() as rss:
            start = time.perf_counter()
            worker.reload(new, policy=policy)
            if device != "cpu":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        rss_peaks.append(rss.peak - rss.base)
        if device != "cpu":
            cuda_peaks.append(torch.cuda.max_memory_allocated() - base)
        new_bytes = state_bytes(worker.state)
        accounted.append(new_bytes + (old_bytes if policy == "swap" else 0))
    row = {"policy": policy, "reps": reps, "sizes": len(worker.state.capture_sizes),
           "reload_s_median": statistics.median(times), "reload_s_max": max(times),
           "rss_peak_delta_mib": statistics.median(rss_peaks) / 2**20,
           "state_bytes_peak_kib": statistics.median(accounted) / 1024, "_times": times}
    if cuda_peaks:
        row["cuda_peak_delta_mib"] = statistics.median(cuda_peaks) / 2**20
    return row


def bench_switch(device: str, n: int) -> dict:
    worker = EagleDraftWorker(args_for(3, device), TinyDraftModel(device=device))
    states = [worker.build_runtime_state(s, capture_bs=[1, 2, 4], backend=_backend(device)) for s in (2, 5)]
    for st in states * 100:
        worker.apply_runtime_state(st)
    chunks = []
    for _ in range(5):  # five timed chunks: the spread
        start = time.perf_counter_ns()
        for i in range(n // 5):
            worker.apply_runtime_state(states[i & 1])
        chunks.append((time.perf_counter_ns() - start) / (n // 5) / 1e3)
    per = statistics.median(chunks)
    return {"switch_us": per, "target_us": 50.0, "meets_target": per < 50.0, "_chunks": chunks}


def reload_records(rows: list[dict], switch: dict, device: str) -> list[dict]:
    """Summary records: reload seconds per policy (peak memory as ratios; release_first's peak
    of state bytes at most swap's), and the apply_runtime_state switch (target under 50 µs)."""
    backend = "cuda" if device != "cpu" else "trace"
    by = {r["policy"]: r for r in rows}
    out = []
    for r in rows:
        ratios = {k: r[k] for k in ("rss_peak_delta_mib", "state_bytes_peak_kib", "cuda_peak_delta_mib")
                  if k in r}
        targets = []
        if r["policy"] == "release_first" and "swap" in by:
            ratio = r["state_bytes_peak_kib"] / by["swap"]["state_bytes_peak_kib"]
            ratios["peak_vs_swap"] = ratio
            targets.append(target("release_first peak state bytes <= swap's", ratio, "<=", 1.0))
        out.append(record("reload", f"reload {r['policy']}", {"policy": r["policy"], "sizes": r["sizes"],
                                                             "device": device},
                          "s_per_reload", r["_times"], backend=backend, ratios=ratios, targets=targets))
    out.append(record("reload", "apply_runtime_state switch", {"device": device}, "us_per_switch",
                      switch["_chunks"], backend="-",
                      targets=[target("switch under 50 us", switch["switch_us"], "<=", 50.0)]))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--json")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--quick", action="store_true")
    a = p.parse_args(argv)
    if a.quick:
        a.reps = 2
    rows = [bench_policy(pol, a.device, a.reps) for pol in POLICIES]
    switch = bench_switch(a.device, 20000)
    records = reload_records(rows, switch, a.device)
    for r in rows:
        del r["_times"]
    del switch["_chunks"]
    cols = ["policy", "reps", "sizes", "reload_s_median", "reload_s_max", "rss_peak_delta_mib",
            "state_bytes_peak_kib", "cuda_peak_delta_mib"]
    return emit("reload", rows, cols, {"device": a.device, "apply_runtime_state": switch,
                                       "records": records}, a.json)


if __name__ == "__main__":
    main()
