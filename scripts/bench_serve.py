"""What a client of `draftgraph serve` feels, against the same engine without HTTP in the same run.

A server subprocess (the embedded default models, ``--max-running 8``) on a free loopback port;
N concurrent streaming clients (httpx, server-sent events) send completions for T seconds
(then finish what is in flight): tokens/s, time to first token (TTFT) and the gap between
streamed pieces (ITL: one piece per engine step, a step commits one or more tokens) at p50 and
p99, and errors. The same requests, in the same order and with the same concurrency, then run
through a `SpecDecodeEngine` built in this process (``add_request`` / ``step`` / ``pop_result``):
tokens/s of the bare engine. Rounds alternate server and engine; the ratio is the median of the
rounds' ratios. Target: server >= 0.95x the engine at 8 streams. CPU seconds per token (the
server process, the clients, the bare engine) are reported too: on a shared machine they move
less with other processes' load than tokens/s do.

A reload run: the same clients for T seconds with a reload (S=3 -> S=2, `POST /admin/reload`) a
third of the way in; the window "while the reload recaptures" runs from the POST until the new
generation serves plus 0.5 s (a gap between pieces counts in it when it overlaps it). Target:
p99 ITL inside the window <= 2x the p50 outside it.
``--plot PATH`` draws ITL over that run (needs matplotlib). Prints a table and JSON
(``--json PATH`` writes it). Default: 5 rounds of 8 s; ``--quick``: the eager backend, 1 round of 4 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import psutil

from scripts.benchutil import emit, record, target

MODEL = "draftgraph-toy"  # the server and the bare engine both serve the toy pair (--target toy)
PROMPTS = ["Hello there", "The quick brown fox", "Once upon a time, in a land", "def main():",
           "Speculative decoding is", "In the beginning", "import torch\n", "A long time ago",
           "She said that", "The engine steps", "Graphs captured once", "Why is the sky"]
TARGET_RATIO = 0.95
TARGET_RELOAD_ITL = 2.0
RELOAD = {"speculative": {"num_steps": 2, "topk": 1}, "max_running_requests": 8}


@dataclass
class Trace:
    """What the clients saw in one server run."""

    prompts: list[str] = field(default_factory=list)  # in the order they were sent
    tokens: int = 0
    errors: int = 0
    ttft: list[float] = field(default_factory=list)
    itl: list[tuple[float, float]] = field(default_factory=list)  # (time of the piece, gap)
    wall_s: float = 0.0
    t0: float = 0.0  # perf_counter at the start of the run


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(backend: str, streams: int, threads: int | None) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    proc = subprocess.Popen([sys.executable, "-m", "draftgraph.runtime", "serve", "--target", "toy",
                             "--port", str(port), "--backend", backend, "--max-running", str(max(8, streams)),
                             "--max-bs", str(max(8, streams)), "--max-waiting", "64"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode}: {proc.stderr.read()[-2000:]}")
        try:
            h = httpx.get(url + "/health", timeout=2).json()
            if h.get("status") == "serving" and h.get("graphs_ready"):
                return proc, url
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError("server not serving within 600 s")


async def _one(c: httpx.AsyncClient, url: str, prompt: str, max_tokens: int, tr: Trace) -> None:
    start = time.perf_counter()
    last = None
    try:
        async with c.stream("POST", url + "/v1/completions", json={
                "model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                "stream_options": {"include_usage": True}}) as r:
            if r.status_code != 200:
                tr.errors += 1
                await r.aread()
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                doc = json.loads(line[6:])
                if "error" in doc:
                    tr.errors += 1
                    return
                if doc.get("usage"):
                    tr.tokens += doc["usage"]["completion_tokens"]
                    continue
                if not doc["choices"][0]["text"]:
                    continue
                now = time.perf_counter()
                if last is None:
                    tr.ttft.append(now - start)
                else:
                    tr.itl.append((now, now - last))
                last = now
    except httpx.HTTPError:
        tr.errors += 1


async def _clients(url: str, streams: int, seconds: float, max_tokens: int,
                   during: Any = None) -> Trace:
    tr = Trace()
    t0 = tr.t0 = time.perf_counter()
    counter = iter(range(10 ** 9))

    async def worker(c: httpx.AsyncClient) -> None:
        while time.perf_counter() - t0 < seconds:
            prompt = PROMPTS[next(counter) % len(PROMPTS)]
            tr.prompts.append(prompt)
            await _one(c, url, prompt, max_tokens, tr)

    limits = httpx.Limits(max_connections=streams + 4, max_keepalive_connections=streams + 4)
    async with httpx.AsyncClient(timeout=300, limits=limits) as c:
        jobs = [worker(c) for _ in range(streams)] + ([during(c, t0)] if during is not None else [])
        await asyncio.gather(*jobs)
    tr.wall_s = time.perf_counter() - t0
    return tr


def bare_engine(engine: Any, tok: Any, prompts: list[str], streams: int, max_tokens: int) -> tuple[int, float]:
    """The same requests through the engine, ``streams`` in flight: (tokens, seconds)."""
    queue = [tok.encode(p) for p in prompts]
    live: set[int] = set()
    tokens = 0
    start = time.perf_counter()
    while queue or live:
        while queue and len(live) < streams:
            live.add(engine.add_request(queue.pop(0), max_tokens))
        for rid in engine.step():
            if rid in live:
                live.discard(rid)
                tokens += len(engine.pop_result(rid))
    return tokens, time.perf_counter() - start


def _cpu(p: psutil.Process) -> float:
    """CPU seconds of ``p`` so far (user + system, every thread)."""
    t = p.cpu_times()
    return t.user + t.system


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def reload_run(url: str, streams: int, seconds: float, max_tokens: int) -> tuple[Trace, float, float]:
    """A server run with a reload a third of the way in: (trace, POST time, swap time)."""
    marks: dict[str, float] = {}

    async def during(c: httpx.AsyncClient, t0: float) -> None:
        await asyncio.sleep(seconds / 3)
        gen0 = (await c.get(url + "/health")).json()["generation"]
        marks["post"] = time.perf_counter()
        r = await c.post(url + "/admin/reload", json=RELOAD)
        if r.status_code != 202:
            raise RuntimeError(f"reload refused: {r.text}")
        while time.perf_counter() - t0 < seconds * 3:
            if (await c.get(url + "/health")).json()["generation"] != gen0:
                marks["swap"] = time.perf_counter()
                return
            await asyncio.sleep(0.05)

    tr = asyncio.run(_clients(url, streams, seconds, max_tokens, during))
    return tr, marks["post"], marks.get("swap", marks["post"] + seconds)


def plot(tr: Trace, post: float, swap: float, path: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot (pip install matplotlib)", file=sys.stderr)
        return None
    t0 = tr.t0
    fig, ax = plt.subplots(figsize=(8, 3.2))
    ax.scatter([t - t0 for t, _ in tr.itl], [g * 1e3 for _, g in tr.itl], s=3, alpha=0.5, label="gap between pieces")
    ax.axvspan(post - t0, swap + 0.5 - t0, color="orange", alpha=0.2, label="reload: POST to new generation +0.5 s")
    ax.axvline(post - t0, color="red", lw=0.8, label="POST /admin/reload")
    ax.set_xlabel("seconds into the run")
    ax.set_ylabel("inter-token latency (ms)")
    ax.set_title("draftgraph serve: streamed pieces of all clients, a reload in the middle")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--seconds", type=float, default=None)
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--backend", default=None, help="the server's and the engine's graph backend (default auto; "
                                                      "--quick: eager)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads of the server and the engine (default: torch's; 1 is steadier on a shared box)")
    p.add_argument("--plot", default=None, metavar="PATH", help="ITL over the reload run (PNG)")
    a = p.parse_args(argv)
    backend = a.backend or ("eager" if a.quick else "auto")
    seconds = a.seconds or (4.0 if a.quick else 8.0)
    rounds = a.rounds or (1 if a.quick else 5)
    from draftgraph.runtime import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
    from draftgraph.runtime.engine import SpecDecodeEngine
    from draftgraph.runtime.engine.loading import load_text_models, resolve_models

    if a.threads:
        import torch

        torch.set_num_threads(a.threads)
    n = max(8, a.streams)
    target_m, draft, tok = load_text_models(resolve_models("toy", "eagle"))
    engine = SpecDecodeEngine(RuntimeArgs(SpeculativeConfig(3, 1), CudaGraphConfig(PhaseGraphConfig(max_bs=n)),
                                          max_running_requests=n), target_m, draft, backend=backend, capture="auto")
    engine.generate([tok.encode(x) for x in PROMPTS[:a.streams]], 8)  # warm
    proc, url = start_server(backend, a.streams, a.threads)
    try:
        asyncio.run(_clients(url, a.streams, 1.0, 8))  # warm
        server_tps, bare_tps, ratios, traces, cpu = [], [], [], [], {"server": 0.0, "client": 0.0, "engine": 0.0}
        sproc, me = psutil.Process(proc.pid), psutil.Process()
        tokens_all = {"server": 0, "engine": 0}
        for _ in range(rounds):
            c0, m0 = _cpu(sproc), _cpu(me)
            tr = asyncio.run(_clients(url, a.streams, seconds, a.max_tokens))
            c1, m1 = _cpu(sproc), _cpu(me)
            tokens, wall = bare_engine(engine, tok, tr.prompts, a.streams, a.max_tokens)
            cpu["server"] += c1 - c0
            cpu["client"] += m1 - m0
            cpu["engine"] += _cpu(me) - m1
            tokens_all["server"] += tr.tokens
            tokens_all["engine"] += tokens
            server_tps.append(tr.tokens / tr.wall_s)
            bare_tps.append(tokens / wall)
            ratios.append(server_tps[-1] / bare_tps[-1])
            traces.append(tr)
        rtr, post, swap = reload_run(url, a.streams, seconds, a.max_tokens)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        engine.close()
    ttft = [x for tr in traces for x in tr.ttft]
    itl = [g for tr in traces for _, g in tr.itl]
    # a gap belongs to the window when it overlaps it (the gap a reload's pause makes ends after it)
    in_window = [t >= post and t - g <= swap + 0.5 for t, g in rtr.itl]
    inside = [g for (_, g), w in zip(rtr.itl, in_window) if w]
    outside = [g for (_, g), w in zip(rtr.itl, in_window) if not w]
    reload_ratio = _pct(inside, 99) / _pct(outside, 50)
    ratio = statistics.median(ratios)
    v_ratio = target(f"server tokens/s >= {TARGET_RATIO}x bare engine at {a.streams} streams", ratio, ">=",
                     TARGET_RATIO)
    v_reload = target("p99 ITL during a reload <= 2x p50 outside it", reload_ratio, "<=", TARGET_RELOAD_ITL)
    params = {"streams": a.streams, "seconds": seconds, "threads": a.threads, "rounds": rounds,
              "max_tokens": a.max_tokens,
              "load_avg": os.getloadavg()[0], "cores": os.cpu_count()}
    records = [record("serve", f"{a.streams} streams, server", params, "tokens_per_s", server_tps, backend=backend,
                      ratios={"server/engine": ratio}, targets=[v_ratio]),
               record("serve", f"{a.streams} streams, bare engine", params, "tokens_per_s", bare_tps, backend=backend),
               record("serve", f"{a.streams} streams, TTFT", params, "ms", [_pct(ttft, 50)], backend=backend,
                      scale=1e3, ratios={"p99/p50": _pct(ttft, 99) / _pct(ttft, 50)}),
               record("serve", f"{a.streams} streams, ITL", params, "ms", [_pct(itl, 50)], backend=backend,
                      scale=1e3, ratios={"p99/p50": _pct(itl, 99) / _pct(itl, 50)}),
               record("serve", f"{a.streams} streams, ITL during a reload", params, "ms", [_pct(inside, 99)],
                      backend=backend, scale=1e3, ratios={"p99 inside/p50 outside": reload_ratio},
                      targets=[v_reload])]
    rows = [{"case": f"{a.streams} streams", "server_tok_s": statistics.median(server_tps),
             "engine_tok_s": statistics.median(bare_tps), "ratio": ratio,
             "ttft_p50_ms": _pct(ttft, 50) * 1e3, "ttft_p99_ms": _pct(ttft, 99) * 1e3,
             "itl_p50_ms": _pct(itl, 50) * 1e3, "itl_p99_ms": _pct(itl, 99) * 1e3,
             "errors": sum(tr.errors for tr in traces), "met": v_ratio["met"]},
            {"case": "reload run", "server_tok_s": rtr.tokens / rtr.wall_s, "itl_p50_ms": _pct(outside, 50) * 1e3,
             "itl_p99_ms": _pct(inside, 99) * 1e3, "ratio": reload_ratio, "errors": rtr.errors,
             "itl_p99_outside_ms": _pct(outside, 99) * 1e3, "gaps_in_window": len(inside),
             "reload_window_s": swap + 0.5 - post, "met": v_reload["met"]}]
    cols = ["case", "server_tok_s", "engine_tok_s", "ratio", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms",
            "itl_p99_ms", "errors", "reload_window_s", "met"]
    cpu_per_token = {"server_ms": cpu["server"] / max(1, tokens_all["server"]) * 1e3,
                     "client_ms": cpu["client"] / max(1, tokens_all["server"]) * 1e3,
                     "engine_ms": cpu["engine"] / max(1, tokens_all["engine"]) * 1e3}
    extra: dict[str, Any] = {"records": records, "round_ratios": ratios, "load_avg": os.getloadavg(),
                             "cpu_per_token": cpu_per_token}
    if a.plot:
        extra["plot"] = plot(rtr, post, swap, a.plot)
    return emit("serve", rows, cols, extra, a.json)


if __name__ == "__main__":
    main()
