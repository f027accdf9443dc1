"""Llama-style building blocks shared by the default models: RMSNorm, RoPE, SwiGLU and attention
over a static per-slot KV cache.

Cache layout: ``k_cache`` / ``v_cache`` [slots, max_len, kv_heads, head_dim]. Slot 0 is the
engine's dummy slot: pad entries write there, so they never touch a live request's cache.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["RMSNorm", "SwiGLU", "TargetHeadCopy", "rope_tables", "apply_rope", "cached_attention"]


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
    """Base of the drafts: frozen float32 copies of the target's embedding, final norm and
    lm_head (non-persistent buffers: the target's weights are not saved with the draft)."""

    def share_target(self, target: nn.Module) -> None:
        self.register_buffer("embed_w", target.embed.weight.detach().float().clone(), persistent=False)
        self.register_buffer("norm_w", target.norm.weight.detach().float().clone(), persistent=False)
        self.register_buffer("lm_w", target.lm_head.weight.detach().float().clone(), persistent=False)
        self.norm_eps = target.norm.eps

    @property
    def vocab_size(self) -> int:
        return self.embed_w.shape[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's final norm and lm_head on draft features."""
        x = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.norm_eps) * self.norm_w
        return x @ self.lm_w.t()


def rope_tables(max_len: int, head_dim: int, theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [max_len, head_dim // 2] in float64 (cast by the caller)."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    ang = torch.arange(max_len, dtype=torch.float64)[:, None] * inv[None, :]
    return ang.cos(), ang.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[..., :h/2], x[..., h/2:]) of x [..., heads, head_dim] by cos/sin [..., head_dim/2]
    (cos/sin broadcast over the heads dim, given without it)."""
    half = x.shape[-1] // 2
    c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1)


def cached_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, slots: torch.Tensor, write_pos: torch.Tensor,
                     write_slot: torch.Tensor, mask: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Write k, v [B, T, Hk, d] at (write_slot, write_pos) [B, T], then attend q [B, T, Hq, d] over
    the first ``mask.shape[-1]`` cache positions of ``slots`` [B] under mask [B, T, Lk] (bool,
    True = attend); scores are scaled by ``scale`` (None: 1 / sqrt(d)). Returns [B, T, Hq * d]."""
    k_cache.index_put_((write_slot, write_pos), k)
    v_cache.index_put_((write_slot, write_pos), v)
    lk = mask.shape[-1]
    keys = k_cache[slots, :lk]  # [B, Lk, Hk, d]
    vals = v_cache[slots, :lk]
    rep = q.shape[2] // keys.shape[2]
    if rep > 1:
        keys = keys.repeat_interleave(rep, dim=2)
        vals = vals.repeat_interleave(rep, dim=2)
    s = torch.einsum("bthd,bshd->bhts", q, keys)
    s = s / math.sqrt(q.shape[-1]) if scale is None else s * scale
    s = s.masked_fill(~mask.unsqueeze(1), float("-inf"))
    out = torch.einsum("bhts,bshd->bthd", torch.softmax(s, dim=-1), vals)
    return out.flatten(2)
