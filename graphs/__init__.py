"""draftgraph.graphs: generic graph capture (backends, manager, batch sizes, padding, spans, stats).

Knows nothing about speculative decoding; ``draftgraph.runtime`` builds on it.
"""

from __future__ import annotations

from .backends import BACKEND_NAMES, Capabilities, capabilities, resolve_backend
from .core.errors import GraphCaptureError, GraphDebugError
from .core.protocol import CapturedGraph, GraphBackend
from .debug import DEFAULT_DEBUG_EVERY, DebugConfig
from .manager import MISS_REASONS, GraphCaptureManager, Miss
from .replay import ReplayPlan, StepOutput
from .sizes import (
    DEFAULT_MAX_BS,
    capture_batch_sizes,
    grid_sizes,
    padded_size,
    padding_table,
)
from .spans import (
    NVTX_DOMAIN,
    disable_nvtx,
    enable_nvtx,
    nvtx_available,
    nvtx_enabled,
    record_spans,
    span,
    spans_active,
    suppress_spans,
    trace_spans,
)
from .stats import CaptureRecord, ManagerStats, ReplayCounters, SizeStats, SizeUsage

__all__ = [
    "BACKEND_NAMES",
    "Capabilities",
    "CaptureRecord",
    "CapturedGraph",
    "DEFAULT_DEBUG_EVERY",
    "DEFAULT_MAX_BS",
    "DebugConfig",
    "GraphBackend",
    "GraphCaptureError",
    "GraphCaptureManager",
    "GraphDebugError",
    "MISS_REASONS",
    "ManagerStats",
    "Miss",
    "NVTX_DOMAIN",
    "ReplayCounters",
    "ReplayPlan",
    "SizeStats",
    "SizeUsage",
    "StepOutput",
    "capabilities",
    "capture_batch_sizes",
    "disable_nvtx",
    "enable_nvtx",
    "grid_sizes",
    "nvtx_available",
    "nvtx_enabled",
    "padded_size",
    "padding_table",
    "record_spans",
    "resolve_backend",
    "span",
    "spans_active",
    "suppress_spans",
    "trace_spans",
]
