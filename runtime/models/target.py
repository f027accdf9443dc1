"""The default target: a small Llama-style decoder (RMSNorm, RoPE, attention, SwiGLU) with a
static per-slot KV cache. Its last hidden state (before the final norm) feeds the EAGLE head."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from .kv_cache import KVCache
from .layers import RMSNorm, SwiGLU, apply_rope, cached_attention, rope_tables
from .tokenizer import VOCAB_SIZE

__all__ = ["TargetConfig", "TargetModel"]


@dataclass(frozen=True)
class TargetConfig:
    """Shape of the target decoder."""

    vocab_size: int = VOCAB_SIZE
    dim: int = 192
    n_layers: int = 6
    n_heads: int = 3
    ffn: int = 512
    max_len: int = 512

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class _Block(nn.Module):
    """Pre-norm attention + SwiGLU block."""

    def __init__(self, cfg: TargetConfig) -> None:
        super().__init__()
        d = cfg.dim
        self.attn_norm = RMSNorm(d)
        self.wqkv = nn.Linear(d, 3 * d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)
        self.mlp_norm = RMSNorm(d)
        self.mlp = SwiGLU(d, cfg.ffn)
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, t, _ = x.shape
        q, k, v = self.wqkv(self.attn_norm(x)).view(b, t, 3, self.n_heads, self.head_dim).unbind(2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


class TargetModel(nn.Module):
    """tokens -> (logits [B, T, V], hidden [B, T, d]); `forward` uses the KV cache, `train_forward`
    a plain causal pass (training and distillation)."""

    def __init__(self, cfg: TargetConfig = TargetConfig(), seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        nn.init.normal_(self.embed.weight, std=0.02)
        cos, sin = rope_tables(cfg.max_len, cfg.head_dim)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    @property
    def hidden_size(self) -> int:
        return self.cfg.dim

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    def new_cache(self, slots: int) -> KVCache:
        """A static cache of ``slots`` slots (slot 0 is the dummy slot) for this model."""
        c = self.cfg
        return KVCache.zeros(c.n_layers, slots, c.max_len, c.n_heads, c.head_dim, self.dtype,
                             self.embed.weight.device)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of hidden states (final norm, then lm_head)."""
        return self.lm_head(self.norm(hidden))

    def forward(self, tokens: torch.Tensor, rope_pos: torch.Tensor, write_pos: torch.Tensor,
                slots: torch.Tensor, mask: torch.Tensor, cache: KVCache
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens / rope_pos / write_pos [B, T], slots [B] (or a slice of B contiguous slots),
        mask [B, T, Lk]: writes K/V of every token at (slot, write_pos) and attends under ``mask``
        over cache positions < Lk."""
        x = self.embed(tokens)
        cos, sin = self.rope_cos[rope_pos].to(x.dtype), self.rope_sin[rope_pos].to(x.dtype)
        if isinstance(slots, slice):  # contiguous slots: the cache is read through a view
            wslot = torch.arange(slots.start, slots.stop, device=x.device)[:, None].expand_as(write_pos)
        else:
            wslot = slots.unsqueeze(1).expand_as(write_pos)
        for i, blk in enumerate(self.blocks):
            q, k, v = blk.qkv(x, cos, sin)
            att = cached_attention(q, k, v, cache.k[i], cache.v[i], slots, write_pos,
                                   wslot, mask)
            x = x + blk.wo(att)
            x = x + blk.mlp(blk.mlp_norm(x))
        return self.head(x), x

    def train_forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Causal pass over tokens [B, T] without the cache: (logits, hidden before the final norm)."""
        t = tokens.shape[1]
        x = self.embed(tokens)
        cos, sin = self.rope_cos[:t].to(x.dtype), self.rope_sin[:t].to(x.dtype)
        for blk in self.blocks:
            q, k, v = blk.qkv(x, cos, sin)
            att = nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
            x = x + blk.wo(att.transpose(1, 2).flatten(2))
            x = x + blk.mlp(blk.mlp_norm(x))
        return self.head(x), x
