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


def test_flipped_byte_is_detected_named_and_retrained(cache, caplog):
    defaults.default_models(plan=TINY)
    path = _one_file(cache)
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # same size, one byte flipped (a torn sector, a bad copy)
    path.write_bytes(bytes(raw))
    defaults._weights.cache_clear()
    with caplog.at_level(logging.WARNING, logger=defaults.__name__):
        defaults.default_models(plan=TINY)
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert str(path) in record.getMessage() and "damaged" in record.getMessage()
    assert "digest" in record.getMessage()
    assert path.read_bytes() != bytes(raw) and defaults._load_cached(path) is not None  # trained again


def test_file_without_digest_is_accepted_once_and_digest_added(tmp_path):
    path = tmp_path / "models-x.pt"
    torch.save({"target": {"w": torch.ones(4)}, "eagle": {}, "multi_layer": {}}, path)  # previous version
    assert defaults._load_cached(path) is not None
    digest = defaults._digest_path(path)
    assert digest.read_text().strip() == defaults._file_digest(path)


def _unwritable(monkeypatch, folder: Path) -> None:
    """Simulate a read-only folder (chmod does not stop root): os.access says no for it."""
    real = defaults.os.access
    monkeypatch.setattr(defaults.os, "access",
                        lambda p, mode, **kw: False if Path(p) == folder else real(p, mode, **kw))


def test_read_only_folder_with_weights_is_served_without_writing(cache, monkeypatch):
    defaults.default_models(plan=TINY)
    for lock in cache.glob("*.lock"):
        lock.unlink()
    before = sorted(p.name for p in cache.iterdir())
    defaults._weights.cache_clear()
    _unwritable(monkeypatch, cache)
    monkeypatch.setattr(defaults, "_train_all", lambda *a: pytest.fail("trained instead of loading"))
    monkeypatch.setattr(defaults, "_file_lock", lambda *a: pytest.fail("took a lock in a read-only folder"))
    defaults.default_models(plan=TINY)
    assert sorted(p.name for p in cache.iterdir()) == before


def test_unwritable_empty_folder_falls_back_with_one_warning(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("DRAFTGRAPH_CACHE", str(blocker / "cache"))  # mkdir under a regular file fails
    fallback = tmp_path / "fallback"
    monkeypatch.setattr(defaults, "_fallback_dir", lambda: fallback)
    defaults._weights.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger=defaults.__name__):
            defaults.default_models(plan=TINY)
    finally:
        defaults._weights.cache_clear()
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "DRAFTGRAPH_CACHE" in record.getMessage() and str(fallback) in record.getMessage()
    assert _one_file(fallback).exists()


def test_fallback_folder_is_per_user():
    assert str(defaults.os.getuid()) in defaults._fallback_dir().name


def test_next_save_removes_leftover_tmp_of_this_cache_only(cache):
    key = "0123456789abcdef"
    left = [cache / f"models-{key}.tmp999999", cache / f"models-{key}.pt.sha256.tmp999999"]
    other = [cache / "models-fedcba9876543210.tmp999999", cache / "notes.tmp1"]
    for p in left + other:
        p.write_bytes(b"half a save")
    defaults._save({"target": {}, "eagle": {}, "multi_layer": {}}, cache / f"models-{key}.pt", key)
    assert not any(p.exists() for p in left)
    assert all(p.exists() for p in other)  # another key's save (its own lock) and foreign files stay
    assert defaults._load_cached(cache / f"models-{key}.pt") is not None
