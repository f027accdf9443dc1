"""Torch's NumPy notice dropped for the ``draftgraph`` command, before torch loads.

A torch wheel imported without NumPy warns ``Failed to initialize NumPy: No module named
'numpy'`` at import. draftgraph does not use NumPy (it is not a dependency), so after a plain
``pip install`` every command, ``--help`` included, printed a line nobody can act on. When this
process is the ``draftgraph`` console script (or ``python -m draftgraph.runtime.engine.cli``),
that one warning is filtered; other programs importing the library see torch's warnings as
torch emits them.
"""

from __future__ import annotations

import os
import sys
import warnings

__all__ = ["quiet_numpy_notice_for_console"]

NUMPY_NOTICE = "Failed to initialize NumPy"


def _is_console(argv: list[str]) -> bool:
    return bool(argv) and (os.path.basename(argv[0]) in ("draftgraph", "draftgraph.exe") or argv[0] == "-m")


def quiet_numpy_notice_for_console() -> None:
    """Filter torch's NumPy notice when this process is the console script (see the module docstring)."""
    if _is_console(list(sys.argv)):
        warnings.filterwarnings("ignore", message=NUMPY_NOTICE, category=UserWarning)


quiet_numpy_notice_for_console()
