"""Prometheus metrics of a `SpecDecodeEngine`: its counters, its worker's, its coordinator's.

Read at scrape time from the engine's `EngineStats` (no per-step cost); the names are in
`draftgraph.runtime.metrics.METRICS`. Every counter only rises within a process: the engine's
are its totals for its life (`SpecDecodeEngine.reset_stats` restarts ``stats()`` only), read in
one snapshot per scrape; the worker's never go down either. `serve_metrics` starts
prometheus_client's own HTTP server on 127.0.0.1 (the CLI's ``--metrics-port``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from ..metrics import MetricsHandle, Samples, read_coordinator, read_worker, register_source

__all__ = ["register_engine_metrics", "serve_metrics"]

logger = logging.getLogger(__name__)


def read_engine(engine: Any, out: Samples, labels: dict[str, str]) -> None:
    """The engine's counters, stage seconds and start-up figures, then its worker's and its
    coordinator's."""
    # totals for the life of the engine, one snapshot under the stats' lock: a whole step or
    # none of it, and never lower than the last scrape (reset_stats only moves stats()'s mark)
    st = engine._stats.snapshot()  # noqa: SLF001 (the engine's own package; stats() copies far more)
    add = out.add
    drafts, accepted = st["drafts"], st["accepted"]
    add("draftgraph_spec_decode_drafts", labels, drafts)
    add("draftgraph_spec_decode_draft_tokens", labels, st["draft_tokens"])
    add("draftgraph_spec_decode_accepted_tokens", labels, accepted)
    per_pos = st["accepted_per_pos"]
    for pos in sorted(per_pos):
        add("draftgraph_spec_decode_accepted_tokens_per_pos", {**labels, "position": str(pos)}, per_pos[pos])
    add("draftgraph_spec_decode_mean_acceptance_length", labels, 1.0 + accepted / drafts if drafts else 0.0)
    add("draftgraph_engine_steps", labels, st["verify_steps"])
    add("draftgraph_tokens_generated", labels, st["tokens_generated"])
    add("draftgraph_requests_finished", labels, st["requests_finished"])
    add("draftgraph_requests_aborted", labels, st["requests_aborted"])
    add("draftgraph_requests_failed", labels, st["requests_failed"])
    for stage, seconds in st["stage_s"].items():
        add("draftgraph_stage_seconds", {**labels, "stage": stage}, seconds)
    add("draftgraph_startup_seconds", labels, engine.startup_s)
    weights = engine._weights  # noqa: SLF001
    add("draftgraph_draft_weights_version", labels, weights.version)
    add("draftgraph_draft_weights_updated_timestamp_seconds", labels, weights.updated_at or 0.0)
    watch = engine._acceptance  # noqa: SLF001
    if watch is not None:
        add("draftgraph_acceptance_low", labels, 1 if watch.low else 0)
    ready = _graphs_ready_s(engine)
    if ready is not None:
        add("draftgraph_graphs_ready_seconds", labels, ready)
    read_worker(engine.worker, out, labels)
    if engine.coordinator is not None:
        read_coordinator(engine.coordinator, out, labels)


def _graphs_ready_s(engine: Any) -> float | None:
    """`SpecDecodeEngine.startup`'s ``graphs_ready_s`` without its per-state summary."""
    if engine.backend == "eager":
        return 0.0
    queue = engine.worker.capture_queue
    idle = queue.idle_since if queue.pending() == 0 else None
    return None if idle is None else max(0.0, idle - engine._t0)  # noqa: SLF001


def register_engine_metrics(engine: Any, registry: CollectorRegistry | None = None,
                            labels: Mapping[str, str] | None = None) -> MetricsHandle:
    """Export ``engine``'s figures, its worker's and (when attached) its rank coordinator's.
    The worker must not be registered on its own in the same registry as well."""
    if not hasattr(engine, "_stats") or not hasattr(engine, "worker"):
        raise TypeError(f"engine={type(engine).__name__}: must be a SpecDecodeEngine")
    return register_source(engine, lambda out, lb: read_engine(engine, out, lb), registry, labels,
                           also=(engine.worker,))


def serve_metrics(port: int, registry: CollectorRegistry) -> int:
    """Serve ``registry`` at http://127.0.0.1:PORT/metrics from a daemon thread; returns the
    port (``port`` 0 picks a free one). OSError naming the port when it is in use."""
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise ValueError(f"metrics port={port!r}: must be an int in 0..65535 (0: a free port)")
    try:
        server, _thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    except OSError as exc:
        raise OSError(exc.errno, f"metrics port {port} on 127.0.0.1: {exc.strerror or exc}") from exc
    bound = server.server_port
    logger.info("metrics at http://127.0.0.1:%d/metrics", bound)
    return bound
