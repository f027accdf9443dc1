"""Soak benchmark: many short requests through one engine, as a long-running server sees them.

The default models, the eager backend, a chain of S=3, ``in_flight`` requests at once (a new one
arrives as soon as one ends); every result is taken with `pop_result`. Every ``every`` requests
arrivals pause until the engine is idle (so no request is in flight) and it records the live
tensor count (``gc``: tensors reachable from Python) and the RSS, then reports the
growth after the first checkpoint (the warm-up: lazy init, allocator caches; before it, one
`generate` per batch size fills the per-size view caches) per 1,000 requests,
and checks a sample of outputs against `greedy_generate`. Targets: live tensors flat (no growth
after the first checkpoint) and RSS growth under 5 MiB from the first checkpoint to the last.
Full run: 20,000 requests, a checkpoint every 1,000; ``--quick``: 400, every 100.

``--reload-every K`` (not in `make bench`): every K engine steps a reload is requested, in turn
from the serving thread, from a second thread and by SIGHUP (a handler that reads a runtime
args file), cycling S = 2, 3, 4, 3; the outcomes are counted and the samples still checked (the
live tensor count then follows the configuration active at each checkpoint).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
import warnings
from typing import Any

import torch

from draftgraph.runtime import RuntimeArgs, SpeculativeConfig, load_runtime_args
from draftgraph.runtime.engine import SpecDecodeEngine
from draftgraph.runtime.models import default_models, greedy_generate
from draftgraph.runtime.models.corpus import held_out_prompts
from scripts.benchutil import emit, record, target

RSS_TARGET_MIB = 5.0


def live_tensors() -> int:
    """Tensors reachable from Python after a full collection."""
    gc.collect()
    with warnings.catch_warnings():  # isinstance on some lazily imported torch objects warns
        warnings.simplefilter("ignore")
        return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))


def rss_mib() -> float:
    """Resident set size in MiB (/proc/self/statm; NaN where there is none)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError, AttributeError):
        return float("nan")


