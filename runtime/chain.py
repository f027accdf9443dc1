"""Chain (topk == 1) constants under their historical names: the chain is one static topology.

`ChainBuffers(num_steps, capacity, device)` is `TopologyBuffers` of the tree ((0,), (0, 0), ..):
parents rows -1, 0, .., S-2 (width 0 when S == 1) and score_indices rows 0, .., S-1. There is no
chain-only code path any more; see `draftgraph.runtime.topology`.
"""

from __future__ import annotations

import torch

from .topology import TopologyBufferCache, TopologyBuffers, TopologyKey
from .tree_choices import StaticTopology
from .validation import require_positive_int

__all__ = ["ChainKey", "ChainBuffers", "ChainBufferCache"]

ChainKey = TopologyKey
ChainBufferCache = TopologyBufferCache


class ChainBuffers(TopologyBuffers):
    """TopologyBuffers of the chain of ``num_steps`` (the same tensors a cache would build)."""

    __slots__ = ()

    def __init__(self, num_steps: int, capacity: int, device: str | torch.device = "cpu") -> None:
        require_positive_int("num_steps", num_steps)
        super().__init__(StaticTopology.chain(num_steps), capacity, device)
