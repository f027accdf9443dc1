"""Running the server: the listening socket, uvicorn, the engine built beside it, SIGTERM drains.

`run_server` starts uvicorn at once (``/health`` answers "starting") and builds the engine in a
thread; once it is built the routes take requests. SIGTERM drains instead of stopping at once:
new requests get 503, live ones have ``drain_s`` to finish, what is left is aborted, and the
process exits 0. SIGINT stops as uvicorn does. SIGHUP is the CLI's (`ProcessReloadSignal`),
attached to the engine once it is built.
"""

from __future__ import annotations

import gc
import logging
import signal
import socket
import threading
from collections.abc import Callable
from typing import Any

import uvicorn

from draftgraph.runtime.engine.metrics import register_engine_metrics

from .admin import admin_warning
from .bridge import EngineBridge
from .config import ServeConfig
from .connections import install_log_limits, uvicorn_options
from .routes import build_app
from .state import ServeState

__all__ = ["bind_socket", "run_server", "uvicorn_config", "DrainingServer", "EngineFactory"]

logger = logging.getLogger(__name__)

EngineFactory = Callable[[], tuple[Any, Any]]  # () -> (engine, tokenizer)
FORCE_SIGTERMS = 3  # the SIGTERM that stops at once instead of draining
SHUTDOWN_GRACE_S = 5.0  # after the drain: connections still open get this long to close


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening socket on HOST:PORT (port 0: a free one), bound before the models load so a
    port in use fails at once (OSError naming both)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ValueError(f"--host={host!r}: not an address of this machine ({exc})") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"--port={port} on {host}: {exc.strerror or exc}") from exc
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class DrainingServer(uvicorn.Server):
    """uvicorn's server, with SIGTERM answered by a drain (`ServeState.begin_drain`)."""

    def __init__(self, config: uvicorn.Config, state: ServeState) -> None:
        super().__init__(config)
        self.serve_state = state
        self.sigterms = 0

    def handle_exit(self, sig: int, frame: Any) -> None:
        """SIGTERM: the first begins the drain, the second keeps draining (logged), the third
        stops as uvicorn does; other signals are uvicorn's."""
        if sig == signal.SIGTERM:
            self.sigterms += 1
            if self.sigterms == 1 and self.serve_state.phase != "draining":
                self.serve_state.begin_drain()  # attribute writes only: safe in a signal handler
                return
            if self.sigterms < FORCE_SIGTERMS:  # no log here: a signal handler takes no lock
                return
        super().handle_exit(sig, frame)


def _build(state: ServeState, factory: EngineFactory, on_engine: Callable[[Any], None] | None,
           server: DrainingServer) -> None:
    try:
        engine, tokenizer = factory()
        register_engine_metrics(engine, state.registry)
        bridge = EngineBridge(engine, state.config.max_waiting, on_drained=lambda: setattr(server, "should_exit", True))
        bridge.start()
        state.serving(bridge, tokenizer, engine.requests.rules)
        if on_engine is not None:
            on_engine(engine)
        gc.collect()
        gc.freeze()  # the models' objects leave the collector's generations: no long full-GC pauses later
        logger.info("serving %s", state.config.model_name)
    except Exception as exc:
        logger.exception("the engine could not be built")
        state.failed(f"{type(exc).__name__}: {exc}")


def uvicorn_config(app: Any, config: ServeConfig) -> uvicorn.Config:
    """uvicorn's settings for ``app``: no access log, the connections' deadlines and cap
    (`connections.uvicorn_options`)."""
    return uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False,
                          timeout_graceful_shutdown=int(SHUTDOWN_GRACE_S), **uvicorn_options(config.limits))


def run_server(config: ServeConfig, sock: socket.socket, factory: EngineFactory,
               on_engine: Callable[[Any], None] | None = None) -> int:
    """Serve on ``sock`` until SIGTERM (drained, 0), SIGINT (KeyboardInterrupt) or a failed
    start (1). ``factory`` builds (engine, tokenizer) in a thread while ``/health`` says
    "starting"; ``on_engine(engine)`` runs once it serves (e.g. attach the SIGHUP handler)."""
    warning = admin_warning(config.host, config.admin_token)
    if warning is not None:
        logger.warning("%s", warning)
    state = ServeState(config)
    app = build_app(state)
    install_log_limits()
    ucfg = uvicorn_config(app, config)
    server = DrainingServer(ucfg, state)
    state.on_exit = lambda: setattr(server, "should_exit", True)
    builder = threading.Thread(target=_build, args=(state, factory, on_engine, server), name="draftgraph-serve-build",
                               daemon=True)
    builder.start()
    try:
        server.run(sockets=[sock])
    finally:
        if state.bridge is not None:
            state.bridge.stop()
            state.bridge.engine.close(timeout_s=10.0)
    return 1 if state.phase == "failed" else 0
