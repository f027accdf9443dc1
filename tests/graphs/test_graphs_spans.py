"""Spans: recorder contents, torch-profiler ranges, NVTX switch and the shared null context."""

from __future__ import annotations

import contextlib

import torch

from draftgraph.graphs import (
    GraphCaptureManager,
    disable_nvtx,
    enable_nvtx,
    nvtx_enabled,
    record_spans,
    span,
)
from draftgraph.graphs import spans as spans_module


def _manager() -> GraphCaptureManager:
    m = GraphCaptureManager(lambda x: x + 1, {"x": torch.zeros(4, 2)}, [2, 4], backend="trace")
    return m


def test_disabled_span_is_the_shared_null_context(nvtx_off) -> None:
    first, second = span("a"), span("b", bs=3)
    assert first is second
    assert isinstance(first, contextlib.nullcontext)
    with first:
        pass


def test_recorder_sees_manager_spans_with_attributes(nvtx_off) -> None:
    m = _manager()
    with record_spans() as records:
        m.capture()
        m.run({"x": torch.ones(3, 2)})
        m.run({"x": torch.ones(6, 2)})
    assert records == [
        ("warmup", {"size": 4, "backend": "trace"}),
        ("capture", {"size": 4, "backend": "trace"}),
        ("capture", {"size": 2, "backend": "trace"}),
        ("replay", {"bs": 3, "padded": 4}),
        ("eager_fallback", {"bs": 6}),
    ]
    assert span("after") is span("recorder-gone")


def test_nested_recorders_both_receive_and_unwind(nvtx_off) -> None:
    with record_spans() as outer:
        with record_spans() as inner, span("x", k=1):
            pass
        with span("y"):
            pass
    assert inner == [("x", {"k": 1})]
    assert outer == [("x", {"k": 1}), ("y", {})]


def test_spans_show_up_in_a_torch_profiler_trace(nvtx_off) -> None:
    m = _manager()
    m.capture()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        m.run({"x": torch.ones(3, 2)})
        with span("custom_stage", step=1):
            pass
    names = {event.key for event in prof.key_averages()}
    assert "replay[bs=3,padded=4]" in names
    assert "custom_stage[step=1]" in names


def test_nvtx_switch_and_missing_package(nvtx_off, monkeypatch) -> None:
    if spans_module.nvtx_available():
        assert enable_nvtx() is True and nvtx_enabled()
        with span("ranged", bs=2):
            pass
        assert span("a") is not span("a")
        disable_nvtx()
    assert not nvtx_enabled()
    monkeypatch.setattr(spans_module, "_nvtx", None)
    assert spans_module.nvtx_available() is False
    assert enable_nvtx() is False and not nvtx_enabled()
    with span("still-works"):
        pass


def _step_with_inner_span(x: torch.Tensor) -> torch.Tensor:
    with span("inner", bs=x.shape[0]):
        return x * 2


def test_spans_inside_a_captured_step_are_not_recorded_into_the_graph(nvtx_off) -> None:
    from draftgraph.graphs import GraphCaptureManager

    plain = GraphCaptureManager(_step_with_inner_span, {"x": torch.zeros(4, 3)}, [2, 4], backend="trace")
    plain.capture()
    profiled = GraphCaptureManager(_step_with_inner_span, {"x": torch.zeros(4, 3)}, [2, 4], backend="trace")
    with record_spans() as spans, torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        profiled.capture()
        out = profiled.run({"x": torch.ones(3, 3)})
    assert profiled.node_count(4) == plain.node_count(4) == 1
    assert torch.equal(out, torch.full((3, 3), 2.0))
    names = [n for n, _ in spans]
    assert names.count("inner") == 1  # the eager warm-up only, not the two captures
    assert "capture" in names and "replay" in names
