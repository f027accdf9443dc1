"""The ``draftgraph`` command's process set-up: SIGHUP held, torch's NumPy notice dropped.

Two things only the command wants, never a library import:

- `HeldSighup`: ``simulate``, ``generate`` and ``serve`` (`SERVING_COMMANDS`) take SIGHUP "from
  start to exit"; until the CLI's `ProcessReloadSignal.install` takes the signal over (it treats the held count as early
  signals), a handler that only counts keeps the default action (ending the process) away;
- the filter of torch's ``Failed to initialize NumPy`` warning: draftgraph does not use NumPy
  (it is not a dependency), so after a plain ``pip install`` every command, ``--help``
  included, printed a line nobody can act on.

`prepare_console` does both for a command line. The command's entry, `draftgraph.runtime.commands.entry.main`
(the console script, ``python -m draftgraph.runtime``), calls it before it imports the command,
whose imports load torch: both have to be in place before torch loads (the notice is printed by
``import torch``, and a SIGHUP in the one to two seconds of that import would end the process).
This module imports nothing but the standard library, and ``draftgraph.runtime`` loads its names
lazily, so reaching it loads no torch. A library import changes no process state.
"""

from __future__ import annotations

import signal
import threading
import warnings
from collections.abc import Sequence
from typing import Any

__all__ = ["NUMPY_NOTICE", "SERVING_COMMANDS", "HeldSighup", "prepare_console"]

SERVING_COMMANDS = ("simulate", "generate", "serve")  # the commands that take SIGHUP from start to exit
NUMPY_NOTICE = "Failed to initialize NumPy"


class HeldSighup:
    """A SIGHUP handler that only counts (``held_signals``) until the CLI takes over."""

    def __init__(self) -> None:
        self.held_signals = 0

    def __call__(self, signum: int, frame: Any) -> None:
        self.held_signals += 1


def _hold_sighup() -> None:
    """Install `HeldSighup` when SIGHUP exists, still has its default action, and this is the main thread."""
    hup = getattr(signal, "SIGHUP", None)
    if hup is None or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(hup) is signal.SIG_DFL:
        signal.signal(hup, HeldSighup())


def prepare_console(command_args: Sequence[str]) -> None:
    """The command's set-up for ``command_args`` (the arguments after the program name): the
    NumPy notice filtered, and SIGHUP held for the `SERVING_COMMANDS`."""
    warnings.filterwarnings("ignore", message=NUMPY_NOTICE, category=UserWarning)
    if command_args and command_args[0] in SERVING_COMMANDS:
        _hold_sighup()
