"""SIGHUP for a command's whole life: before its engine exists, while it serves, after it.

`draftgraph simulate` reloads from ``--reload-config`` on SIGHUP. A handler installed only once
the engine is built leaves the default action (the process dies) to every SIGHUP that comes
during model loading or capture, or while the report is written. The console script takes the
signal before torch is imported (`draftgraph.runtime.console`, which counts what comes);
`ProcessReloadSignal` takes it over first thing in the CLI's ``main``, keeps it until the process
exits (the CLI never gives it back) and answers each phase:

- before `attach` (models loading, capture): remembered, and requested at `attach`, so it is
  applied at the first step; without a reload file it is logged as ignored;
- attached: the args file is read and the reload requested (a bad file or a refused reload
  is reported, serving goes on);
- after `detach` (the loop ended, the report is being written, the process is exiting): logged
  as ignored;
- once the interpreter exits (an ``atexit`` hook): ignored outright (``SIG_IGN``). Python gives
  every signal with a Python handler its default action back while it finalizes, after the
  ``atexit`` hooks, and the default action of SIGHUP ends the process (exit -1 after a whole
  run); ``SIG_IGN`` is left as it is.

The handler itself only counts and records (attribute writes and a `queue.SimpleQueue.put`,
which is safe in a signal handler); a reader thread (``draftgraph-sighup``) logs, reads the args
file and requests the reload, so the serving thread never waits on the file. The read is bounded
anyway (`load_runtime_args`: regular files only, at most 1 MiB). The engine applies a request at
its next step boundary.
"""

from __future__ import annotations

import atexit
import logging
import queue
import signal as _signal
import threading
from typing import Any

from draftgraph.runtime import load_runtime_args

__all__ = ["ProcessReloadSignal"]

logger = logging.getLogger(__name__)

_FLUSH_S = 5.0  # the most `flush` waits for the reader thread (a bounded read takes milliseconds)


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
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._reader: threading.Thread | None = None
        self._lock = threading.Lock()  # _reload from the reader thread and from attach
        self.received = self.early = self.requested = self.rejected = self.ignored = 0

    # ---- life -----------------------------------------------------------------------------------
    def install(self) -> ProcessReloadSignal:
        """Take the signal from now on (main thread only; elsewhere, or without SIGHUP, this
        does nothing). Signals the console script held before torch loaded count as early ones.
        Returns self."""
        if self.signum is None or threading.current_thread() is not threading.main_thread():
            return self
        self._start_reader()
        previous = _signal.signal(self.signum, self._handle)
        held = getattr(previous, "held_signals", None)  # the console script's early handler
        if held is not None:
            previous = _signal.SIG_DFL
            for _ in range(int(held)):
                self._handle(self.signum, None)
        self._previous = previous
        self._installed = True
        atexit.register(self._ignore_at_exit)
        return self

    def uninstall(self) -> None:
        """Give the signal back to its previous handler (a library caller's own run; the CLI
        keeps the handler until the process exits)."""
        if self._installed:
            _signal.signal(self.signum, self._previous)
            self._installed = False
            atexit.unregister(self._ignore_at_exit)
        self.flush()

    def _ignore_at_exit(self) -> None:
        """At interpreter exit, still installed: ignore the signal from now on (see the module)."""
        if self._installed and threading.current_thread() is threading.main_thread():
            _signal.signal(self.signum, _signal.SIG_IGN)

    def __enter__(self) -> ProcessReloadSignal:
        return self.install()

    def __exit__(self, *exc: Any) -> None:
        self.uninstall()

    def attach(self, engine: Any) -> None:
        """The engine serves from now on; a signal that came before is requested now (applied
        at its first step)."""
        self.flush()  # the early signals' log lines come first
        self._engine = engine
        self._phase = "attached"
        if self._early:
            self._early = False
            self._reload("SIGHUP received before the engine was ready")

    def detach(self) -> None:
        """The loop is over: later signals are logged and ignored. A reload being read now
        finishes first (bounded), so the figures of `as_dict` are complete."""
        self._phase = "after"
        self.flush()
        self._engine = None

    def flush(self, timeout_s: float = _FLUSH_S) -> bool:
        """Wait (at most ``timeout_s``) until the reader thread has handled every signal so far;
        False when it has not."""
        if self._reader is None or not self._reader.is_alive():
            return True
        done = threading.Event()
        self._inbox.put(done)
        return done.wait(timeout_s)

    def _start_reader(self) -> None:
        if self._reader is None:
            self._reader = threading.Thread(target=self._read_loop, name="draftgraph-sighup", daemon=True)
            self._reader.start()

    # ---- the handler (signal context: count and record only) -------------------------------------
    def _handle(self, signum: int, frame: Any) -> None:
        self.received += 1
        phase = self._phase
        if phase == "before":
            self.early += 1
            if self.reload_config:
                self._early = True
        self._inbox.put(phase)

    # ---- the reader thread ----------------------------------------------------------------------
    def _read_loop(self) -> None:
        while True:
            item = self._inbox.get()
            if isinstance(item, threading.Event):
                item.set()
                continue
            try:
                self._answer(item)
            except Exception:  # never let one signal end the thread that answers the next
                logger.exception("SIGHUP: answering it failed")

    def _answer(self, phase: str) -> None:
        if phase == "attached":
            self._reload("SIGHUP")
        elif phase == "before":
            if self.reload_config:
                logger.warning("SIGHUP before the engine is ready: the reload from %s is "
                               "requested when it is, applied at its first step", self.reload_config)
            else:
                with self._lock:
                    self.ignored += 1
                logger.warning("SIGHUP ignored: %s has no reload file (simulate --reload-config FILE)",
                               self.command)
        else:
            with self._lock:
                self.ignored += 1
            logger.warning("SIGHUP after the serving loop ended: ignored (%s is writing its report "
                           "or exiting)", self.command)

    def _reload(self, why: str) -> None:
        with self._lock:
            engine = self._engine
            if not self.reload_config or engine is None:
                self.ignored += 1
                logger.warning("%s: ignored, %s has no reload file (simulate --reload-config FILE)"
                               if not self.reload_config else "%s: ignored, %s is no longer serving",
                               why, self.command)
                return
            try:
                engine.request_reload(load_runtime_args(self.reload_config))
            except Exception as exc:  # a bad file or a refused reload: report, serve on
                self.rejected += 1
                logger.error("reload rejected (%s), still serving the previous state: %s", why, exc)
            else:
                self.requested += 1
                logger.info("reload from %s queued (%s)", self.reload_config, why)

    def as_dict(self) -> dict[str, int]:
        """What the handler did: received, early (before the engine), requested, rejected, ignored."""
        return {"received": self.received, "early": self.early, "requested": self.requested,
                "rejected": self.rejected, "ignored": self.ignored}
