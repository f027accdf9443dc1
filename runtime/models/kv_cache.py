"""Static per-slot KV cache: per layer K and V [slots, max_len, kv_heads, head_dim].

Slot 0 is reserved (the dummy slot): pad entries write there, so a pad never touches a live
request's cache. Tensors are allocated once and never rebound (graphs may read them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["KVCache"]


@dataclass(frozen=True)
class KVCache:
    """K and V per layer; ``slots`` includes the dummy slot 0."""

    k: tuple[torch.Tensor, ...]
    v: tuple[torch.Tensor, ...]

    @classmethod
    def zeros(cls, layers: int, slots: int, max_len: int, heads: int, head_dim: int,
              dtype: torch.dtype, device: torch.device | str) -> KVCache:
        shape = (slots, max_len, heads, head_dim)
        return cls(tuple(torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)),
                   tuple(torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)))

    @property
    def slots(self) -> int:
        return self.k[0].shape[0]

    @property
    def max_len(self) -> int:
        return self.k[0].shape[1]

    def move(self, slots: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy entries (slots[i], src[i]) to (slots[i], dst[i]) in every layer [n] (the commit;
        sources are read before any write)."""
        for kc, vc in zip(self.k, self.v):
            kc[slots, dst] = kc[slots, src]
            vc[slots, dst] = vc[slots, src]

    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        """Copy slot ``src``'s first ``length`` positions to slot ``dst`` in every layer (a
        prompt's prefill shared by requests of the same prompt)."""
        for t in (*self.k, *self.v):
            t[dst, :length] = t[src, :length]

    def slot_snapshot(self, slot: int) -> list[torch.Tensor]:
        """Copies of one slot's K and V of every layer (tests: pad rows must not touch them)."""
        return [t[slot].clone() for t in (*self.k, *self.v)]
