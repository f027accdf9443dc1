"""The ``draftgraph`` command's entry (console script and ``python -m draftgraph.runtime``): the
process set-up of `console.prepare_console` first, torch-free, then the command itself. It lives
in commands/ (the room above the rest), so the top folder never imports the command line."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from draftgraph.runtime.console import prepare_console

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``draftgraph`` command line ``argv`` (default ``sys.argv[1:]``); returns its exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    prepare_console(args)
    from .cli import main as run_command  # loads torch: after the set-up

    return run_command(args)
