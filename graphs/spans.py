"""One span helper for host-side stages: NVTX range, torch-profiler range, test recorder, or nothing.

``span(name, **attrs)`` returns a context manager. With NVTX off, no profiler running
and no recorder active it returns one shared ``contextlib.nullcontext()`` instance, so
a disabled span costs a flag test and a call (well under 1 µs). Ranges opened inside a
captured region are not part of the graph and do not replay: put spans around host
work (capture, replay, eager fallback), not inside captured steps.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from types import TracebackType
from typing import Any

import torch

from .core.settings import nvtx_requested

try:  # the NVTX package is optional at run time; without it NVTX stays off
    import nvtx as _nvtx
except ImportError:  # pragma: no cover - depends on the environment
    _nvtx = None

__all__ = [
    "NVTX_DOMAIN",
    "disable_nvtx",
    "enable_nvtx",
    "nvtx_available",
    "nvtx_enabled",
    "record_spans",
    "span",
    "span_label",
    "spans_active",
    "suppress_spans",
    "trace_spans",
]

logger = logging.getLogger(__name__)

NVTX_DOMAIN = "draftgraph"
"""The NVTX domain every draftgraph range is pushed in."""

SpanRecord = tuple[str, dict[str, Any]]
SpanEvent = dict[str, Any]
"""A finished span as a Chrome trace complete event: name (the label), ph "X", ts/dur in µs."""

_NULL_SPAN = contextlib.nullcontext()


def _profiler_flag() -> Any:
    """Cheapest available "is a torch profiler running" check."""
    flag = getattr(getattr(torch._C, "_autograd", None), "_profiler_enabled", None)  # noqa: SLF001  # torch's C API
    if callable(flag):
        return flag
    return lambda: bool(getattr(torch.autograd.profiler, "_is_profiler_enabled", False))


_profiler_enabled = _profiler_flag()


class _Switch:
    """The profiling switch: NVTX on/off, the cached domain and the active recorders."""

    __slots__ = ("active", "domain", "local", "nvtx", "recorders", "tracers")

    def __init__(self) -> None:
        self.nvtx = False
        self.domain: Any = None
        self.recorders: list[list[SpanRecord]] = []
        self.tracers: list[list[SpanEvent]] = []
        self.active = False
        self.local = threading.local()  # .suppressed: per thread (a background capture mutes only itself)

    @property
    def suppressed(self) -> int:
        """Nesting depth of `suppress_spans` in the calling thread."""
        return getattr(self.local, "suppressed", 0)

    def refresh(self) -> None:
        """Recompute the fast-path flag after a change."""
        self.active = self.nvtx or bool(self.recorders) or bool(self.tracers)


_SWITCH = _Switch()


def nvtx_available() -> bool:
    """True when the ``nvtx`` package is importable."""
    return _nvtx is not None


def enable_nvtx() -> bool:
    """Turn NVTX ranges on (domain "draftgraph"); returns False (and logs) when ``nvtx`` is missing."""
    if _nvtx is None:
        logger.warning("enable_nvtx(): the nvtx package is not installed; NVTX ranges stay off")
        return False
    if _SWITCH.domain is None:
        _SWITCH.domain = _nvtx.get_domain(NVTX_DOMAIN)
    _SWITCH.nvtx = True
    _SWITCH.refresh()
    return True


def disable_nvtx() -> None:
    """Turn NVTX ranges off."""
    _SWITCH.nvtx = False
    _SWITCH.refresh()


def nvtx_enabled() -> bool:
    """True while NVTX ranges are being emitted."""
    return _SWITCH.nvtx


def span_label(name: str, attrs: dict[str, Any]) -> str:
    """Range label: ``name`` or ``name[k=v,...]`` with attributes in call order."""
    if not attrs:
        return name
    return name + "[" + ",".join(f"{k}={v}" for k, v in attrs.items()) + "]"


class _Span:
    """An active span: recorder entry, NVTX push/pop and profiler range as switched on."""

    __slots__ = ("_attrs", "_name", "_nvtx", "_profiled", "_t0")

    def __init__(self, name: str, attrs: dict[str, Any]) -> None:
        self._name = name
        self._attrs = attrs
        self._nvtx = False
        self._profiled: Any = None
        self._t0 = 0

    def __enter__(self) -> None:
        for recorder in _SWITCH.recorders:
            recorder.append((self._name, dict(self._attrs)))
        label = span_label(self._name, self._attrs)
        if _SWITCH.nvtx:
            _SWITCH.domain.push_range(message=label)
            self._nvtx = True
        if _profiler_enabled():
            self._profiled = torch.profiler.record_function(label)
            self._profiled.__enter__()
        if _SWITCH.tracers:
            self._t0 = time.perf_counter_ns()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._t0:
            _trace_event(self._name, self._attrs, self._t0, time.perf_counter_ns())
            self._t0 = 0
        if self._profiled is not None:
            self._profiled.__exit__(exc_type, exc, tb)
            self._profiled = None
        if self._nvtx:
            _SWITCH.domain.pop_range()
            self._nvtx = False


def spans_active() -> bool:
    """True when a span would record anything (NVTX on, a recorder, or a torch profiler).

    For hot paths that want to skip even building a span's arguments when nobody listens.
    """
    return (_SWITCH.active or _profiler_enabled()) and not _SWITCH.suppressed


def span(name: str, **attrs: Any) -> contextlib.AbstractContextManager[Any]:
    """Context manager around a host-side stage; the shared null context when nothing listens
    or while a graph is being captured (see `suppress_spans`)."""
    if (_SWITCH.active or _profiler_enabled()) and not _SWITCH.suppressed:
        return _Span(name, attrs)
    return _NULL_SPAN


@contextlib.contextmanager
def suppress_spans() -> Iterator[None]:
    """No spans inside, in the calling thread: used around graph capture, where a range would not
    replay (cuda) or a profiler range would be recorded into the graph as ops (trace). Nests.
    Other threads keep their spans (a capture in the background does not mute serving)."""
    local = _SWITCH.local
    local.suppressed = getattr(local, "suppressed", 0) + 1
    try:
        yield
    finally:
        local.suppressed -= 1


@contextlib.contextmanager
def _listening(listeners: list[list[Any]], sink: list[Any]) -> Iterator[list[Any]]:
    """Attach ``sink`` to ``listeners`` (the switch's recorders or tracers) while active."""
    listeners.append(sink)
    _SWITCH.refresh()
    try:
        yield sink
    finally:
        # by identity: list.remove would match an equal (e.g. empty) outer sink
        listeners[:] = [x for x in listeners if x is not sink]
        _SWITCH.refresh()


def record_spans() -> contextlib.AbstractContextManager[list[SpanRecord]]:
    """Collect ``(name, attrs)`` of every span entered while active (even with NVTX/profiler off)."""
    return _listening(_SWITCH.recorders, [])


def _trace_event(name: str, attrs: dict[str, Any], t0: int, t1: int) -> None:
    """Append one complete event to every active tracer (times in µs of ``perf_counter``)."""
    event = {"name": span_label(name, attrs), "cat": "draftgraph", "ph": "X", "ts": t0 / 1e3,
             "dur": (t1 - t0) / 1e3, "pid": os.getpid(), "tid": threading.get_ident(),
             "args": {"span": name, **{k: str(v) for k, v in attrs.items()}}}
    for tracer in _SWITCH.tracers:
        tracer.append(event)


def trace_spans() -> contextlib.AbstractContextManager[list[SpanEvent]]:
    """Collect every span finished while active as a Chrome trace complete event (``name`` the
    label, ``cat`` "draftgraph", ``ts``/``dur`` in µs, ``args.span`` the bare name): draftgraph's
    ranges with no torch profiler and no aten ops, a few hundred bytes per span."""
    return _listening(_SWITCH.tracers, [])


# an opt-in switch at import, on purpose: a program run under nsys gets the ranges without a code
# change (`settings.nvtx_requested`; off unless the variable is set)
if nvtx_requested():
    enable_nvtx()
