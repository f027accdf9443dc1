"""A bounded HTTP server for Prometheus ``/metrics`` that no client can silence.

prometheus_client's `start_http_server` starts a thread per connection and waits on it without
a timeout: 300 idle connections held 302 threads for as long as their clients liked, and a
client sending one byte every few seconds held a handler for ever (its timeout was per read).

`MetricsServer` reads every request in one selector thread, without a thread per connection:
a connection has ``timeout_s`` from its accept to send a whole request head (request line and
headers, at most ``MAX_REQUEST_BYTES``; a metrics scrape has no body), whatever the pace of its
bytes, then it is closed. At most ``max_pending`` connections wait at once (past that the
oldest is closed). A head over the limit is answered 431 and closed. A whole head gets one of at
most ``max_threads`` handler threads, which runs the WSGI app on the bytes already read and
writes the answer within ``timeout_s`` (a deadline for the whole answer, not per write); when
every handler is busy the connection is answered 503 at once. The selector thread never waits
on a handler, so threads stay at most ``max_threads + 1`` and a real scrape is answered beside
any number of idle, dripping or oversized clients. One request per connection.
"""

from __future__ import annotations

import io
import logging
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

__all__ = ["MetricsServer", "MAX_HANDLER_THREADS", "MAX_PENDING_CONNECTIONS", "CONNECTION_TIMEOUT_S",
           "MAX_REQUEST_BYTES"]

logger = logging.getLogger(__name__)

MAX_HANDLER_THREADS = 8  # scrapes served at once
MAX_PENDING_CONNECTIONS = 256  # connections open and still sending their request
CONNECTION_TIMEOUT_S = 10.0  # to send a whole request from the accept; then to write the whole answer
MAX_REQUEST_BYTES = 64 * 1024  # a request's line and headers together


def _plain(status: str, text: str, extra: str = "") -> bytes:
    """A whole HTTP/1.0 answer with a text body, sent as one piece."""
    body = text.encode()
    return (f"HTTP/1.0 {status}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n{extra}"
            "Connection: close\r\n\r\n").encode() + body


_BUSY = _plain("503 Service Unavailable", "every metrics handler is busy\n", "Retry-After: 1\r\n")
_TOO_LARGE = _plain("431 Request Header Fields Too Large", f"request head over {MAX_REQUEST_BYTES} bytes\n")


@dataclass
class _Request:
    """A connection and what it has sent of its request so far."""

    conn: socket.socket
    addr: Any
    deadline: float  # monotonic: the whole request by then
    data: bytearray = field(default_factory=bytearray)


class _DeadlineWriter(io.RawIOBase):
    """A socket's write side where every write gets what is left of one deadline."""

    def __init__(self, conn: socket.socket, deadline: float) -> None:
        super().__init__()
        self._conn = conn
        self._deadline = deadline

    def writable(self) -> bool:
        """Always."""
        return True

    def write(self, b: Any) -> int:
        """Send all of ``b`` before the deadline, else TimeoutError."""
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("metrics answer: past its deadline")
        self._conn.settimeout(left)
        self._conn.sendall(b)
        return len(b)


class _QuietHandler(WSGIRequestHandler):
    """One request already read (``request`` is a `_Request`), no access log (a scrape every few
    seconds would flood it)."""

    def setup(self) -> None:
        """Read from the bytes the selector thread took; write within the answer's deadline."""
        req: _Request = self.request
        self.connection = req.conn
        self.rfile = io.BytesIO(bytes(req.data))
        self.wfile = _DeadlineWriter(req.conn, time.monotonic() + self.server.timeout_s)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        """Log nothing."""


def _head_complete(data: bytearray) -> bool:
    return b"\r\n\r\n" in data or b"\n\n" in data