class _Reloader:
    """Requests reloads into ``engine`` every ``every`` steps: serving thread, second thread,
    SIGHUP in turn (see the module docstring)."""

    STEPS = (2, 3, 4, 3)

    def __init__(self, engine: SpecDecodeEngine, in_flight: int, every: int, folder: str) -> None:
        self.engine, self.every, self.n = engine, every, 0
        self.args = [RuntimeArgs(SpeculativeConfig(s, 1), max_running_requests=in_flight) for s in self.STEPS]
        self.path = os.path.join(folder, "reload.json")
        self.errors: list[BaseException] = []
        self.by = {"serving thread": 0, "second thread": 0, "SIGHUP": 0}
        self.old = signal.signal(signal.SIGHUP, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        try:
            self.engine.request_reload(load_runtime_args(self.path))
        except Exception as exc:  # counted, never raised into the step it interrupted
            self.errors.append(exc)

    def _request(self, args: RuntimeArgs) -> None:
        try:
            self.engine.request_reload(args)
        except Exception as exc:
            self.errors.append(exc)

    def maybe(self, step: int) -> None:
        if not self.every or step % self.every:
            return
        args = self.args[self.n % len(self.args)]
        kind = ("serving thread", "second thread", "SIGHUP")[self.n % 3]
        self.n += 1
        self.by[kind] += 1
        if kind == "serving thread":
            self._request(args)
        elif kind == "second thread":
            t = threading.Thread(target=self._request, args=(args,))
            t.start()
            t.join()
        else:
            with open(self.path, "w") as f:
                json.dump({"speculative": {"num_steps": args.speculative.num_steps, "topk": 1},
                           "max_running_requests": args.max_running_requests}, f)
            os.kill(os.getpid(), signal.SIGHUP)

    def close(self) -> None:
        signal.signal(signal.SIGHUP, self.old)


def soak(requests: int, every: int, in_flight: int = 8, sample_every: int = 97, seed: int = 0,
         backend: str = "eager", reload_every: int = 0) -> dict[str, Any]:
    """Serve ``requests`` short requests; checkpoints every ``every`` ended requests (see the
    module docstring); ``reload_every`` > 0: a reload every that many steps. Returns
    checkpoints [(requests, live tensors, RSS MiB)], the sampled (prompt, max_new, output)
    triples, seconds, the engine's request counts and the reloads."""
    target_model, head = default_models(seed=0)
    args = RuntimeArgs(SpeculativeConfig(3, 1), max_running_requests=in_flight)
    engine = SpecDecodeEngine(args, target_model, head, backend=backend)
    rng = random.Random(seed)
    pool = [list(p) for p in held_out_prompts(64, seed=seed + 7, min_len=8, max_len=32)]
    for b in range(1, in_flight + 1):  # warm-up: every batch size once (per-size view caches)
        engine.generate(pool[:b], 4)
    added = ended = 0
    asked: dict[int, tuple[list[int], int]] = {}  # kept only for the sampled requests
    samples: list[tuple[list[int], int, list[int]]] = []
    checkpoints: list[tuple[int, int, float]] = []
    next_checkpoint = min(every, requests)
    folder = tempfile.mkdtemp(prefix="draftgraph-soak-")
    reloader = _Reloader(engine, in_flight, reload_every, folder) if reload_every else None
    steps = 0
    start = time.perf_counter()
    while ended < requests:
        if reloader is not None:
            reloader.maybe(steps)
        steps += 1
        while added < next_checkpoint and added - ended < in_flight:
            prompt, max_new = pool[rng.randrange(len(pool))], rng.randint(4, 12)
            rid = engine.add_request(prompt, max_new)
            if rid % sample_every == 0:
                asked[rid] = (prompt, max_new)
            added += 1
        for rid in engine.step():
            out = engine.pop_result(rid)
            if rid in asked:
                samples.append((*asked.pop(rid), out))
            ended += 1
        if ended == next_checkpoint:  # every request so far has ended and been taken
            checkpoints.append((ended, live_tensors(), rss_mib()))
            next_checkpoint = min(next_checkpoint + every, requests)
    seconds = time.perf_counter() - start
    st = engine.stats()
    reloads = None
    if reloader is not None:
        reloader.close()
        reloads = {"requested": reloader.n, "by": reloader.by, "request_errors": len(reloader.errors),
                   "applied": st["reloads"]["applied"], "rejected": st["reloads"]["failed"],
                   "superseded": st["reloads"]["superseded"]}
    return {"checkpoints": checkpoints, "samples": samples, "seconds": seconds, "steps": steps,
            "finished": st["requests_finished"], "failed": st["requests_failed"],
            "tokens": st["tokens_generated"], "target": target_model, "reloads": reloads}


def check_samples(target_model: Any, samples: list[tuple[list[int], int, list[int]]]) -> int:
    """How many sampled outputs differ from greedy decoding of the same prompt."""
    return sum(greedy_generate(target_model, [p], n)[0] != out for p, n, out in samples)


def _per_1k(points: list[tuple[int, float]]) -> list[float]:
    """Growth per 1,000 requests between consecutive checkpoints."""
    return [(b[1] - a[1]) * 1000 / (b[0] - a[0]) for a, b in zip(points, points[1:])]


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--json", default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--requests", type=int, default=None)
    p.add_argument("--every", type=int, default=None)
    p.add_argument("--reload-every", type=int, default=0, help="request a reload every K steps")
    p.add_argument("--sample-every", type=int, default=97, help="check every Nth request against greedy")
    a = p.parse_args(argv)
    requests = a.requests or (400 if a.quick else 20_000)
    every = a.every or (100 if a.quick else 1_000)
    res = soak(requests, every, sample_every=a.sample_every, reload_every=a.reload_every)
    cps = res["checkpoints"]
    wrong = check_samples(res["target"], res["samples"])
    rows = [{"requests": n, "live_tensors": t, "rss_mib": r} for n, t, r in cps]
    first, last = cps[0], cps[-1]
    tensor_growth = last[1] - first[1]
    rss_growth = last[2] - first[2]
    tensor_steps = _per_1k([(n, t) for n, t, _ in cps]) or [0.0]
    rss_steps = _per_1k([(n, r) for n, _, r in cps]) or [0.0]
    params = {"requests": requests, "every": every, "in_flight": 8, "spec": "chain S=3", "device": "cpu"}
    span = f"{first[0]}..{last[0]}"
    records = [
        record("soak", "live tensors per 1k requests", params, "tensors_per_1k_requests", tensor_steps,
               backend="eager", ratios={"growth": tensor_growth},
               targets=[target(f"live tensors flat from request {span}", tensor_growth, "<=", 0)]),
        record("soak", "rss per 1k requests", params, "mib_per_1k_requests", rss_steps, backend="eager",
               ratios={"growth_mib": rss_growth},
               targets=[target(f"RSS growth from request {span} < {RSS_TARGET_MIB} MiB", rss_growth, "<=",
                               RSS_TARGET_MIB)]),
        record("soak", "requests per second", params, "requests_per_s", [requests / res["seconds"]],
               backend="eager", ratios={"sampled": len(res["samples"]), "sampled_wrong": wrong},
               targets=[target("sampled outputs equal greedy_generate", wrong, "==", 0)]),
    ]
    extra = {"tensor_growth": tensor_growth, "rss_growth_mib": rss_growth, "seconds": res["seconds"],
             "steps": res["steps"], "reloads": res["reloads"],
             "tokens": res["tokens"], "finished": res["finished"], "failed": res["failed"],
             "sampled": len(res["samples"]), "sampled_wrong": wrong, "records": records}
    doc = emit("bench_soak", rows, ["requests", "live_tensors", "rss_mib"], extra, a.json)
    if wrong:
        raise AssertionError(f"{wrong} of {len(res['samples'])} sampled outputs differ from greedy")
    return doc


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
