"""Shared default models and greedy references for the engine tests (trained once, cached)."""

from __future__ import annotations

from functools import lru_cache

from draftgraph.runtime.models import default_models, greedy_generate
from draftgraph.runtime.models.corpus import held_out_prompts

MAX_NEW = 24


@lru_cache(maxsize=2)
def models(draft: str = "eagle"):
    return default_models(seed=0, draft=draft)


@lru_cache(maxsize=1)
def prompts() -> tuple[tuple[int, ...], ...]:
    """16 held-out prompts of varied lengths (8..96 bytes)."""
    return tuple(tuple(p) for p in held_out_prompts(16, seed=5, min_len=8, max_len=96))


@lru_cache(maxsize=1)
def reference() -> list[list[int]]:
    target, _ = models()
    return greedy_generate(target, [list(p) for p in prompts()], MAX_NEW)
