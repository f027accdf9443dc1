"""The ``DRAFTGRAPH_*`` settings: read when asked, typed, junk named, shown by ``draftgraph info``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftgraph.graphs.core import settings as graph_settings
from draftgraph.runtime import settings


def test_every_variable_is_read_when_asked_not_at_import(monkeypatch, tmp_path):
    first = settings.read_settings()
    monkeypatch.setenv("DRAFTGRAPH_CACHE", str(tmp_path))
    monkeypatch.setenv("DRAFTGRAPH_COMPILED_MAX_MB", "64")
    monkeypatch.setenv("DRAFTGRAPH_COMPILE_SYMBOLIC", "0")
    monkeypatch.setenv("DRAFTGRAPH_COMPILE_PROCESS", "0")
    monkeypatch.setenv("DRAFTGRAPH_DEBUG_EVERY", "3")
    now = settings.read_settings()
    assert now != first
    assert now.compiled_max_bytes == 64 << 20 and now.compiled_dir == tmp_path / "compiled"
    assert now.graphs.cache == tmp_path and now.graphs.compile_symbolic is False and now.graphs.debug_every == 3
    assert now.compile_process is False
    monkeypatch.setenv("DRAFTGRAPH_COMPILED_DIR", str(tmp_path / "own"))
    assert settings.compiled_dir() == tmp_path / "own"


@pytest.mark.parametrize("name,value,reader", [
    ("DRAFTGRAPH_COMPILED_MAX_MB", "nan", settings.compiled_max_bytes),
    ("DRAFTGRAPH_COMPILE_SYMBOLIC", "2", graph_settings.compile_symbolic),
    ("DRAFTGRAPH_TRACE_REPLAY", "onnx", graph_settings.trace_replay),
    ("DRAFTGRAPH_DEBUG", "maybe", graph_settings.debug_enabled),
    ("DRAFTGRAPH_DEBUG_EVERY", "0", graph_settings.debug_every),
])
def test_junk_is_refused_naming_the_variable(monkeypatch, name, value, reader):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=name):
        reader()
    with pytest.raises(ValueError, match=name):
        settings.read_settings()


def test_info_shows_the_settings(monkeypatch, capsys, tmp_path):
    from draftgraph.runtime.commands import cli

    monkeypatch.setenv("DRAFTGRAPH_COMPILED_DIR", str(tmp_path))
    assert cli.main(["info", "--backend", "eager"]) == 0
    shown = json.loads(capsys.readouterr().out)["settings"]
    assert shown == settings.read_settings().as_dict()
    assert Path(shown["compiled_dir"]) == tmp_path and "compile_symbolic" in shown["graphs"]


@pytest.mark.parametrize("value,on", [("off", False), ("no", False), ("OFF", False), ("0", False), ("", False),
                                      ("on", True), ("yes", True), ("1", True), ("True", True)])
def test_debug_has_one_parser_for_graph_and_draft_checks(monkeypatch, value, on):
    """DRAFTGRAPH_DEBUG=off switches the draft checks off as it does the graph checks (issue 50)."""
    monkeypatch.setenv("DRAFTGRAPH_DEBUG", value)
    assert graph_settings.debug_enabled() is on
    assert settings.draft_checks() is on
    shown = settings.read_settings()
    assert shown.draft_checks is on and shown.graphs.debug is on
