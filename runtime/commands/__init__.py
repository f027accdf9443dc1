"""The ``draftgraph`` command line: its subcommands (simulate, generate, serve, train-head, check)
and what only they use (SIGHUP reloads of a command, the ranks' reload channel, the sampling
flags). The room above `engine/` and `serve/`: it imports both, and neither imports it. The
console script and ``python -m draftgraph.runtime`` reach it through `commands.entry`, which sets
the process up before the commands load torch, so this face loads `cli` only on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["main"]


def __getattr__(name: str) -> Any:
    """``main`` is `cli.main`, imported on first use (PEP 562): `entry` runs before torch loads."""
    if name != "main":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = importlib.import_module(f"{__name__}.cli").main
    globals()[name] = value  # later lookups skip this function
    return value
