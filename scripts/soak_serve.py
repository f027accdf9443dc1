"""A soak of `draftgraph serve` (issue 49): what no client may break, for ``--minutes`` (default 10).

One server subprocess (``--target toy``: the embedded byte-level pair, whose greedy answers this
process computes as the oracle; ``--max-waiting 2000``) on a free loopback port, and beside it,
all at once:

- churners: clients that send a whole completion (half of them streaming) and hang up 0..40 ms
  later, while it is queued or running;
- honest clients: completions whose text is checked against the target's greedy decoding (the
  oracle: `greedy_generate` in this process, independent of the server);
- idle sockets (open, send nothing) and drippers (a request head one byte every 0.5 s);
- made-up methods and unknown paths; bad bodies (malformed, deeply nested, wrong types);
- reloads: ``POST /admin/reload`` and SIGHUP (``--reload-config``), alternating S=2 and S=3.

Every ``--sample-s`` seconds (from a process of its own): ``/health`` latency, the ``/metrics``
series, the server's RSS. At the
end: step failures and phantom entries (``/health`` once idle), wrong honest answers, the
``/metrics`` series (a quarter of the way in and at the end), the RSS slope (least squares over the second half,
MiB per minute) and ``/health`` p50 / p99. Prints JSON (``--json PATH`` writes it too); exits 1
when a target is missed: 0 step failures, 0 phantom entries, every honest answer exact,
``/metrics`` series flat after the first quarter, RSS slope under ``--rss-slope-mib-min`` (default 2), ``/health``
p99 under 50 ms. Loopback only; every loop is bounded in count and time. Not a test (it runs
for minutes): ``python -m scripts.soak_serve --minutes 2``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue as queue_mod
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

TARGET = "toy"  # the oracle decodes the toy pair: the only target the soak can check
MODEL = "draftgraph-toy"  # the name the server gives --target toy
PROMPTS = ["Hello there", "The quick brown fox", "Once upon a time", "def main():", "In the beginning",
           "A long time ago", "Dear friend,", "Why is the sky", "Numbers: 1, 2, 3,", "To be or not"]
MAX_TOKENS = 24
RELOADS = [{"speculative": {"num_steps": 2, "topk": 1}, "max_running_requests": 4},
           {"speculative": {"num_steps": 3, "topk": 1}, "max_running_requests": 4}]
BAD_BODIES = [b"{", b"[" * 50_000 + b"]" * 50_000, b'{"model": 1, "prompt": "x"}', b'{"prompt": ["a", 2]}',
              b"\xff\xfe", b'{"model": "draftgraph-default", "prompt": "x", "max_tokens": -1}']


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http(url: str, data: bytes | None = None, method: str | None = None, timeout: float = 300.0
          ) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def oracle() -> dict[str, str]:
    """The greedy continuation's text of every prompt (the target decoded in this process)."""
    from draftgraph.runtime.models import default_models, default_tokenizer, greedy_generate
    from draftgraph.runtime.models.tokenizer import EOS_ID

    target, _ = default_models(seed=0, draft="eagle")
    tok = default_tokenizer()
    outs = greedy_generate(target, [tok.encode(p) for p in PROMPTS], MAX_TOKENS)
    return {p: tok.decode(o[:o.index(EOS_ID) + 1] if EOS_ID in o else o) for p, o in zip(PROMPTS, outs)}


