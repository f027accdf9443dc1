"""Shared benchmark helpers: interleaved timing, dispatched-op counting, JSON + table output."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["time_interleaved", "count_ops", "emit", "load_sglang", "env_info", "synced"]


def time_interleaved(fns: dict[str, Callable[[], Any]], repeats: int = 15, inner: int = 200
                     ) -> dict[str, float]:
    """Median seconds per call of each fn; rounds run the fns in turn so drift hits all alike."""
    for fn in fns.values():  # warm up caches and lazy init
        for _ in range(20):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter_ns()
            for _ in range(inner):
                fn()
            samples[name].append((time.perf_counter_ns() - start) / inner / 1e9)
    return {name: statistics.median(v) for name, v in samples.items()}


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
        print(f"{key}: {json.dumps(value)}")
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
