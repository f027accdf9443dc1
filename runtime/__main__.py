"""``python -m draftgraph.runtime``: the ``draftgraph`` command (`entry.main`)."""

import os
import sys

from draftgraph.runtime.entry import main

if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
