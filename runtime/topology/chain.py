"""Chain (topk == 1): its constants under their historical names, and the chain fast path.

The chain is one static topology: `ChainBuffers(num_steps, capacity, device)` is
`TopologyBuffers` of the tree ((0,), (0, 0), ..): parents rows -1, 0, .., S-2 (width 0 when
S == 1) and score_indices rows 0, .., S-1, built like any static tree (see
`draftgraph.runtime.topology.buffers`). One chain-only path remains, on the hot path of organize:
`chain_fast_views` hands out row views of those constants when they fit the step (built for
this S, S columns, b within capacity) and None otherwise, when the caller organizes on the tree
path. `MultiLayerEagleDraftWorker` and the SGLang adapter use it.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from draftgraph.graphs import span, spans_active
from draftgraph.runtime.topology.buffers import TopologyBufferCache, TopologyBuffers, TopologyKey
from draftgraph.runtime.tree_choices import StaticTopology
from draftgraph.runtime.validation import require_positive_int

__all__ = ["ChainKey", "ChainBuffers", "ChainBufferCache", "chain_fast_views"]

ChainKey = TopologyKey
ChainBufferCache = TopologyBufferCache


class ChainBuffers(TopologyBuffers):
    """TopologyBuffers of the chain of ``num_steps`` (the same tensors a cache would build)."""

    __slots__ = ()

    def __init__(self, num_steps: int, capacity: int, device: str | torch.device = "cpu") -> None:
        require_positive_int("num_steps", num_steps)
        super().__init__(StaticTopology.chain(num_steps), capacity, device)


class ChainRows(Protocol):
    """What the fast path reads: `ChainBuffers`, or the SGLang adapter's set of adopted tensors."""

    num_steps: int
    capacity: int

    def view(self, bs: int) -> tuple[torch.Tensor, torch.Tensor]: ...


def chain_fast_views(buf: ChainRows | None, num_steps: int, width: int, b: int, counters: Any
                     ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The chain fast path: row views (parents [b, S-1 or 0], score_indices [b, S]) of ``buf``
    when it was built for ``num_steps`` = S, topk_index has S (``width``) columns and b is within
    its capacity (counted as a fast-path hit); else None, counting a capacity fallback when only
    b was too large. The ``organize_fast`` span is entered only when somebody listens, so the
    hot path skips even its arguments."""
    if buf is not None and buf.num_steps == num_steps == width and b <= buf.capacity:
        counters.fast_path_hits += 1
        if spans_active():
            with span("organize_fast", bs=b, num_steps=num_steps):
                return buf.view(b)
        return buf.view(b)
    if buf is not None and width == num_steps:
        counters.capacity_fallbacks += 1
    return None
