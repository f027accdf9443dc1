"""Fixtures of the models wing: an empty weight cache (test_model_cache, test_default_checkpoints)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty ``DRAFTGRAPH_CACHE`` folder for the test, the default models' memo cleared around it."""
    from draftgraph.runtime.models import defaults

    monkeypatch.setenv("DRAFTGRAPH_CACHE", str(tmp_path))
    defaults._weights.cache_clear()
    yield tmp_path
    defaults._weights.cache_clear()
