"""Debug mode: moved static inputs and graph/eager mismatches are detected at replay."""

from __future__ import annotations

import pytest
import torch

from draftgraph.graphs import DebugConfig, GraphCaptureManager, GraphDebugError

# A module-level Python value the step reads: capture bakes it, eager does not.
SCALE = {"value": 2.0}


def scaled_step(x: torch.Tensor) -> torch.Tensor:
    """x [B, 3] -> x * SCALE (a Python float baked into the graph)."""
    return x * SCALE["value"]


@pytest.fixture(autouse=True)
def _reset_scale():
    SCALE["value"] = 2.0
    yield
    SCALE["value"] = 2.0


def _manager(**kwargs) -> GraphCaptureManager:
    m = GraphCaptureManager(scaled_step, {"x": torch.zeros(4, 3)}, [2, 4], backend="trace", **kwargs)
    m.capture()
    return m


def test_rebound_static_input_is_detected() -> None:
    m = _manager(debug=True, debug_every=1000)
    m.run({"x": torch.ones(2, 3)})
    m.static_inputs["x"].set_(torch.zeros(4, 3))  # replaced storage: the graph still reads the old one
    with pytest.raises(GraphDebugError, match="'x'.*data_ptr"):
        m.run({"x": torch.ones(2, 3)})


def test_static_inputs_mapping_cannot_be_rebound() -> None:
    m = _manager()
    with pytest.raises(TypeError):
        m.static_inputs["x"] = torch.zeros(4, 3)  # type: ignore[index]


def test_baked_python_value_mismatch_is_detected() -> None:
    m = _manager(debug=True, debug_every=1)
    assert torch.equal(m.run({"x": torch.ones(3, 3)}), torch.full((3, 3), 2.0))
    SCALE["value"] = 3.0
    with pytest.raises(GraphDebugError, match="size 4: output 0"):
        m.run({"x": torch.ones(3, 3)})


def test_comparison_runs_every_nth_replay() -> None:
    m = _manager(debug=True, debug_every=3)
    SCALE["value"] = 5.0
    m.run({"x": torch.ones(1, 3)})
    m.run({"x": torch.ones(1, 3)})
    assert m.stats.debug_checks == 0
    with pytest.raises(GraphDebugError):
        m.run({"x": torch.ones(1, 3)})


def test_debug_off_checks_nothing() -> None:
    m = _manager(debug=False)
    SCALE["value"] = 5.0
    m.static_inputs["x"].set_(torch.zeros(4, 3))
    m.run({"x": torch.ones(1, 3)})
    assert m.stats.debug_checks == 0


def test_environment_switches(monkeypatch) -> None:
    monkeypatch.setenv("DRAFTGRAPH_DEBUG", "1")
    monkeypatch.setenv("DRAFTGRAPH_DEBUG_EVERY", "3")
    assert _manager().debug == DebugConfig(enabled=True, every=3)
    assert _manager(debug=False, debug_every=7).debug == DebugConfig(enabled=False, every=7)
    monkeypatch.setenv("DRAFTGRAPH_DEBUG_EVERY", "often")
    with pytest.raises(ValueError, match="DRAFTGRAPH_DEBUG_EVERY"):
        _manager()
    monkeypatch.delenv("DRAFTGRAPH_DEBUG_EVERY")
    monkeypatch.setenv("DRAFTGRAPH_DEBUG", "maybe")
    with pytest.raises(ValueError, match="DRAFTGRAPH_DEBUG"):
        _manager()
    monkeypatch.setenv("DRAFTGRAPH_DEBUG", "0")
    assert _manager().debug == DebugConfig()
