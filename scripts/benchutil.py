"""Shared benchmark helpers: interleaved timing, dispatched-op counting, JSON + table output."""

from __future__ import annotations

import gc
import json
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["Sample", "time_interleaved", "count_ops", "emit", "load_sglang", "env_info", "synced",
           "machine_info", "record", "target", "spread"]


class Sample(float):
    """The median of repeated measurements that keeps the measurements (``.values``), so a
    benchmark can report the spread; arithmetic on it gives plain floats."""

    values: tuple[float, ...]

    def __new__(cls, values: list[float] | tuple[float, ...]) -> Sample:
        if not values:
            raise ValueError("Sample: needs at least one measurement")
        obj = super().__new__(cls, statistics.median(values))
        obj.values = tuple(float(v) for v in values)
        return obj


def spread(values: list[float] | tuple[float, ...]) -> dict[str, float | int]:
    """Min, quartiles, max and count of repeated measurements (quartiles = min/max below 4)."""
    v = sorted(values)
    if len(v) >= 4:
        q = statistics.quantiles(v, n=4)
        p25, p75 = q[0], q[2]
    else:
        p25, p75 = v[0], v[-1]
    return {"min": v[0], "p25": p25, "p75": p75, "max": v[-1], "n": len(v)}


def target(name: str, value: float, op: str, limit: float) -> dict[str, Any]:
    """One stated target checked on a measured ratio: ``value op limit``."""
    ops = {"<=": value <= limit, ">=": value >= limit, "==": value == limit}
    if op not in ops:
        raise ValueError(f"op={op!r}: must be one of {sorted(ops)}")
    return {"name": name, "value": float(value), "op": op, "limit": float(limit), "met": bool(ops[op])}


def record(benchmark: str, case: str, params: dict[str, Any], metric: str, values: Any, *,
           backend: str, scale: float = 1.0, ratios: dict[str, float] | None = None,
           targets: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One summary record: a case, its median and spread over repeats (``values`` times
    ``scale``; a `Sample` or a list), the ratios targets are stated in, and their verdicts."""
    vals = [float(x) * scale for x in (values.values if isinstance(values, Sample) else values)]
    return {"benchmark": benchmark, "case": case, "backend": backend, "params": params,
            "metric": metric, "median": statistics.median(vals), "spread": spread(vals),
            "ratios": {k: float(v) for k, v in (ratios or {}).items() if v is not None},
            "targets": list(targets or [])}


def time_interleaved(fns: dict[str, Callable[[], Any]], repeats: int = 15, inner: int = 200,
                     gc_off: bool = False) -> dict[str, Sample]:
    """Median seconds per call of each fn (a `Sample`, with the per-round figures); rounds run
    the fns in turn so drift hits all alike. ``gc_off`` keeps the garbage collector off while
    timing (as ``timeit`` does): a collection landing in one fn's window is charged to it alone."""
    for fn in fns.values():  # warm up caches and lazy init
        for _ in range(20):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    enabled = gc.isenabled()
    if gc_off:
        gc.disable()
    try:
        for _ in range(repeats):
            for name, fn in fns.items():
                start = time.perf_counter_ns()
                for _ in range(inner):
                    fn()
                samples[name].append((time.perf_counter_ns() - start) / inner / 1e9)
    finally:
        if enabled:
            gc.enable()
    return {name: Sample(v) for name, v in samples.items()}


def synced(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` followed by a CUDA synchronize, so GPU timings include the work itself."""
    def run() -> Any:
        out = fn()
        torch.cuda.synchronize()
        return out
    return run


class _OpCounter(TorchDispatchMode):
    """Counts aten ops dispatched, split into compute ops and views/metadata ops."""

    def __init__(self) -> None:
        super().__init__()
        self.compute: list[str] = []
        self.views: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        (self.views if func.is_view else self.compute).append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def count_ops(fn: Callable[[], Any]) -> dict[str, Any]:
    """Aten ops one call of ``fn`` dispatches (after a warm-up call)."""
    fn()
    with _OpCounter() as counter:
        fn()
    return {"compute_ops": len(counter.compute), "view_ops": len(counter.views),
            "compute_names": sorted(set(counter.compute))}


def emit(name: str, rows: list[dict[str, Any]], columns: list[str], extra: dict[str, Any],
         json_path: str | None) -> dict[str, Any]:
    """Print a table and the JSON document; write the JSON to ``json_path`` when given."""
    doc = {"benchmark": name, "env": env_info(), "rows": rows, **extra}
    widths = {c: max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns}
    print(f"\n== {name} ==")
    print("  ".join(c.rjust(widths[c]) for c in columns))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).rjust(widths[c]) for c in columns))
    for key, value in extra.items():
        if key != "records":  # the summary's share; bench_all prints those as one table
            print(f"{key}: {json.dumps(value, default=str)}")
    text = json.dumps(doc, indent=2, default=str)
    print(text)
    if json_path:
        os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
        with open(json_path, "w") as f:
            f.write(text)
    return doc


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return "-" if v is None else str(v)


def load_sglang() -> Any:
    """(spec_utils, eagle_utils) of SGLang, or None when it is not installed."""
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from sglang.srt.speculative import eagle_utils, spec_utils
    except Exception as exc:
        print(f"SGLang reference unavailable: {exc!r}", file=sys.stderr)
        return None
    return spec_utils, eagle_utils


def env_info() -> dict[str, Any]:
    """Versions and threads, so figures can be compared."""
    return {"torch": torch.__version__, "threads": torch.get_num_threads(),
            "cuda": torch.cuda.is_available(), "python": sys.version.split()[0]}


def machine_info() -> dict[str, Any]:
    """What ran the benchmarks: CPU model and cores, memory, GPU (if any), OS, torch, Python."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = None
    try:
        import psutil
        mem = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": mem, "gpu": gpu,
            "os": platform.platform(), "torch": torch.__version__, "python": sys.version.split()[0],
            "threads": torch.get_num_threads()}
