"""`ServeState`: what the routes read: the phase, the bridge once the engine is built, the
tokenizer and the engine's admission rules."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from draftgraph.runtime.engine.admission import AdmissionRules

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
    rules: AdmissionRules | None = None  # the engine's own admission rules (no copies of its limits)
    error: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    on_exit: Any = None  # called once serving should end (the server's exit flag)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def serving(self, bridge: EngineBridge, tokenizer: Any, rules: AdmissionRules) -> None:
        """The engine is built: requests are taken from now on (unless a drain began), checked
        by ``rules``, the engine's own (`RequestTable.rules`)."""
        self.bridge, self.tokenizer, self.rules = bridge, tokenizer, rules
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
