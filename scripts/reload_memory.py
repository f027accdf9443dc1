"""Memory over many reloads under background capture (issue 49, item 7): the slow test's cycle as
a script, for counts the test cannot afford.

The default models on the trace backend, background capture, adaptive candidates 2/3/4; a
reload (S cycling 2, 3, 4) requested every ``--every`` steps while the batch is kept full. Every
``--sample-every`` reloads, once the capture queue is done and after `gc.collect`: malloc's
in-use bytes (glibc's ``mallinfo2``, the reading the memory tests fit), the RSS and the live
tensors. Prints one line per sample, then the slopes per reload (least squares, over all samples
and over the second half) and the reload counts (requested, applied, superseded).

    python -m scripts.reload_memory [--reloads 1000] [--every 10] [--sample-every 20]
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import json
import logging
import statistics
import time
import warnings

import psutil
import torch

from draftgraph.runtime import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.engine import SpecDecodeEngine
from draftgraph.runtime.models import default_models
from draftgraph.runtime.models.corpus import held_out_prompts

MAX_NEW = 24


class _Words(ctypes.Structure):
    """glibc's ``struct mallinfo2``: ten size_t words (``uordblks`` is the 8th, ``hblkhd`` the 5th)."""

    _fields_ = [("w", ctypes.c_size_t * 10)]


def _malloc_in_use() -> float:
    """malloc's in-use bytes, MiB (what the memory tests fit: live blocks, tensor storage
    included, whatever the heap freed before); the RSS where glibc has no ``mallinfo2``."""
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return psutil.Process().memory_info().rss / 2**20
    fn.restype = _Words
    w = fn().w
    return (w[7] + w[4]) / 2**20


def slope(ys: list[float]) -> float:
    """Least-squares slope of ``ys`` against 0, 1, 2, ... (0 for fewer than two points)."""
    return statistics.linear_regression(range(len(ys)), ys).slope if len(ys) > 1 else 0.0


def _args(s: int) -> RuntimeArgs:
    return RuntimeArgs(SpeculativeConfig(s, 1), CudaGraphConfig(PhaseGraphConfig(max_bs=4)), max_running_requests=4)


def _sample(engine: SpecDecodeEngine) -> tuple[float, float, int]:
    """(malloc in use MiB, RSS MiB, live tensors) with no capture unit half-recorded."""
    engine.worker.capture.wait(60)
    gc.collect()
    with warnings.catch_warnings():  # isinstance on torch.distributed's deprecated aliases warns
        warnings.simplefilter("ignore")
        tensors = sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))
    return _malloc_in_use(), psutil.Process().memory_info().rss / 2**20, tensors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reloads", type=int, default=1000)
    ap.add_argument("--every", type=int, default=10, help="steps between two reload requests")
    ap.add_argument("--sample-every", type=int, default=20, help="reloads between two samples")
    ns = ap.parse_args()
    logging.disable(logging.WARNING)  # each reload that lands before its graphs logs a line
    target, head = default_models(seed=0, draft="eagle")
    engine = SpecDecodeEngine(_args(3), target, head, backend="trace", capture="background",
                              adaptive_steps=(2, 3, 4))
    prompts = held_out_prompts(16, seed=5, min_len=8, max_len=96)
    added, rows, start = 0, [], time.perf_counter()
    try:
        for i in range(ns.reloads):
            engine.request_reload(_args(2 + i % 3))
            for _ in range(ns.every):
                if engine.next_batch_size() < 4:
                    engine.add_request(list(prompts[added % len(prompts)]), MAX_NEW)
                    added += 1
                for rid in engine.step():
                    engine.pop_result(rid)
            if (i + 1) % ns.sample_every == 0:
                rows.append((i + 1, *_sample(engine)))
                n, held, rss, tensors = rows[-1]
                print(f"{n} reloads: malloc in use {held:.2f} MiB, RSS {rss:.1f} MiB, {tensors} live tensors "
                      f"({time.perf_counter() - start:.0f} s)", flush=True)
        reloads = engine.stats()["reloads"]
    finally:
        engine.close()
    half = rows[len(rows) // 2:]
    per = 2**10 / ns.sample_every  # MiB per sample -> KiB per reload

    def kib(col: int) -> dict[str, float]:
        return {"all": round(slope([r[col] for r in rows]) * per, 2),
                "second_half": round(slope([r[col] for r in half]) * per, 2)}

    print(json.dumps({
        "reloads": ns.reloads, "every": ns.every, "malloc_kib_per_reload": kib(1), "rss_kib_per_reload": kib(2),
        "tensors_per_reload": round(slope([float(r[3]) for r in rows]) / ns.sample_every, 3),
        "requested": reloads["requested"], "applied": reloads["applied"], "superseded": reloads["superseded"]},
        indent=1))


if __name__ == "__main__":
    main()
