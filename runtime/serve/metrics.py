"""HTTP figures of the server in the engine's Prometheus registry: requests by route, method and
status, their latency (to the last byte, streams included), and the live streams.

Every label takes its values from a closed set: routes from the app's route table (any other
path is ``other``), methods from `METHODS` (any other is ``other``), statuses from the three
digits a response can have (anything else ``other``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["HttpMetrics"]

ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics", "/admin/reload",
          "/admin/profile")  # when no route table is given
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class HttpMetrics:
    """An ASGI middleware counting every HTTP request into ``registry``; ``routes``: the paths
    of the app's route table (every label closed: a scanner cannot grow the label set)."""

    def __init__(self, app: Any, registry: CollectorRegistry, streams: Callable[[], dict[str, int]],
                 routes: tuple[str, ...] = ROUTES) -> None:
        self.app = app
        self.routes = frozenset(routes)
        self.requests = Counter("draftgraph_http_requests", "HTTP requests answered, by route, method and status",
                                ["route", "method", "status"], registry=registry)
        self.latency = Histogram("draftgraph_http_request_duration_seconds",
                                 "HTTP request time from its arrival to the answer's last byte, by route",
                                 ["route"], buckets=LATENCY_BUCKETS, registry=registry)
        gauge = Gauge("draftgraph_serve_requests", "Live requests of the server: running or waiting",
                      ["state"], registry=registry)
        gauge.labels("running").set_function(lambda: streams()["running"])
        gauge.labels("waiting").set_function(lambda: streams()["waiting"])

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = scope["path"] if scope["path"] in self.routes else "other"
        method = scope["method"] if scope["method"] in METHODS else "other"
        start, status = time.perf_counter(), [500]

        async def sending(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            code = status[0]
            self.requests.labels(route, method, str(code) if 100 <= code <= 599 else "other").inc()
            self.latency.labels(route).observe(time.perf_counter() - start)
