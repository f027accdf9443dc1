"""The compiled target-only baseline of bench_step_graphs (scripts/greedy_compiled.py): its
outputs equal plain greedy decoding, across attention tiers, and a length past the largest
tier is refused."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest
from engine_support import models, prompts

from draftgraph.runtime.models import greedy_generate

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location("greedy_compiled", ROOT / "scripts" / "greedy_compiled.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_default_tiers_end_at_max_len() -> None:
    assert _module().default_tiers(512) == (64, 128, 256, 512)
    assert _module().default_tiers(100, smallest=32) == (32, 64, 100)


@pytest.mark.parametrize("b", [1, 3])
def test_the_decode_loop_equals_greedy_across_tiers(b) -> None:
    """Small tiers so every request crosses several (compile backend "eager": the loop, the
    tiers and the masks, without inductor)."""
    target, _ = models()
    ps = [list(p) for p in prompts()[:b]]
    cg = _module().CompiledGreedy(target, tiers=(16, 32, 64, 128, 256, 512), compile_backend="eager")
    assert cg.generate(ps, 40) == greedy_generate(target, ps, 40)
    assert cg.generate(ps, 1) == greedy_generate(target, ps, 1)


def test_a_length_past_the_largest_tier_is_refused() -> None:
    target, _ = models()
    cg = _module().CompiledGreedy(target, tiers=(64,), compile_backend="eager")
    with pytest.raises(ValueError, match="past the largest tier 64"):
        cg.generate([[1] * 60], 8)
    with pytest.raises(ValueError, match="tiers="):
        _module().CompiledGreedy(target, tiers=(64, 32))


@pytest.mark.slow  # inductor compiles (seconds each)
def test_the_inductor_step_equals_greedy() -> None:
    target, _ = models()
    ps = [list(p) for p in prompts()[:4]]
    cg = _module().CompiledGreedy(target, tiers=(64, 128, 512))
    assert cg.generate(ps, 48) == greedy_generate(target, ps, 48)
