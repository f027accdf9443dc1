"""Every ``DRAFTGRAPH_*`` environment variable draftgraph reads, typed and documented, in one place.

runtime/ reads its variables only through the readers here; graphs/ reads its own through
`draftgraph.graphs.core.settings` (graphs/ imports nothing from runtime/), and `Settings` holds both.
Each reader runs when its value is needed, never at import time (a command or a test may set a
variable first); a junk value raises ValueError naming the variable where it is read, as
before. `read_settings` reads them all at once for a report (``draftgraph info``).

| variable | type, default | what |
| --- | --- | --- |
| ``DRAFTGRAPH_COMPILE_PROCESS`` | "0" / else, on | background compiles run in a compile process |
| ``DRAFTGRAPH_DEBUG`` | bool, off | also: the draft workers' per-step checks of ids and NaNs (`draft_checks`) |
| ``DRAFTGRAPH_COMPILED`` | "0" / else, on | the compiled-code store (`compile_store`) |
| ``DRAFTGRAPH_COMPILED_DIR`` | folder, ``$DRAFTGRAPH_CACHE/compiled`` | where the store keeps compiled code |
| ``DRAFTGRAPH_COMPILED_MAX_MB`` | MiB in (0, 2**30], 512 | the store's size cap |
| ``DRAFTGRAPH_TARGET`` | "smollm2" / "toy" / folder or id, "smollm2" | the commands' target without ``--target`` |
| graphs/' variables | see `draftgraph.graphs.core.settings` | ``_DEBUG``, ``_DEBUG_EVERY``, ``_NVTX``, |
| | | ``_TRACE_REPLAY``, ``_COMPILE_SYMBOLIC``, ``_CACHE`` |

``DRAFTGRAPH_CACHE`` is read in one place, `draftgraph.graphs.core.settings.cache_root`, which the
models' cache (`models.defaults.model_cache_dir`) and the compiled-code store both call.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from draftgraph.graphs.core.settings import GraphSettings, cache_root, debug_enabled

__all__ = ["DEFAULT_COMPILED_MAX_BYTES", "DEFAULT_TARGET", "default_target",
           "MAX_COMPILED_CAP_MB", "Settings", "compile_process", "compiled_dir",
           "compiled_max_bytes", "compiled_store_on", "draft_checks", "read_settings"]

DEFAULT_COMPILED_MAX_BYTES = 512 << 20
MAX_COMPILED_CAP_MB = 1 << 30  # DRAFTGRAPH_COMPILED_MAX_MB's largest value (1 PiB): past it, a typo
DEFAULT_TARGET = "smollm2"  # SmolLM2-135M-Instruct (models/smollm2.py); "toy": the byte-level pair


def default_target() -> str:
    """``DRAFTGRAPH_TARGET``: what the commands serve without ``--target`` ("smollm2", the default;
    "toy", the embedded byte-level pair the tests use; or a checkpoint folder or id)."""
    return os.environ.get("DRAFTGRAPH_TARGET", "").strip() or DEFAULT_TARGET


def compile_process() -> bool:
    """``DRAFTGRAPH_COMPILE_PROCESS``: background compiles run in a compile process unless "0"."""
    return os.environ.get("DRAFTGRAPH_COMPILE_PROCESS", "1").strip() != "0"


def draft_checks() -> bool:
    """``DRAFTGRAPH_DEBUG`` for the draft checks: the one parser graphs/ reads it with
    (`graphs.core.settings.debug_enabled`), so a value switches both sets of checks alike."""
    return debug_enabled()


def compiled_store_on() -> bool:
    """``DRAFTGRAPH_COMPILED``: the compiled-code store is on unless "0"."""
    return os.environ.get("DRAFTGRAPH_COMPILED", "1").strip() != "0"


def compiled_dir() -> Path:
    """``$DRAFTGRAPH_COMPILED_DIR`` when set, else ``$DRAFTGRAPH_CACHE/compiled`` (default
    ``~/.cache/draftgraph/compiled``)."""
    own = os.environ.get("DRAFTGRAPH_COMPILED_DIR", "").strip()
    if own:
        return Path(own).expanduser()
    return cache_root(expand=True) / "compiled"


def compiled_max_bytes() -> int:
    """``DRAFTGRAPH_COMPILED_MAX_MB`` in bytes (default `DEFAULT_COMPILED_MAX_BYTES`); ValueError
    unless a finite number of MiB in (0, `MAX_COMPILED_CAP_MB`]."""
    raw = os.environ.get("DRAFTGRAPH_COMPILED_MAX_MB", "")
    if not raw.strip():
        return DEFAULT_COMPILED_MAX_BYTES
    rule = f"must be a finite number of MiB > 0 and at most {MAX_COMPILED_CAP_MB} (1 PiB)"
    try:
        mb = float(raw)
    except ValueError:
        raise ValueError(f"DRAFTGRAPH_COMPILED_MAX_MB={raw[:100]!r}: {rule}") from None
    if not 0 < mb <= MAX_COMPILED_CAP_MB:  # NaN and inf fail here too
        raise ValueError(f"DRAFTGRAPH_COMPILED_MAX_MB={raw[:100]!r}: {rule}")
    return max(1, int(mb * (1 << 20)))


@dataclass(frozen=True)
class Settings:
    """Every variable, read once by `read_settings` (see the module docstring)."""

    graphs: GraphSettings
    compile_process: bool
    draft_checks: bool
    compiled: bool
    compiled_dir: Path
    compiled_max_bytes: int
    target: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: graphs' settings nested, folders as strings."""
        out = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items() if k != "graphs"}
        return {"graphs": self.graphs.as_dict(), **out}


def read_settings() -> Settings:
    """All of them now (ValueError naming the first junk value)."""
    return Settings(graphs=GraphSettings.read(), compile_process=compile_process(), draft_checks=draft_checks(),
                    compiled=compiled_store_on(), compiled_dir=compiled_dir(), compiled_max_bytes=compiled_max_bytes(),
                    target=default_target())
