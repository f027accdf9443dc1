"""The ground every graph backend stands on, below graphs/ and graphs/compile/ alike.

Its rooms: `protocol` (what a backend and its captured graph are), `errors`, `cancel` (stopping
a recording thread), `hostsync` (host syncs refused while recording), `settings` (the
``DRAFTGRAPH_*`` variables graphs/ reads), `backend_trace` (the trace backend: the recording the
compile backend builds on), `aten_reductions` and `graph_wire` (a recorded graph kept exact and
sent to a compile process). It imports nothing else of draftgraph: graphs/ (the registry, the
manager) builds on it and on graphs/compile/, which builds on it too, so folders run one way.

The face: the names the other folders use most, each defined in the module named beside it.
"""

from .backend_trace import TraceBackend, TraceGraph
from .cancel import CaptureCancelled, cancel_scope
from .errors import GraphCaptureError, GraphDebugError
from .hostsync import HostSyncGuard
from .protocol import CapturedGraph, CompilesNothing, FlatStep, GraphBackend
from .settings import GraphSettings, cache_root, debug_enabled

__all__ = ["CaptureCancelled", "CapturedGraph", "CompilesNothing", "FlatStep", "GraphBackend", "GraphCaptureError",
           "GraphDebugError", "GraphSettings", "HostSyncGuard", "TraceBackend", "TraceGraph", "cache_root",
           "cancel_scope", "debug_enabled"]
