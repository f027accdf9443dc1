"""Repeated capture/release cycles must not grow memory."""

from __future__ import annotations

import gc

import pytest
import torch

from draftgraph.graphs import GraphCaptureManager

psutil = pytest.importorskip("psutil")

# A long warm-up: in a process that already ran other tests, malloc arenas keep growing for
# the first ~150 cycles, then stay flat (measured); the 200 measured cycles must add nothing.
WARMUP_CYCLES, CYCLES = 150, 200
MAX_GROWTH_BYTES = 10 * 2**20


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
    static = {"x": torch.zeros(8, 64), "ids": torch.zeros(8, 8, dtype=torch.long)}
    manager = GraphCaptureManager(_step, static, [4, 8], backend="trace")
    batch = {"x": torch.randn(3, 64), "ids": torch.randint(0, 9, (3, 8))}
    process = psutil.Process()
    for _ in range(WARMUP_CYCLES):
        _cycle(manager, batch)
    gc.collect()
    baseline = process.memory_info().rss
    for _ in range(CYCLES):
        _cycle(manager, batch)
    gc.collect()
    growth = process.memory_info().rss - baseline
    assert growth < MAX_GROWTH_BYTES, f"RSS grew {growth / 2**20:.1f} MiB over {CYCLES} cycles"
    assert manager.stats.captures == WARMUP_CYCLES + CYCLES and not manager.is_captured


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
