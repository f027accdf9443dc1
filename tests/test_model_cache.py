"""The default models' weight cache: a damaged file is named, deleted and trained again."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from draftgraph.runtime.models import defaults
from draftgraph.runtime.models.training import TrainPlan

# the smallest plan that trains every model once: seconds, not minutes (its own cache key)
TINY = TrainPlan(target_steps=1, target_batch=1, target_seq=16, distill_prompts=1, distill_prompt_len=8,
                 distill_new=2, eagle_steps=1, multi_layer_steps=1, draft_batch=1)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("DRAFTGRAPH_CACHE", str(tmp_path))
    defaults._weights.cache_clear()
    yield tmp_path
    defaults._weights.cache_clear()


def _one_file(folder: Path) -> Path:
    (path,) = folder.glob("models-*.pt")
    return path


def test_truncated_cache_file_is_reported_deleted_and_retrained(cache, caplog):
    defaults.default_models(plan=TINY)
    path = _one_file(cache)
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])  # a copy cut short
    defaults._weights.cache_clear()
    with caplog.at_level(logging.WARNING, logger=defaults.__name__):
        target, draft = defaults.default_models(plan=TINY)
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert str(path) in record.getMessage() and "damaged" in record.getMessage()
    assert _one_file(cache) == path and path.stat().st_size == len(raw)  # trained and cached again
    assert isinstance(target, torch.nn.Module) and isinstance(draft, torch.nn.Module)


@pytest.mark.parametrize("damage", ["empty", "cut_short", "cut_at_end", "garbage", "wrong_content"])
def test_load_cached_detects_damage(damage, tmp_path, caplog):
    path = tmp_path / "models-x.pt"
    torch.save({"target": {"w": torch.ones(64)}, "eagle": {}, "multi_layer": {}}, path)
    raw = path.read_bytes()
    assert defaults._load_cached(path) is not None  # the intact file loads
    content = {"empty": b"", "cut_short": raw[: len(raw) // 2], "cut_at_end": raw[:-10],
               "garbage": b"not a model " * 50}.get(damage)
    if content is None:
        torch.save({"target": {}}, path)  # a readable file without the drafts' weights
    else:
        path.write_bytes(content)
    with caplog.at_level(logging.WARNING, logger=defaults.__name__):
        assert defaults._load_cached(path) is None
    assert not path.exists()
    assert any(str(path) in r.getMessage() and "damaged" in r.getMessage() for r in caplog.records)
    assert "Traceback" not in caplog.text


def test_damaged_file_that_cannot_be_deleted_says_what_to_do(tmp_path, monkeypatch):
    path = tmp_path / "models-x.pt"
    path.write_bytes(b"")

    def refuse(self, missing_ok=False):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "unlink", refuse)
    with pytest.raises(OSError, match="delete it by hand") as info:
        defaults._load_cached(path)
    assert str(path) in str(info.value) and "damaged" in str(info.value)
