"""Prometheus metrics of a `SpecDecodeEngine`: its counters, its worker's, its coordinator's.

Read at scrape time from the engine's `EngineStats` (no per-step cost); the names are in
`draftgraph.runtime.prometheus.METRICS`. Every counter only rises within a process: the engine's
are its totals for its life (`SpecDecodeEngine.reset_stats` restarts ``stats()`` only), read in
one snapshot per scrape; the worker's never go down either. `serve_metrics` serves them on
127.0.0.1 by default (the CLI's ``--metrics-port`` / ``--metrics-host``) from a bounded server
(`metrics_server.MetricsServer`: requests are read without a thread per connection, each within
one deadline; a few handler threads at most, 503 at once when they are busy).
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, make_wsgi_app

from draftgraph.runtime.prometheus import MetricsHandle, Samples, read_coordinator, read_worker, register_source

from .engine import SpecDecodeEngine
from .metrics_server import CONNECTION_TIMEOUT_S, MAX_HANDLER_THREADS, MetricsServer

__all__ = ["register_engine_metrics", "serve_metrics", "start_metrics_server", "is_loopback", "metrics_url"]

logger = logging.getLogger(__name__)


def read_engine(engine: Any, out: Samples, labels: dict[str, str]) -> None:
    """The engine's counters, stage seconds and start-up figures (its report's snapshot), then
    its worker's and its coordinator's."""
    # totals for the life of the engine, one snapshot under the stats' lock: a whole step or
    # none of it, and never lower than the last scrape (reset_stats only moves stats()'s mark)
    st = engine.report.snapshot()
    add = out.add
    drafts, accepted = st["drafts"], st["accepted"]
    add("draftgraph_spec_decode_drafts", labels, drafts)
    add("draftgraph_spec_decode_draft_tokens", labels, st["draft_tokens"])
    add("draftgraph_spec_decode_accepted_tokens", labels, accepted)
    per_pos = st["accepted_per_pos"]
    for pos in sorted(per_pos):
        add("draftgraph_spec_decode_accepted_tokens_per_pos", {**labels, "position": str(pos)}, per_pos[pos])
    add("draftgraph_spec_decode_mean_acceptance_length", labels, st["accept_length_mean"])
    add("draftgraph_engine_steps", labels, st["verify_steps"])
    add("draftgraph_tokens_generated", labels, st["tokens_generated"])
    add("draftgraph_requests_finished", labels, st["requests_finished"])
    add("draftgraph_requests_aborted", labels, st["requests_aborted"])
    add("draftgraph_requests_failed", labels, st["requests_failed"])
    for stage, seconds in st["stage_s"].items():
        add("draftgraph_stage_seconds", {**labels, "stage": stage}, seconds)
    add("draftgraph_startup_seconds", labels, st["startup_s"])
    add("draftgraph_draft_weights_version", labels, st["draft_weights_version"])
    add("draftgraph_draft_weights_updated_timestamp_seconds", labels, st["draft_weights_updated_at"] or 0.0)
    if st["acceptance_low"] is not None:
        add("draftgraph_acceptance_low", labels, 1 if st["acceptance_low"] else 0)
    if st["misfit_warnings"] is not None:
        add("draftgraph_draft_misfit_warnings", labels, st["misfit_warnings"])
    if st["graphs_ready_s"] is not None:
        add("draftgraph_graphs_ready_seconds", labels, st["graphs_ready_s"])
    read_startup(engine.startup(), out, labels)
    read_worker(engine.worker, out, labels)
    if engine.coordinator is not None:
        read_coordinator(engine.coordinator, out, labels)


def read_startup(startup: Mapping[str, Any], out: Samples, labels: dict[str, str]) -> None:
    """Where the live graphs came from and the compile subprocess's work, from
    `SpecDecodeEngine.startup()`: ``units_checked`` / ``units_recorded`` (recorded, of which
    checked against compiled code: source "compiled"), ``units_loaded``, ``units_shared`` and
    ``compile_process`` (its ``compiles``: the compiles run there)."""
    units = {"compiled": startup["units_checked"],
             "recorded": startup["units_recorded"] - startup["units_checked"],
             "loaded": startup["units_loaded"], "shared": startup["units_shared"]}
    for source, n in units.items():
        out.add("draftgraph_graph_units", {**labels, "source": source}, n)
    process = startup.get("compile_process") or {}  # None until the compile process ran: zeros
    out.add("draftgraph_compile_process_seconds", labels, process.get("compile_s", 0.0))
    out.add("draftgraph_compile_process_compiles", labels, process.get("compiles", 0))
    out.add("draftgraph_compile_process_deaths", labels, process.get("deaths", 0))


def register_engine_metrics(engine: SpecDecodeEngine, registry: CollectorRegistry | None = None,
                            labels: Mapping[str, str] | None = None) -> MetricsHandle:
    """Export ``engine``'s figures, its worker's and (when attached) its rank coordinator's.
    The worker must not be registered on its own in the same registry as well."""
    if not isinstance(engine, SpecDecodeEngine):
        raise TypeError(f"engine={type(engine).__name__}: must be a SpecDecodeEngine")
    return register_source(engine, lambda out, lb: read_engine(engine, out, lb), registry, labels,
                           also=(engine.worker,))


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def metrics_url(host: str, port: int) -> str:
    """``http://HOST:PORT/metrics``, an IPv6 address in brackets (``::`` -> ``http://[::]:PORT``)."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}/metrics"


def start_metrics_server(port: int, registry: CollectorRegistry, host: str = "127.0.0.1",
                         timeout_s: float = CONNECTION_TIMEOUT_S, max_threads: int = MAX_HANDLER_THREADS
                         ) -> MetricsServer:
    """The started `MetricsServer` of ``registry`` at http://HOST:PORT/metrics (``port`` 0 picks a
    free one); ValueError for a bad port or host, OSError naming them when the port is in use.
    A host that is not loopback is served with a warning: nothing authenticates a scraper."""
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise ValueError(f"metrics port={port!r}: must be an int in 0..65535 (0: a free port)")
    if not isinstance(host, str) or not host or len(host) > 255:
        raise ValueError(f"metrics host={str(host)[:100]!r}: must be a host name or an IP address")
    try:
        server = MetricsServer(host, port, make_wsgi_app(registry), max_threads=max_threads, timeout_s=timeout_s)
    except socket.gaierror as exc:
        raise ValueError(f"metrics host={host!r}: not an address of this machine ({exc})") from None
    except OSError as exc:
        raise OSError(exc.errno, f"metrics port {port} on {host}: {exc.strerror or exc}") from exc
    if not is_loopback(host):
        logger.warning("metrics served on %s, not loopback: anyone who can reach port %d can read them "
                       "(no authentication)", host, server.server_port)
    logger.info("metrics at %s", metrics_url(host, server.server_port))
    return server.start()


def serve_metrics(port: int, registry: CollectorRegistry, host: str = "127.0.0.1") -> int:
    """Serve ``registry`` at http://HOST:PORT/metrics (default 127.0.0.1) from a daemon thread;
    returns the port (see `start_metrics_server`)."""
    return start_metrics_server(port, registry, host).server_port
