"""``python -m draftgraph.runtime``: the ``draftgraph`` command (`commands.entry.main`).

The top folder's one import of the command line: a ``__main__`` module is run, never imported,
so it closes no loop between folders (the folder check gives it a node of its own)."""

import os
import sys

from draftgraph.runtime.commands.entry import main

if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
