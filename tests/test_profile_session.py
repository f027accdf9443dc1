"""scripts/profile_session.py: profile_run writes a Chrome trace holding the spans it ran."""

from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest
import torch

from draftgraph.graphs import span

_PATH = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "profile_session.py"


def _module():
    spec = importlib.util.spec_from_file_location("profile_session", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_profile_run_writes_a_trace_with_the_spans(tmp_path) -> None:
    def step(i: int) -> torch.Tensor:
        with span("replay", bs=i + 1, padded=4):
            return torch.ones(4) * i

    summary = _module().profile_run(step, 3, str(tmp_path / "out"))
    doc = json.loads(pathlib.Path(summary["trace"]).read_text())
    names = {e.get("name") for e in doc["traceEvents"]}
    assert {"replay[bs=1,padded=4]", "replay[bs=3,padded=4]"} <= names
    assert summary["spans"] == {"replay": 3} and summary["steps"] == 3


def test_profile_run_rejects_bad_steps(tmp_path) -> None:
    with pytest.raises(ValueError, match="steps=0"):
        _module().profile_run(lambda i: None, 0, str(tmp_path))
