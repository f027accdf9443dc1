"""draftgraph.runtime.engine.profiling: profiled / profile_run write a Chrome trace holding the
spans run inside and count them per span name; scripts/profile_session.py uses the same."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import time

import pytest
import torch

from draftgraph.graphs import span
from draftgraph.runtime.engine.profiling import profile_run, profiled

_SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "profile_session.py"


def test_profile_run_writes_a_trace_with_the_spans(tmp_path) -> None:
    def step(i: int) -> torch.Tensor:
        with span("replay", bs=i + 1, padded=4):
            return torch.ones(4) * i

    start = time.perf_counter()
    summary = profile_run(step, 3, str(tmp_path / "out"))
    elapsed = time.perf_counter() - start
    doc = json.loads(pathlib.Path(summary["trace"]).read_text())
    names = {e.get("name") for e in doc["traceEvents"]}
    assert {"replay[bs=1,padded=4]", "replay[bs=3,padded=4]"} <= names
    assert summary["spans"] == {"replay": 3} and summary["steps"] == 3
    assert summary["trace"] == str(tmp_path / "out" / "trace.json")
    assert 0 < summary["wall_s"] <= elapsed  # the run's own seconds, inside the call's


def test_profile_run_rejects_bad_steps(tmp_path) -> None:
    with pytest.raises(ValueError, match="steps=0"):
        profile_run(lambda i: None, 0, str(tmp_path))
    with pytest.raises(ValueError, match="steps=True"):
        profile_run(lambda i: None, True, str(tmp_path))


def test_profiled_counts_the_spans_run_inside_and_writes_json(tmp_path) -> None:
    with span("eager_fallback", bs=9):  # before: not profiled, not counted
        pass
    with profiled(tmp_path / "p") as summary:
        for b in (1, 2):
            with span("organize_fast", bs=b):
                with span("eager_fallback", bs=b):
                    torch.zeros(2).add_(1)
        with span("eager_fallback", bs=5):
            pass
        with torch.profiler.record_function("not_a_span"):  # a plain range: not a span
            pass
        assert "spans" not in summary  # filled at exit
    assert summary["spans"] == {"eager_fallback": 3, "organize_fast": 2}
    doc = json.loads((tmp_path / "p" / "trace.json").read_text())
    names = [e.get("name") for e in doc["traceEvents"]]
    assert names.count("organize_fast[bs=2]") == 1 and "eager_fallback[bs=5]" in names
    assert "eager_fallback[bs=9]" not in names and "not_a_span" in names


def test_profiled_rejects_an_empty_dir() -> None:
    with pytest.raises(ValueError, match="out_dir=''"):
        with profiled(""):
            pass


def test_script_profiles_the_tiny_worker(tmp_path, capsys) -> None:
    spec = importlib.util.spec_from_file_location("profile_session", _SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    summary = mod.main([str(tmp_path), "--steps", "4", "--max-bs", "2"])
    # batch sizes 1, 3, 2, 4 with graphs up to 2: 1 and 2 replay, 3 and 4 fall back to eager
    assert summary["spans"]["replay"] == 2 and summary["spans"]["eager_fallback"] == 2
    assert json.loads(pathlib.Path(summary["trace"]).read_text())["traceEvents"]
    assert "ui.perfetto.dev" in capsys.readouterr().out
