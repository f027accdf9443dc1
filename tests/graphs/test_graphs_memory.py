"""Repeated capture/release cycles must not grow memory."""

from __future__ import annotations

import pytest
import torch
from memory_support import assert_no_growth

from draftgraph.graphs import GraphCaptureManager

psutil = pytest.importorskip("psutil")

# A long warm-up: in a process that already ran other tests, malloc arenas keep growing for
# the first ~150 cycles, then stay flat (measured); two windows of 100 cycles are then fitted.
WARMUP_CYCLES, WINDOW = 150, 100


def _step(x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [B, 64], ids [B, 8] -> (softmax(x) [B, 64], gathered ids [B, 2])."""
    p = torch.softmax(x, dim=-1)
    _, i = torch.topk(p[:, :8], 2, dim=-1)
    return p, torch.gather(ids, 1, i)


def _cycle(manager: GraphCaptureManager, batch: dict[str, torch.Tensor]) -> None:
    manager.capture()
    manager.run(batch)
    manager.release()


@pytest.mark.slow  # the slow tier: capture and release cycles, a soak of the graph pool
def test_capture_release_cycles_keep_rss_flat() -> None:
    """Bound: 4 KB per capture-and-release cycle (one leaked recording of the two sizes, its FX
    source and graph, is tens of KB), plus a noise floor of 1 MB per window (one allocator arena
    step, 10 KB per cycle spread over the window)."""
    static = {"x": torch.zeros(8, 64), "ids": torch.zeros(8, 8, dtype=torch.long)}
    manager = GraphCaptureManager(_step, static, [4, 8], backend="trace")
    batch = {"x": torch.randn(3, 64), "ids": torch.randint(0, 9, (3, 8))}
    assert_no_growth(lambda i: _cycle(manager, batch), warmup=WARMUP_CYCLES, window=WINDOW, every=10,
                     per_cycle=4 * 1024, noise_floor=2**20, unit="capture and release")
    assert manager.stats.captures == WARMUP_CYCLES + 2 * WINDOW and not manager.is_captured


def test_release_frees_fx_generated_sources() -> None:
    """FX keeps every GraphModule's generated source forever; release must drop ours."""
    import torch.fx.graph_module as fx_gm

    cache = getattr(getattr(fx_gm, "_loader", None), "eval_cache", None)
    if not isinstance(cache, dict):
        pytest.skip("this torch has no FX eval cache to leak into")
    static = {"x": torch.zeros(8, 64), "ids": torch.zeros(8, 8, dtype=torch.long)}
    manager = GraphCaptureManager(_step, static, [2, 4, 8], backend="trace")
    batch = {"x": torch.randn(3, 64), "ids": torch.randint(0, 9, (3, 8))}
    before = set(cache)  # keys: other managers (earlier tests' engines) may drop theirs meanwhile
    manager.capture()
    ours = set(cache) - before
    assert ours  # the capture did register sources
    manager.run(batch)
    manager.release()
    assert not ours & set(cache), f"{len(ours & set(cache))} of {len(ours)} sources left after release"
