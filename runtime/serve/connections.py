"""Connections with deadlines: what uvicorn is given, and the little it lacks.

uvicorn already closes a keep-alive connection idle after a response (``timeout_keep_alive``),
answers 503 past ``limit_concurrency`` once a request's headers came, and bounds a request
head (h11's ``max_incomplete_event_size``). It has no deadline for a request to arrive: a
connection that sends nothing, or drips its headers or its body, stays open for ever. So
`DeadlineProtocol` (uvicorn's h11 protocol) adds one: a request's head and body must arrive
within ``request_timeout_s`` of its first byte (or of the connection's opening), else the
connection is closed; and it answers 503 (with ``Retry-After``) and closes a connection opened
past ``max_connections``, before the process runs out of file descriptors. `RateLimitFilter`
keeps the logs of a flood (refused connections, bad requests, accept errors) to a few lines a
minute per message, counting what it left out.
"""

from __future__ import annotations

import functools
import logging
import resource
import time
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["ConnectionLimits", "DeadlineProtocol", "RateLimitFilter", "default_max_connections",
           "install_log_limits", "uvicorn_options"]

logger = logging.getLogger(__name__)

FD_HEADROOM = 64  # file descriptors kept for the process itself (models, logs, the listening socket)
REFUSED = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
           b"retry-after: 1\r\nconnection: close\r\ncontent-length: 27\r\n\r\ntoo many open connections\r\n")


def default_max_connections() -> int:
    """Open connections allowed: below the soft file limit by `FD_HEADROOM`, at most 1024."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 4096
    return max(8, min(1024, soft - FD_HEADROOM))


@dataclass(frozen=True)
class ConnectionLimits:
    """``request_timeout_s``: a request's head and body must arrive within it;
    ``keep_alive_s``: an idle connection between requests closes after it;
    ``max_connections``: open connections beyond it get 503 and are closed (0: from the file
    limit, `default_max_connections`); ``max_header_bytes``: the largest request head;
    ``trust_proxy``: addresses whose X-Forwarded-For names the client (None: no one's)."""

    request_timeout_s: float = 10.0
    keep_alive_s: float = 5.0
    max_connections: int = 0
    max_header_bytes: int = 16 * 1024
    trust_proxy: str | None = None

    def __post_init__(self) -> None:
        for name in ("request_timeout_s", "keep_alive_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 3600:
                raise ValueError(f"{name}={value!r}: must be seconds in (0, 3600]")
        for name, low in (("max_connections", 0), ("max_header_bytes", 1024)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name}={value!r}: must be an int >= {low}")

    def connections(self) -> int:
        return self.max_connections or default_max_connections()


class DeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with a request deadline and a connection cap (module docstring)."""

    def __init__(self, *args: Any, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self._deadline: Any = None  # the timer of the request arriving now

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.connections():
            logger.warning("connection refused (503): %d open, --max-connections=%d", len(self.connections) - 1,
                           self.limits.connections())
            transport.write(REFUSED)
            transport.close()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and (self.cycle is None or self.cycle.response_complete):
            self._arm()  # a new request begins (after a keep-alive wait)
        super().data_received(data)
        if self._arrived():
            self._disarm()  # head and body arrived: the app answers in its own time

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arrived(self) -> bool:
        """The request of the current cycle came whole and is being answered."""
        cycle = self.cycle
        return cycle is not None and not cycle.more_body and not cycle.response_complete

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.limits.request_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self._arrived():
            return
        if not self.transport.is_closing():
            logger.warning("connection closed: no whole request within %.0f s (--request-timeout-s)",
                           self.limits.request_timeout_s)
            self.transport.close()


def uvicorn_options(limits: ConnectionLimits) -> dict[str, Any]:
    """Keyword arguments of ``uvicorn.Config`` for ``limits``: the protocol, uvicorn's own
    keep-alive, concurrency and head-size settings. uvicorn's proxy headers stay off whatever
    its ``FORWARDED_ALLOW_IPS`` environment variable says: the app reads X-Forwarded-For itself,
    from ``trust_proxy`` only, keeping the socket's peer beside it (`routes.build_app`)."""
    return {"http": functools.partial(DeadlineProtocol, limits=limits),
            "timeout_keep_alive": max(1, round(limits.keep_alive_s)),
            "limit_concurrency": limits.connections() + 1,
            "h11_max_incomplete_event_size": limits.max_header_bytes,
            "proxy_headers": False}


class RateLimitFilter(logging.Filter):
    """Lets ``per_window`` records of each message template through per ``window_s``; the
    first record of the next window says how many were left out."""

    def __init__(self, per_window: int = 5, window_s: float = 60.0) -> None:
        super().__init__()
        self.per_window, self.window_s = per_window, window_s
        self._seen: dict[str, list[float]] = {}  # template -> [window start, passed, left out]
        self.left_out = 0

    def filter(self, record: logging.LogRecord) -> bool:
        key = str(record.msg)[:200]
        now = time.monotonic()
        seen = self._seen.get(key)
        if seen is None or now - seen[0] >= self.window_s:
            if len(self._seen) > 1000:  # templates are few; a bound all the same
                self._seen.clear()
            dropped = int(seen[2]) if seen is not None else 0
            self._seen[key] = [now, 1, 0]
            if dropped:
                record.msg = f"{record.msg} ({dropped} more like this in the last {self.window_s:.0f} s left out)"
            return True
        if seen[1] < self.per_window:
            seen[1] += 1
            return True
        seen[2] += 1
        self.left_out += 1
        return False


LIMITED_LOGGERS = ("uvicorn.error", "asyncio", __name__)


def install_log_limits(per_window: int = 5, window_s: float = 60.0) -> RateLimitFilter:
    """One `RateLimitFilter` on the loggers a flood of connections writes to."""
    filt = RateLimitFilter(per_window, window_s)
    for name in LIMITED_LOGGERS:
        log = logging.getLogger(name)
        for old in [f for f in log.filters if isinstance(f, RateLimitFilter)]:
            log.removeFilter(old)
        log.addFilter(filt)
    return filt
