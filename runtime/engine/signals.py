"""SIGHUP for a command's whole life: before its engine exists, while it serves, after it.

`draftgraph simulate` reloads from ``--reload-config`` on SIGHUP. A handler installed only once
the engine is built leaves the default action (the process dies) to every SIGHUP that comes
during model loading or capture, or while the report is written. `ProcessReloadSignal` is
installed first thing and answers each phase:

- before `attach` (models loading, capture): remembered, and requested at `attach`, so it is
  applied at the first step; without a reload file it is logged as ignored;
- attached: the args file is read and the reload requested (a bad file or a refused reload
  is reported, serving goes on);
- after `detach` (the loop ended, the report is being written): logged as ignored.

The handler only reads a file and records a request (the engine applies it at its next step
boundary), so it is safe between any two bytecodes of a step.
"""

from __future__ import annotations

import logging
import signal as _signal
import threading
from typing import Any

from draftgraph.runtime import load_runtime_args

__all__ = ["ProcessReloadSignal"]

logger = logging.getLogger(__name__)


class ProcessReloadSignal:
    """SIGHUP handler of one command run (see the module docstring); counts what it did in
    `as_dict` (received, early, applied, rejected, ignored)."""

    def __init__(self, reload_config: str | None, command: str = "simulate",
                 signum: int | None = getattr(_signal, "SIGHUP", None)) -> None:
        self.reload_config = reload_config
        self.command = command
        self.signum = signum
        self._engine: Any = None
        self._phase = "before"  # before -> attached -> after
        self._early = False
        self._previous: Any = None
        self._installed = False
        self.received = self.early = self.requested = self.rejected = self.ignored = 0

    # ---- life -----------------------------------------------------------------------------------
    def install(self) -> ProcessReloadSignal:
        """Take the signal from now on (main thread only; elsewhere, or without SIGHUP, this
        does nothing). Returns self."""
        if self.signum is None or threading.current_thread() is not threading.main_thread():
            return self
        self._previous = _signal.signal(self.signum, self._handle)
        self._installed = True
        return self

    def uninstall(self) -> None:
        """Give the signal back to its previous handler."""
        if self._installed:
            _signal.signal(self.signum, self._previous)
            self._installed = False

    def __enter__(self) -> ProcessReloadSignal:
        return self.install()

    def __exit__(self, *exc: Any) -> None:
        self.uninstall()

    def attach(self, engine: Any) -> None:
        """The engine serves from now on; a signal that came before is requested now (applied
        at its first step)."""
        self._engine = engine
        self._phase = "attached"
        if self._early:
            self._early = False
            self._reload("SIGHUP received before the engine was ready")

    def detach(self) -> None:
        """The loop is over: later signals are logged and ignored."""
        self._engine = None
        self._phase = "after"

    # ---- the handler ----------------------------------------------------------------------------
    def _handle(self, signum: int, frame: Any) -> None:
        self.received += 1
        if self._phase == "attached":
            self._reload("SIGHUP")
        elif self._phase == "before":
            self.early += 1
            if self.reload_config:
                self._early = True
                logger.warning("SIGHUP before the engine is ready: the reload from %s is "
                               "requested when it is, applied at its first step", self.reload_config)
            else:
                self.ignored += 1
                logger.warning("SIGHUP ignored: %s has no reload file (simulate --reload-config FILE)",
                               self.command)
        else:
            self.ignored += 1
            logger.warning("SIGHUP after the serving loop ended: ignored (%s is writing its report)",
                           self.command)

    def _reload(self, why: str) -> None:
        if not self.reload_config:
            self.ignored += 1
            logger.warning("%s: ignored, %s has no reload file (simulate --reload-config FILE)",
                           why, self.command)
            return
        try:
            self._engine.request_reload(load_runtime_args(self.reload_config))
        except Exception as exc:  # raising here would break the step it interrupted: report, serve on
            self.rejected += 1
            logger.error("reload rejected (%s), still serving the previous state: %s", why, exc)
        else:
            self.requested += 1
            logger.info("reload from %s queued (%s)", self.reload_config, why)

    def as_dict(self) -> dict[str, int]:
        """What the handler did: received, early (before the engine), requested, rejected, ignored."""
        return {"received": self.received, "early": self.early, "requested": self.requested,
                "rejected": self.rejected, "ignored": self.ignored}
