"""Connections with deadlines, on raw sockets against an in-process uvicorn on 127.0.0.1 with the
server's own settings (`server.uvicorn_config`): idle and dripping connections are closed, an
idle keep-alive connection is closed, connections past the cap get 503; forwarded headers never
grant admin rights; metrics labels stay in closed sets. Every wait is bounded."""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
import uvicorn

from draftgraph.runtime.serve import ServeConfig, ServeState, build_app
from draftgraph.runtime.serve.connections import ConnectionLimits, RateLimitFilter
from draftgraph.runtime.serve.server import bind_socket, uvicorn_config

START_S = 10.0


@contextmanager
def serving(app: Any, config: ServeConfig) -> Iterator[int]:
    """uvicorn with ``config``'s settings, in a thread, on a free loopback port."""
    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn_config(app, config))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    deadline = time.monotonic() + START_S
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, "uvicorn did not start within 10 s"
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10.0)
        sock.close()


def _config(**limits: Any) -> ServeConfig:
    return ServeConfig(limits=ConnectionLimits(**limits))


def _closed_within(conn: socket.socket, timeout_s: float) -> tuple[bool, bytes]:
    """Read until the server closes (True) or ``timeout_s`` passes (False); what was read."""
    conn.settimeout(0.2)
    got, deadline = b"", time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            chunk = conn.recv(4096)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return True, got
        if not chunk:
            return True, got
        got += chunk
    return False, got


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5.0)


async def _echo_length(scope: dict, receive: Any, send: Any) -> None:
    """A tiny app that reads the whole body, then answers its length."""
    size, more = 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    body = str(size).encode()
    headers = [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def test_silent_and_dripping_connections_are_closed_at_the_request_deadline():
    """A connection that sends nothing, one that drips its head a byte at a time and one that
    drips its body are closed after ``request_timeout_s``; a whole request is answered. Before:
    all three stayed open (uvicorn has no request deadline)."""
    with serving(_echo_length, _config(request_timeout_s=1.0, keep_alive_s=30.0)) as port:
        silent, head, body = _connect(port), _connect(port), _connect(port)
        body.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
        start = time.monotonic()
        for i, byte in enumerate(b"GET / HTTP/1.1\r\nHost: x\r\n"):  # 0.1 s a byte: 2.6 s for the head
            if time.monotonic() - start > 4.0:
                break
            try:
                head.send(bytes([byte]))
                body.send(b"x") if i % 3 == 0 else None
            except OSError:
                break
            time.sleep(0.1)
        for name, conn in (("silent", silent), ("head drip", head), ("body drip", body)):
            closed, got = _closed_within(conn, 4.0)
            assert closed and b"200" not in got, f"{name}: still open {time.monotonic() - start:.1f} s after opening"
            conn.close()
        whole = _connect(port)
        whole.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc")
        closed, got = _closed_within(whole, 4.0)
        assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"3")


def test_an_idle_keep_alive_connection_closes():
    with serving(_echo_length, _config(request_timeout_s=30.0, keep_alive_s=1.0)) as port:
        conn = _connect(port)
        conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        start = time.monotonic()
        closed, got = _closed_within(conn, 5.0)
        assert got.startswith(b"HTTP/1.1 200") and closed
        assert time.monotonic() - start < 4.0
        conn.close()


def test_connections_past_the_cap_get_503_and_close():
    """``max_connections=4``: the 5th open connection is answered 503 with Retry-After and
    closed at once; once the others close, a new connection is served."""
    with serving(_echo_length, _config(request_timeout_s=30.0, max_connections=4)) as port:
        held = [_connect(port) for _ in range(4)]
        time.sleep(0.3)
        extra = _connect(port)
        closed, got = _closed_within(extra, 3.0)
        assert closed and got.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in got.lower()
        for conn in held:
            conn.close()
        time.sleep(0.3)
        conn = _connect(port)
        conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert _closed_within(conn, 3.0)[1].startswith(b"HTTP/1.1 200")
        conn.close()


def test_forwarded_headers_from_the_environment_are_not_honoured(monkeypatch):
    """uvicorn honours X-Forwarded-For from ``FORWARDED_ALLOW_IPS`` (``*`` in many images):
    the server turns that off, so a loopback caller stays the loopback caller whatever it
    claims (admin passes; the engine is still "starting": 503). Before: the claimed address
    was the client (403)."""
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "*")
    state = ServeState(ServeConfig())
    with serving(build_app(state), state.config) as port:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5.0) as c:
            r = c.post("/admin/reload", content=b"{}", headers={"X-Forwarded-For": "203.0.113.9"})
    assert r.status_code == 503


TOKEN = "s3cret-admin-token-0123456789"


@pytest.mark.parametrize("peer, trust, forwarded, token, allowed", [
    ("10.1.2.3", None, "127.0.0.1", None, False),  # a remote caller claiming loopback
    ("10.1.2.3", "10.1.2.3", "127.0.0.1", None, False),  # even through a trusted proxy
    ("127.0.0.1", "127.0.0.1", "203.0.113.9", None, False),  # a local proxy speaks for a remote client
    ("127.0.0.1", "127.0.0.1", "203.0.113.9", TOKEN, True),  # ... who has the token
    ("127.0.0.1", None, "203.0.113.9", None, True),  # no trusted proxy: the header is ignored
])
def test_the_socket_peer_decides_admin(peer, trust, forwarded, token, allowed):
    config = ServeConfig(host="0.0.0.0", admin_token=TOKEN, limits=ConnectionLimits(trust_proxy=trust))
    app = build_app(ServeState(config))
    headers = {"X-Forwarded-For": forwarded, **({"Authorization": f"Bearer {token}"} if token else {})}

    async def call() -> int:
        transport = httpx.ASGITransport(app=app, client=(peer, 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://server") as c:
            return (await c.post("/admin/reload", content=b"{}", headers=headers)).status_code

    assert asyncio.run(call()) == (503 if allowed else 403)


def test_metrics_labels_stay_in_closed_sets():
    """Made-up methods and paths count as ``other``: ``/metrics`` has as many series after 20
    as after 400 of them. Before: every method was a label value (the page grew for good)."""
    state = ServeState(ServeConfig())
    app = build_app(state)

    async def run() -> list[int]:
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
        sizes = []
        async with httpx.AsyncClient(transport=transport, base_url="http://server") as c:
            await c.get("/metrics")  # its own series exist from now on
            for n in (20, 400):
                for i in range(n):
                    await c.request(f"X{i}FOO", "/health")
                    await c.request("GET", f"/scan/{i}")
                sizes.append(len((await c.get("/metrics")).text.splitlines()))
            page = (await c.get("/metrics")).text
        methods = set(re.findall(r'method="([^"]*)"', page))
        assert methods <= {"GET", "other"}, methods
        return sizes

    first, second = asyncio.run(run())
    assert second == first


def test_log_flood_is_rate_limited():
    filt = RateLimitFilter(per_window=3, window_s=60.0)
    records = [filt.filter(_record("connection refused (503): %d open")) for _ in range(1000)]
    assert sum(records) == 3 and filt.left_out == 997


def _record(msg: str) -> Any:
    import logging

    return logging.LogRecord("x", logging.WARNING, __file__, 1, msg, (1,), None)
