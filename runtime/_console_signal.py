"""SIGHUP taken before torch loads, for ``draftgraph simulate|generate`` only.

The console script's first import is this package, whose imports (torch) take one to two
seconds; a SIGHUP in that window would end the process, though the CLI promises to take it
"from start to exit". `hold_sighup_for_console` runs when this module is imported (first
in ``draftgraph/runtime/__init__``) and, only when the process is the ``draftgraph`` console script (or ``python -m
draftgraph.runtime.engine.cli``) running ``simulate`` or ``generate`` and SIGHUP still has its
default action, installs `HeldSighup`: it counts signals and does nothing else. The CLI's
`ProcessReloadSignal.install` takes the signal over and treats the count as early signals.
A library import in any other program changes nothing.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

__all__ = ["HeldSighup", "hold_sighup_for_console"]

_COMMANDS = ("simulate", "generate")


class HeldSighup:
    """A SIGHUP handler that only counts (``held_signals``) until the CLI takes over."""

    def __init__(self) -> None:
        self.held_signals = 0

    def __call__(self, signum: int, frame: Any) -> None:
        self.held_signals += 1


def _is_console(argv: list[str]) -> bool:
    if len(argv) < 2 or argv[1] not in _COMMANDS:
        return False
    # the console script, or ``python -m draftgraph.runtime.engine.cli`` (argv[0] is "-m" while
    # runpy imports the module's packages)
    return os.path.basename(argv[0]) in ("draftgraph", "draftgraph.exe") or argv[0] == "-m"


def hold_sighup_for_console() -> None:
    """Install `HeldSighup` when this process is ``draftgraph simulate|generate`` (see the module
    docstring); otherwise do nothing."""
    hup = getattr(signal, "SIGHUP", None)
    if hup is None or not _is_console(list(sys.argv)):
        return
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(hup) is signal.SIG_DFL:
        signal.signal(hup, HeldSighup())


hold_sighup_for_console()
