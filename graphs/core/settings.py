"""The ``DRAFTGRAPH_*`` environment variables graphs/ reads: the only place in graphs/ that reads them.

Each variable has one reader here, called when its value is needed (never at import time, so
a test or a command may set the variable first); a junk value raises ValueError naming the
variable, where it is read, as before. `GraphSettings.read` reads them all at once, typed, for
a report (`draftgraph info`). The runtime's own variables live in `draftgraph.runtime.settings`,
which shows these too (graphs/ imports nothing from runtime/, so the layer below keeps its own).

| variable | type, default | what |
| --- | --- | --- |
| ``DRAFTGRAPH_DEBUG`` | bool, off | replay checks of every manager (`debug.DebugConfig`) |
| ``DRAFTGRAPH_DEBUG_EVERY`` | int >= 1, 16 | every how many replays the eager comparison runs |
| ``DRAFTGRAPH_NVTX`` | bool, off | NVTX ranges for spans (read by the commands and `spans.nvtx_from_env`) |
| ``DRAFTGRAPH_TRACE_REPLAY`` | "fx" / "jit", "fx" | how the trace backend replays |
| ``DRAFTGRAPH_COMPILE_SYMBOLIC`` | "0" / "1", "1" | one compile per step with a symbolic batch dimension |
| ``DRAFTGRAPH_CACHE`` | folder, ``~/.cache/draftgraph`` | trained models, compiled code, inductor's cache |
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["GraphSettings", "cache_root", "compile_symbolic", "debug_enabled", "debug_every", "nvtx_requested",
           "trace_replay"]

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})
DEFAULT_DEBUG_EVERY = 16


def debug_enabled() -> bool:
    """``DRAFTGRAPH_DEBUG`` as a bool (1/true/yes/on, 0/false/no/off or unset); ValueError on junk."""
    raw = os.environ.get("DRAFTGRAPH_DEBUG", "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ValueError(f"DRAFTGRAPH_DEBUG={raw!r}: must be one of 1/0, true/false, yes/no, on/off")


def debug_every() -> int:
    """``DRAFTGRAPH_DEBUG_EVERY`` (an int >= 1; default `DEFAULT_DEBUG_EVERY`)."""
    raw = os.environ.get("DRAFTGRAPH_DEBUG_EVERY", "").strip()
    try:
        every = int(raw) if raw else DEFAULT_DEBUG_EVERY
    except ValueError:
        raise ValueError(f"DRAFTGRAPH_DEBUG_EVERY={raw!r}: must be an int >= 1") from None
    if every < 1:
        raise ValueError(f"DRAFTGRAPH_DEBUG_EVERY={every!r}: must be an int >= 1")  # as debug._check_every says
    return every


def nvtx_requested() -> bool:
    """``DRAFTGRAPH_NVTX`` is 1, true, yes or on (anything else: off)."""
    return os.environ.get("DRAFTGRAPH_NVTX", "").strip().lower() in _TRUE


def trace_replay() -> str:
    """``DRAFTGRAPH_TRACE_REPLAY``: "fx" (default) or "jit"; ValueError otherwise."""
    value = os.environ.get("DRAFTGRAPH_TRACE_REPLAY", "fx").strip().lower() or "fx"
    if value not in ("fx", "jit"):
        raise ValueError(f"DRAFTGRAPH_TRACE_REPLAY={value!r}: must be 'fx' or 'jit'")
    return value


def compile_symbolic() -> bool:
    """``DRAFTGRAPH_COMPILE_SYMBOLIC`` ("1"/"0", default "1") as a bool (ValueError otherwise)."""
    value = os.environ.get("DRAFTGRAPH_COMPILE_SYMBOLIC", "1").strip() or "1"
    if value not in ("0", "1"):
        raise ValueError(f"DRAFTGRAPH_COMPILE_SYMBOLIC={value!r}: must be '0' or '1'")
    return value == "1"


def cache_root(expand: bool = False) -> Path:
    """``$DRAFTGRAPH_CACHE`` (``~`` expanded when ``expand``), else ``~/.cache/draftgraph``."""
    env = os.environ.get("DRAFTGRAPH_CACHE", "")
    if not env:
        return Path.home() / ".cache" / "draftgraph"
    return Path(env).expanduser() if expand else Path(env)


@dataclass(frozen=True)
class GraphSettings:
    """Every variable graphs/ reads, read once by `read` (see the module docstring)."""

    debug: bool
    debug_every: int
    nvtx: bool
    trace_replay: str
    compile_symbolic: bool
    cache: Path

    @classmethod
    def read(cls) -> GraphSettings:
        """All of them now (ValueError naming the first junk value)."""
        return cls(debug=debug_enabled(), debug_every=debug_every(), nvtx=nvtx_requested(),
                   trace_replay=trace_replay(), compile_symbolic=compile_symbolic(), cache=cache_root(expand=True))

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (the folder as a string)."""
        return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}
