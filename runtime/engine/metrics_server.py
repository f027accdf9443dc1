"""A bounded HTTP server for Prometheus ``/metrics``: idle connections cost no thread.

prometheus_client's `start_http_server` starts a thread per connection and waits on it without
a timeout: 300 idle connections held 302 threads for as long as their clients liked.
`MetricsServer` accepts in one thread and keeps every connection that has not sent a byte in a
selector (at most ``max_pending``; past that the oldest is closed) for at most ``timeout_s``,
then closes it. A connection that has sent its request gets a handler thread (at most
``max_threads`` at once; the accept thread waits up to ``timeout_s`` for one to free, then
closes the connection) whose socket reads and writes time out after ``timeout_s``. One request
per connection (wsgiref closes it after the response). So the threads stay at most
``max_threads + 1`` whatever clients do, and a real scrape is answered beside any number of idle
connections.
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

__all__ = ["MetricsServer", "MAX_HANDLER_THREADS", "MAX_PENDING_CONNECTIONS", "CONNECTION_TIMEOUT_S"]

logger = logging.getLogger(__name__)

MAX_HANDLER_THREADS = 8  # scrapes served at once
MAX_PENDING_CONNECTIONS = 256  # connections open but silent, waiting for their request
CONNECTION_TIMEOUT_S = 10.0  # to send a request, and per read/write while it is served


class _QuietHandler(WSGIRequestHandler):
    """One request, no access log (a scrape every few seconds would flood it)."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        """Log nothing."""


class MetricsServer(WSGIServer):
    """Serve WSGI ``app`` on (``host``, ``port``) within the bounds of the module docstring;
    `start` runs it in a daemon thread, `close` stops it."""

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
        self._pending: dict[socket.socket, tuple[Any, float]] = {}  # conn -> (address, deadline)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.socket, selectors.EVENT_READ)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.closed_idle = 0  # connections closed for sending nothing within timeout_s (or too many)
        self.refused_busy = 0  # connections closed because every handler thread stayed busy

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

    # ---- the accept thread ----------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                for key, _ in self._selector.select(timeout=min(0.5, self.timeout_s)):
                    if key.fileobj is self.socket:
                        self._accept()
                    else:
                        self._dispatch(key.fileobj)
                self._expire(time.monotonic())
        finally:
            for conn in list(self._pending):
                self._drop(conn)
            self._selector.close()
            self.server_close()

    def _accept(self) -> None:
        try:
            conn, addr = self.socket.accept()
        except OSError:  # BlockingIOError (another wake-up took it), ECONNABORTED
            return
        if len(self._pending) >= self.max_pending:  # dicts keep insertion order: the oldest first
            self._drop(next(iter(self._pending)))
            self.closed_idle += 1
        self._pending[conn] = (addr, time.monotonic() + self.timeout_s)
        self._selector.register(conn, selectors.EVENT_READ)

    def _dispatch(self, conn: Any) -> None:
        addr, _ = self._pending.pop(conn)
        self._selector.unregister(conn)
        if not self._slots.acquire(timeout=self.timeout_s):
            self.refused_busy += 1
            self.shutdown_request(conn)
            return
        try:
            conn.setblocking(True)
            conn.settimeout(self.timeout_s)
            threading.Thread(target=self._serve, args=(conn, addr), name="draftgraph-metrics-request",
                             daemon=True).start()
        except BaseException:
            self._slots.release()
            self.shutdown_request(conn)
            raise

    def _serve(self, conn: socket.socket, addr: Any) -> None:
        try:
            self.finish_request(conn, addr)
        except OSError as exc:  # a timeout, a client gone
            logger.debug("metrics connection from %s: %s", addr, exc)
        except Exception:  # the app's own error: logged, the server serves on
            logger.exception("metrics request from %s failed", addr)
        finally:
            self.shutdown_request(conn)
            self._slots.release()

    def _expire(self, now: float) -> None:
        for conn, (_, deadline) in list(self._pending.items()):
            if deadline <= now:
                self._drop(conn)
                self.closed_idle += 1

    def _drop(self, conn: socket.socket) -> None:
        self._pending.pop(conn, None)
        try:
            self._selector.unregister(conn)
        except (KeyError, ValueError):
            pass
        self.shutdown_request(conn)
