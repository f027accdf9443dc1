"""The metrics endpoint answers while clients misbehave (issue 40, point 3).

Real sockets on loopback. Every client has a timeout and every thread a bounded join, so a
server that fails the rule fails the test instead of hanging it.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from draftgraph.runtime.engine.metrics import start_metrics_server
from draftgraph.runtime.engine.metrics_server import MAX_REQUEST_BYTES, MetricsServer


def _registry():
    from prometheus_client import CollectorRegistry, Counter
    registry = CollectorRegistry()
    Counter("draftgraph_test_scrapes", "a series to scrape", registry=registry).inc(3)
    return registry


def _scrape(port: int, timeout_s: float = 5.0) -> tuple[float, str]:
    """Seconds to a whole answer, and the body (an error from urllib fails the caller)."""
    t0 = time.perf_counter()
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s).read().decode()
    return time.perf_counter() - t0, body


class _Drippers:
    """``n`` clients each sending one byte of a never-ending request line every ``every_s``."""

    def __init__(self, port: int, n: int, every_s: float) -> None:
        self.conns = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(n)]
        self.every_s = every_s
        self.stop = threading.Event()
        self.sent = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        line = b"GET /metrics" + b"x" * 10_000
        i = 0
        while not self.stop.is_set():
            for conn in self.conns:
                with contextlib.suppress(OSError):
                    conn.send(line[i:i + 1])
                    self.sent += 1
            i += 1
            self.stop.wait(self.every_s)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        for conn in self.conns:
            conn.close()


@contextlib.contextmanager
def _server(**kw) -> Iterator[MetricsServer]:
    server = start_metrics_server(0, _registry(), **kw)
    try:
        yield server
    finally:
        server.close()


def _send_big(port: int, nbytes: int, result: dict) -> None:
    """A request of ``nbytes`` header bytes; what the server answered (or how it cut us off)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
            conn.sendall(b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * nbytes + b"\r\n\r\n")
            result["answer"] = conn.recv(200)
    except OSError as exc:  # reset or broken pipe: the server stopped reading
        result["answer"] = exc


def test_a_scrape_answers_in_under_a_second_beside_drippers_idle_ones_and_a_huge_request():
    with _server() as server:
        port = server.server_port
        idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(300)]
        drip = _Drippers(port, 8, every_s=1.0)
        big: dict = {}
        big_thread = threading.Thread(target=_send_big, args=(port, 10 * 2**20, big), daemon=True)
        try:
            time.sleep(1.5)  # every dripper has sent bytes: today's server gave each a handler thread
            big_thread.start()
            times = []
            for _ in range(3):
                took, body = _scrape(port)
                assert "draftgraph_test_scrapes_total 3.0" in body
                times.append(took)
                time.sleep(0.5)
            assert drip.sent >= 16, drip.sent  # the drippers were dripping all along
            assert max(times) < 1.0, times
            big_thread.join(10)
            assert not big_thread.is_alive()
            answer = big["answer"]
            assert isinstance(answer, OSError) or answer.startswith(b"HTTP/1.0 431"), answer
            assert server.refused_large == 1
        finally:
            drip.close()
            for conn in idle:
                conn.close()


def test_a_dripping_client_is_closed_at_its_deadline_not_per_read():
    with _server(timeout_s=1.5) as server:
        drip = _Drippers(server.server_port, 1, every_s=0.2)
        try:
            conn = drip.conns[0]
            t0 = time.monotonic()
            with contextlib.suppress(ConnectionResetError):
                assert conn.recv(100) == b""  # closed by the server, bytes arriving every 0.2 s
            took = time.monotonic() - t0
            assert took < 3.0, took
            assert drip.sent >= 5
            assert server.closed_idle >= 1
        finally:
            drip.close()


def test_a_busy_handler_pool_answers_503_at_once():
    release = threading.Event()

    def slow_app(environ, start_response):
        release.wait(10)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"slow\n"]

    server = MetricsServer("127.0.0.1", 0, slow_app, max_threads=1, timeout_s=10).start()
    first: dict = {}

    def hold() -> None:
        first["body"] = urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/", timeout=15).read()

    holder = threading.Thread(target=hold, daemon=True)
    try:
        holder.start()
        time.sleep(0.5)  # the only handler thread waits in the app
        t0 = time.perf_counter()
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/", timeout=5)
        assert info.value.code == 503
        assert time.perf_counter() - t0 < 1.0
        assert server.refused_busy == 1
    finally:
        release.set()
        holder.join(15)
        server.close()
    assert first["body"] == b"slow\n"


def test_a_request_over_the_limit_is_refused_and_one_under_it_served():
    with _server() as server:
        port = server.server_port
        result: dict = {}
        _send_big(port, MAX_REQUEST_BYTES + 1, result)
        assert isinstance(result["answer"], OSError) or result["answer"].startswith(b"HTTP/1.0 431")
        with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
            conn.sendall(b"GET /metrics HTTP/1.1\r\nX-Pad: " + b"a" * (MAX_REQUEST_BYTES // 2) + b"\r\n\r\n")
            answer = b""
            while chunk := conn.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.0 200"), answer[:200]
        assert b"draftgraph_test_scrapes_total 3.0" in answer
