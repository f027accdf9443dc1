"""Building blocks of the multi-layer draft (RMSNorm, SwiGLU, the target's head) and attention
over a static per-slot KV cache (the ``draftgraph`` attention of transformers targets, a
published head's `extend`).

Cache layout: ``k_cache`` / ``v_cache`` [slots, max_len, kv_heads, head_dim]. Slot 0 is the
engine's dummy slot: pad entries write there, so they never touch a live request's cache.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["RMSNorm", "SwiGLU", "TargetHeadCopy", "cached_attention"]


class RMSNorm(nn.Module):
    """x / rms(x) * weight over the last dim."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x))."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.silu(self.gate(x)) * self.up(x))


class TargetHeadCopy(nn.Module):
    """Base of the multi-layer draft: frozen float32 copies of the target's (an `HFTarget`'s)
    embedding, final norm and lm_head (non-persistent buffers: the target's weights are not
    saved with the draft)."""

    def share_target(self, target: nn.Module) -> None:
        self.register_buffer("embed_w", target.embed.weight.detach().float().clone(), persistent=False)
        self.register_buffer("norm_w", target.final_norm.weight.detach().float().clone(), persistent=False)
        self.register_buffer("lm_w", target.lm_head.weight.detach().float().clone(), persistent=False)
        self.norm_eps = target.final_norm.variance_epsilon

    @property
    def vocab_size(self) -> int:
        return self.embed_w.shape[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's final norm and lm_head on draft features."""
        x = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.norm_eps) * self.norm_w
        return x @ self.lm_w.t()


def cached_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, slots: torch.Tensor, write_pos: torch.Tensor,
                     write_slot: torch.Tensor, mask: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Write k, v [B, T, Hk, d] at (write_slot, write_pos) [B, T], then attend q [B, T, Hq, d] over
    the first ``mask.shape[-1]`` cache positions of ``slots`` [B] under mask [B, T, Lk] (bool,
    True = attend); scores are scaled by ``scale`` (None: 1 / sqrt(d)). Returns [B, T, Hq * d].

    One fused ``scaled_dot_product_attention`` reads the cache's K/V heads as they are (grouped
    query heads share them: no repeated copy); a row that attends nowhere (a pad row of the dummy
    slot) comes out 0."""
    k_cache.index_put_((write_slot, write_pos), k)
    v_cache.index_put_((write_slot, write_pos), v)
    lk = mask.shape[-1]
    keys = k_cache[slots, :lk].transpose(1, 2)  # [B, Hk, Lk, d]
    vals = v_cache[slots, :lk].transpose(1, 2)
    out = nn.functional.scaled_dot_product_attention(q.transpose(1, 2), keys, vals, attn_mask=mask.unsqueeze(1),
                                                     scale=scale, enable_gqa=q.shape[2] != keys.shape[1])
    return out.transpose(1, 2).flatten(2)
