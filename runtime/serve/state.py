"""`ServeState`: what the routes read: the phase, the bridge once the engine is built, the
tokenizer and the request limits the cache sets."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from .bridge import EngineBridge
from .config import ServeConfig

__all__ = ["ServeState", "PHASES"]

PHASES = ("starting", "serving", "draining", "failed")


@dataclass
class ServeState:
    """Shared by the routes (event loop), the start-up thread and the signal handler. ``phase``
    moves starting -> serving -> draining (or -> failed when the engine cannot be built)."""

    config: ServeConfig
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    phase: str = "starting"
    bridge: EngineBridge | None = None
    tokenizer: Any = None
    max_len: int = 0  # cache positions per request
    reserve: int = 0  # positions kept free for the widest verify tree
    vocab_size: int = 0
    error: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    on_exit: Any = None  # called once serving should end (the server's exit flag)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def serving(self, bridge: EngineBridge, tokenizer: Any, max_len: int, reserve: int, vocab_size: int) -> None:
        """The engine is built: requests are taken from now on (unless a drain began)."""
        self.bridge, self.tokenizer = bridge, tokenizer
        self.max_len, self.reserve, self.vocab_size = max_len, reserve, vocab_size
        if self.phase == "starting":
            self.phase = "serving"
        else:  # SIGTERM came while starting
            bridge.begin_drain(0.0)

    def failed(self, error: str) -> None:
        self.phase, self.error = "failed", error
        if self.on_exit is not None:
            self.on_exit()

    def begin_drain(self) -> None:
        """SIGTERM: no new requests, the live ones get ``drain_s`` (signal-safe: writes only)."""
        starting = self.bridge is None
        self.phase = "draining"
        if starting:
            if self.on_exit is not None:
                self.on_exit()
        else:
            self.bridge.begin_drain(self.config.drain_s)