class MetricsServer(WSGIServer):
    """Serve WSGI ``app`` on (``host``, ``port``) within the bounds of the module docstring;
    `start` runs it in a daemon thread, `close` stops it."""

    request_queue_size = 128  # the listen backlog: a burst of connects waits for the accepts, not for SYN retries

    def __init__(self, host: str, port: int, app: Any, max_threads: int = MAX_HANDLER_THREADS,
                 max_pending: int = MAX_PENDING_CONNECTIONS, timeout_s: float = CONNECTION_TIMEOUT_S) -> None:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        self.address_family = family
        super().__init__((host, port), _QuietHandler)
        self.set_app(app)
        self.socket.setblocking(False)
        self.timeout_s = float(timeout_s)
        self.max_pending = int(max_pending)
        self._slots = threading.BoundedSemaphore(int(max_threads))
        self._pending: dict[socket.socket, _Request] = {}  # insertion order: the oldest first
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.socket, selectors.EVENT_READ)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.closed_idle = 0  # closed for sending no whole request within timeout_s (or too many waiting)
        self.refused_busy = 0  # answered 503: every handler thread was busy
        self.refused_large = 0  # answered 431: a request head over MAX_REQUEST_BYTES

    def start(self) -> MetricsServer:
        """Serve from a daemon thread; returns self."""
        self._thread = threading.Thread(target=self._loop, name="draftgraph-metrics", daemon=True)
        self._thread.start()
        return self

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop accepting, close every waiting connection and the listening socket."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    # ---- the selector thread: accepts and reads, never waits on anything else --------------------
    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                for key, _ in self._selector.select(timeout=min(0.5, self.timeout_s)):
                    if key.fileobj is self.socket:
                        self._accept()
                    else:
                        self._read(key.fileobj)
                self._expire(time.monotonic())
        finally:
            for conn in list(self._pending):
                self._drop(conn)
            self._selector.close()
            self.server_close()

    def _accept(self) -> None:
        for _ in range(64):  # what the backlog holds, a bounded number per wake-up
            try:
                conn, addr = self.socket.accept()
            except BlockingIOError:
                return
            except OSError:  # ECONNABORTED: a client gone before its accept
                continue
            self._admit(conn, addr)

    def _admit(self, conn: socket.socket, addr: Any) -> None:
        if len(self._pending) >= self.max_pending:
            self.closed_idle += 1
            self._drop(next(iter(self._pending)))
        conn.setblocking(False)
        self._pending[conn] = _Request(conn, addr, time.monotonic() + self.timeout_s)
        self._selector.register(conn, selectors.EVENT_READ)

    def _read(self, conn: Any) -> None:
        req = self._pending[conn]
        try:
            chunk = conn.recv(MAX_REQUEST_BYTES + 1 - len(req.data))
        except BlockingIOError:
            return
        except OSError:  # reset by the client
            self._drop(conn)
            return
        if not chunk:  # the client closed before a whole request
            self._drop(conn)
            return
        req.data += chunk
        if _head_complete(req.data):
            self._unpend(conn)
            self._dispatch(req)
        elif len(req.data) > MAX_REQUEST_BYTES:
            self.refused_large += 1
            self._answer_and_drop(conn, _TOO_LARGE)

    def _dispatch(self, req: _Request) -> None:
        if not self._slots.acquire(blocking=False):
            self.refused_busy += 1
            self._answer_and_drop(req.conn, _BUSY)
            return
        try:
            threading.Thread(target=self._serve, args=(req,), name="draftgraph-metrics-request",
                             daemon=True).start()
        except BaseException:
            self._slots.release()
            self.shutdown_request(req.conn)
            raise

    def _answer_and_drop(self, conn: socket.socket, answer: bytes) -> None:
        """Send a short answer without waiting (what the socket's buffer takes), then close."""
        try:
            conn.send(answer)
        except OSError:
            pass
        self._drop(conn)

    def _expire(self, now: float) -> None:
        for conn, req in list(self._pending.items()):
            if req.deadline <= now:
                self.closed_idle += 1
                self._drop(conn)

    def _unpend(self, conn: socket.socket) -> None:
        self._pending.pop(conn, None)
        try:
            self._selector.unregister(conn)
        except (KeyError, ValueError):
            pass

    def _drop(self, conn: socket.socket) -> None:
        self._unpend(conn)
        self.shutdown_request(conn)

    # ---- a handler thread --------------------------------------------------------------------------
    def _serve(self, req: _Request) -> None:
        try:
            self.finish_request(req, req.addr)
        except OSError as exc:  # the deadline, a client gone
            logger.debug("metrics connection from %s: %s", req.addr, exc)
        except Exception:  # the app's own error: logged, the server serves on
            logger.exception("metrics request from %s failed", req.addr)
        finally:
            self.shutdown_request(req.conn)
            self._slots.release()
