"""The ``draftgraph`` command line: its subcommands (simulate, generate, serve, train-head, check)
and what only they use (SIGHUP reloads of a command, the ranks' reload channel, the sampling
flags). The room above `engine/` and `serve/`: it imports both, and neither imports it; the
console script and ``python -m draftgraph.runtime`` reach it through `runtime.entry`.
"""

from __future__ import annotations

from .cli import main

__all__ = ["main"]
