"""Scrape latency of the metrics endpoint while clients misbehave (issue 40, point 3).

Starts the metrics server (`start_metrics_server`, loopback, its defaults), then at once: 300
idle connections, ``--drippers`` clients each sending one byte of a request line every
``--drip-s`` seconds, and one 10 MB request. Then ``--scrapes`` scrapes one a second, each with
a 15 s timeout. Prints each scrape's latency (or its error), the threads alive, and the server's
counters as JSON.

    python -m scripts.metrics_clients [--drippers 8] [--drip-s 4] [--scrapes 6]
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
import urllib.request

from prometheus_client import CollectorRegistry, Counter

from draftgraph.runtime.engine.metrics import start_metrics_server


def _drip(conns: list[socket.socket], every_s: float, stop: threading.Event) -> None:
    line = b"GET /metrics" + b"x" * 100_000
    i = 0
    while not stop.is_set():
        for conn in conns:
            try:
                conn.send(line[i:i + 1])
            except OSError:
                pass
        i += 1
        stop.wait(every_s)


def _big(port: int) -> None:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=15) as conn:
            conn.sendall(b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * (10 * 2**20) + b"\r\n\r\n")
            conn.recv(100)
    except OSError:
        pass


def main() -> None:
    """Run the clients and print the scrapes' latencies."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drippers", type=int, default=8)
    ap.add_argument("--drip-s", type=float, default=4.0)
    ap.add_argument("--scrapes", type=int, default=6)
    a = ap.parse_args()
    registry = CollectorRegistry()
    Counter("probe_scrapes", "a series to scrape", registry=registry).inc()
    server = start_metrics_server(0, registry)
    port = server.server_port
    idle = [socket.create_connection(("127.0.0.1", port), timeout=15) for _ in range(300)]
    drippers = [socket.create_connection(("127.0.0.1", port), timeout=15) for _ in range(a.drippers)]
    stop = threading.Event()
    threading.Thread(target=_drip, args=(drippers, a.drip_s, stop), daemon=True).start()
    threading.Thread(target=_big, args=(port,), daemon=True).start()
    time.sleep(1.0)
    scrapes = []
    for _ in range(a.scrapes):
        t0 = time.perf_counter()
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=15).read()
            scrapes.append(f"{(time.perf_counter() - t0) * 1000:.1f} ms")
        except OSError as exc:
            scrapes.append(f"{type(exc).__name__} after {time.perf_counter() - t0:.1f} s")
        time.sleep(1.0)
    counters = {name: getattr(server, name, None) for name in ("closed_idle", "refused_busy", "refused_large")}
    print(json.dumps({"scrapes": scrapes, "threads": threading.active_count(), "server": counters}, indent=1))
    stop.set()
    for conn in idle + drippers:
        conn.close()
    server.close()


if __name__ == "__main__":
    main()