class Soak:
    """The server, the clients and the figures of one soak."""

    def __init__(self, minutes: float, backend: str, workdir: str) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.stop_at = time.monotonic() + minutes * 60
        self.reload_file = Path(workdir) / "reload.json"
        self.reload_file.write_text(json.dumps(RELOADS[0]))
        self.log = open(Path(workdir) / "serve.log", "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "draftgraph.runtime", "serve", "--target", TARGET, "--port", str(self.port),
             "--backend", backend,
             "--max-running", "4", "--max-waiting", "2000", "--max-tokens-limit", "64", "--drain-s", "20",
             "--reload-config", str(self.reload_file), "--request-timeout-s", "5", "--keep-alive-s", "5"],
            stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.counts = {"churned": 0, "honest": 0, "wrong": 0, "honest_errors": 0, "idle_sockets": 0,
                       "drippers": 0, "made_up_methods": 0, "bad_bodies": 0, "bad_body_500s": 0, "reloads": 0,
                       "sighups": 0}
        self.samples: list[tuple[float, float, int, float]] = []  # (t, health s, metrics bytes, rss MiB)
        self.lock = threading.Lock()

    def add(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.counts[key] += n

    def running(self) -> bool:
        return time.monotonic() < self.stop_at and self.proc.poll() is None

    def wait_serving(self, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the server exited {self.proc.returncode} while starting")
            try:
                status, body = _http(self.url + "/health", timeout=2.0)
                if status == 200 and json.loads(body).get("graphs_ready"):
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise SystemExit(f"the server did not serve within {timeout_s:.0f} s")

    # ---- the clients ---------------------------------------------------------------------------
    def churner(self, seed: int) -> None:
        rng = random.Random(seed)
        while self.running():
            body = json.dumps({"model": MODEL, "prompt": rng.choice(PROMPTS), "max_tokens": MAX_TOKENS,
                               "stream": rng.random() < 0.5}).encode()
            head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n").encode()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=5.0) as s:
                    s.sendall(head + body)
                    time.sleep(rng.random() * 0.04)
            except OSError:
                pass
            self.add("churned")
            time.sleep(0.02)

    def honest(self, seed: int, expected: dict[str, str]) -> None:
        rng = random.Random(1000 + seed)
        while self.running():
            prompt = rng.choice(PROMPTS)
            body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS}).encode()
            try:
                status, raw = _http(self.url + "/v1/completions", body)
            except OSError:
                self.add("honest_errors")
                continue
            if status == 429:
                time.sleep(0.2)
                continue
            if status != 200:
                self.add("honest_errors")
                continue
            self.add("honest")
            if json.loads(raw)["choices"][0]["text"] != expected[prompt]:
                self.add("wrong")

    def sockets(self) -> None:
        """Idle sockets and drippers, a few at a time (the server closes them at its deadline)."""
        while self.running():
            held = []
            for _ in range(20):
                try:
                    held.append(socket.create_connection(("127.0.0.1", self.port), timeout=5.0))
                    self.add("idle_sockets")
                except OSError:
                    break
            drip = b"GET /health HTTP/1.1\r\nHost: x\r\n"
            for i in range(min(len(drip), 16)):
                if not self.running():
                    break
                for s in held[:5]:
                    try:
                        s.send(drip[i:i + 1])
                    except OSError:
                        pass
                time.sleep(0.5)
            self.add("drippers", min(5, len(held)))
            for s in held:
                s.close()

    def junk(self, seed: int) -> None:
        rng = random.Random(seed)
        while self.running():
            try:
                _http(self.url + "/health", method=f"X{rng.randrange(10**6)}", timeout=10)
                self.add("made_up_methods")
                status, _ = _http(self.url + "/v1/completions", rng.choice(BAD_BODIES), timeout=10)
                self.add("bad_bodies")
                if status >= 500:
                    self.add("bad_body_500s")
            except OSError:
                pass
            time.sleep(0.05)

    def reloader(self) -> None:
        i = 0
        while self.running():
            time.sleep(15.0)
            i += 1
            if i % 2:
                _http(self.url + "/admin/reload", json.dumps(RELOADS[i % 2]).encode(), timeout=30)
                self.add("reloads")
            else:
                self.reload_file.write_text(json.dumps(RELOADS[i % 2]))
                self.proc.send_signal(signal.SIGHUP)
                self.add("sighups")

    def sampler(self, every_s: float) -> None:
        """Samples taken in a process of their own (this one's client threads would add their
        own GIL waits to the /health latency)."""
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        child = ctx.Process(target=sample, args=(self.url, self.proc.pid, every_s,
                                                  time.time() + self.stop_at - time.monotonic(), out), daemon=True)
        child.start()
        try:
            self.samples = out.get(timeout=self.stop_at - time.monotonic() + 120.0)
        except queue_mod.Empty:
            self.samples = []
        child.join(10.0)

    # ---- the end -------------------------------------------------------------------------------
    def figures(self) -> dict:
        deadline, health = time.monotonic() + 120.0, {}
        while time.monotonic() < deadline:  # idle: every request that left is gone
            health = json.loads(_http(self.url + "/health", timeout=10)[1])
            if health.get("live") == 0:
                break
            time.sleep(0.2)
        half = self.samples[len(self.samples) // 2:]
        rss_slope = _slope([(t / 60, r) for t, _, _, r in half])
        latencies = sorted(h for _, h, _, _ in self.samples)
        p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else float("nan")
        out = {**self.counts, "step_failures": health.get("step_failures"), "phantom_entries": health.get("live"),
               "steps": health.get("steps"), "generation": health.get("generation"), "samples": len(self.samples),
               "metrics_series_quarter_last": [self.samples[len(self.samples) // 4][2], self.samples[-1][2]]
               if self.samples else None,
               "rss_mib_first_last": [round(self.samples[0][3], 1), round(self.samples[-1][3], 1)]
               if self.samples else None,
               "rss_slope_mib_per_min_second_half": round(rss_slope, 3),
               "health_ms_p50": round(statistics.median(latencies) * 1e3, 2) if latencies else None,
               "health_ms_p90": round(latencies[int(0.9 * len(latencies))] * 1e3, 2) if latencies else None,
               "health_ms_p99": round(p99 * 1e3, 2),
               "health_ms_max": round(latencies[-1] * 1e3, 2) if latencies else None,
               "health_over_50ms": sum(h > 0.05 for h in latencies)}
        return out

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()
        return self.proc.returncode


def sample(url: str, pid: int, every_s: float, until: float, out: mp.Queue) -> None:
    """Every ``every_s`` until the wall time ``until``: (t, /health seconds, /metrics series,
    RSS MiB); the list put on ``out``."""
    proc, t0, samples = psutil.Process(pid), time.monotonic(), []
    while time.time() < until and proc.is_running():
        start = time.perf_counter()
        try:
            _http(url + "/health", timeout=10)
            health_s = time.perf_counter() - start
            _, page = _http(url + "/metrics", timeout=10)
            series = sum(1 for line in page.splitlines() if line and not line.startswith(b"#"))
            rss = proc.memory_info().rss / 2**20
        except (OSError, psutil.Error):
            time.sleep(every_s)
            continue
        samples.append((time.monotonic() - t0, health_s, series, rss))
        time.sleep(every_s)
    out.put(samples)


def _slope(points: list[tuple[float, float]]) -> float:
    if len(points) < 2:
        return 0.0
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    den = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / den if den else 0.0


def misses(out: dict, rss_bound: float) -> list[str]:
    """The targets the soak missed (empty: all met)."""
    found = []
    if out["step_failures"] != 0:
        found.append(f"step failures {out['step_failures']}")
    if out["phantom_entries"] != 0:
        found.append(f"phantom entries {out['phantom_entries']}")
    if out["wrong"] or (out["honest"] == 0 and not out.get("idle")):
        found.append(f"honest answers: {out['wrong']} wrong of {out['honest']}")
    if out["bad_body_500s"]:
        found.append(f"{out['bad_body_500s']} bad bodies answered 5xx")
    quarter, last = out["metrics_series_quarter_last"] or [0, 0]
    if last > quarter:  # every label set closed: the series are all there once each kind was seen
        found.append(f"/metrics series grew {quarter} -> {last} after the first quarter")
    if out["rss_slope_mib_per_min_second_half"] > rss_bound:
        found.append(f"RSS slope {out['rss_slope_mib_per_min_second_half']} MiB/min > {rss_bound}")
    if not out["health_ms_p99"] < 50:
        found.append(f"/health p99 {out['health_ms_p99']} ms >= 50")
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--target", choices=[TARGET], default=TARGET,
                    help="the served target: the toy pair, the one the oracle decodes")
    ap.add_argument("--backend", default="eager")
    ap.add_argument("--sample-s", type=float, default=2.0)
    ap.add_argument("--rss-slope-mib-min", type=float, default=2.0)
    ap.add_argument("--json", default=None, metavar="PATH")
    ap.add_argument("--idle", action="store_true", help="no clients: the sampler alone (a baseline)")
    ns = ap.parse_args()
    expected = oracle()
    with tempfile.TemporaryDirectory(prefix="draftgraph-soak-") as workdir:
        soak = Soak(ns.minutes, ns.backend, workdir)
        try:
            soak.wait_serving()
            soak.stop_at = time.monotonic() + ns.minutes * 60
            threads = [] if ns.idle else (
                [threading.Thread(target=soak.churner, args=(i,), daemon=True) for i in range(6)]
                + [threading.Thread(target=soak.honest, args=(i, expected), daemon=True) for i in range(3)]
                + [threading.Thread(target=soak.junk, args=(i,), daemon=True) for i in range(2)]
                + [threading.Thread(target=f, daemon=True) for f in (soak.sockets, soak.reloader)])
            threads.append(threading.Thread(target=soak.sampler, args=(ns.sample_s,), daemon=True))
            for t in threads:
                t.start()
            for t in threads:
                t.join(max(1.0, soak.stop_at - time.monotonic() + 330.0))
            out = {"minutes": ns.minutes, "backend": ns.backend, "idle": ns.idle, **soak.figures()}
        finally:
            out_rc = soak.stop()
    out["exit_code"] = out_rc
    out["missed"] = misses(out, ns.rss_slope_mib_min)
    text = json.dumps(out, indent=2)
    print(text)
    if ns.json:
        Path(ns.json).write_text(text + "\n")
    return 1 if out["missed"] or out_rc != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
