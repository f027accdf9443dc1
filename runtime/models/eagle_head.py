"""EAGLE draft head: fuse the target's hidden state with the next token's embedding, one
decoder layer (its own KV cache), then the target's frozen final norm and lm_head.

The worker-facing call is capturable: ``head(input_ids [M], rows: DraftRows) -> (logits [M, V],
DraftRows)``. A draft row holds what one draft token needs, as named tensors (gpt-fast's
``forward(idx, input_pos)`` style), so that the worker's row re-selection (tree parents) carries
all of it (`runtime.draft_rows`):

    feature [M, dim] float32, slot [M] int64, position [M] int64, base [M] int64,
    ancestors [M, max_ancestors, 2, head_dim] float32 (K, V)

``position`` is where this row's token sits, ``base`` the request's committed length (the draft
cache holds positions < base), and the ancestors are the K/V of the tokens drafted before it in
this step (exact tree attention). The call only reads the draft cache; `extend` writes it.
Pad rows (all zeros) read the dummy slot 0 and attend only to themselves.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import NamedTuple

import torch
from torch import nn

from .kv_cache import KVCache
from .layers import RMSNorm, SwiGLU, TargetHeadCopy, apply_rope, cached_attention, rope_tables

__all__ = ["DraftRows", "EagleConfig", "EagleDraftHead"]


class DraftRows(NamedTuple):
    """The head's per-row draft state (M rows): see the module docstring."""

    feature: torch.Tensor  # [M, dim] float32
    slot: torch.Tensor  # [M] int64, the request's cache slot
    position: torch.Tensor  # [M] int64, this row's token position
    base: torch.Tensor  # [M] int64, the request's committed length
    ancestors: torch.Tensor  # [M, max_ancestors, 2, head_dim] float32


@dataclass(frozen=True)
class EagleConfig:
    """Shape of the draft layer (dim is the target's)."""

    dim: int = 192
    n_heads: int = 3
    ffn: int = 384
    max_ancestors: int = 7
    max_len: int = 512

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class EagleDraftHead(TargetHeadCopy):
    """One-layer EAGLE head (float32) with frozen copies of the target's embedding, norm and lm_head."""

    def __init__(self, target: nn.Module, cfg: EagleConfig | None = None, seed: int = 0) -> None:
        super().__init__()
        cfg = cfg or EagleConfig(dim=target.cfg.dim, n_heads=target.cfg.dim // 64, max_len=target.cfg.max_len)
        torch.manual_seed(seed + 1)
        self.cfg = cfg
        d, hd = cfg.dim, cfg.head_dim
        self.norm_feat = RMSNorm(d)
        self.norm_emb = RMSNorm(d)
        self.fc = nn.Linear(2 * d, d, bias=False)
        self.attn_norm = RMSNorm(d)
        self.wq = nn.Linear(d, d, bias=False)
        self.wkv = nn.Linear(d, 2 * hd, bias=False)  # one K/V head shared by all query heads
        self.wo = nn.Linear(d, d, bias=False)
        self.mlp_norm = RMSNorm(d)
        self.mlp = SwiGLU(d, cfg.ffn)
        self.share_target(target)
        cos, sin = rope_tables(cfg.max_len, hd)
        self.register_buffer("rope_cos", cos.float(), persistent=False)
        self.register_buffer("rope_sin", sin.float(), persistent=False)
        self.cache: KVCache | None = None

    # ---- sizes --------------------------------------------------------------------------------
    def row_template(self, rows: int, device: torch.device | str) -> DraftRows:
        """Zero draft rows [rows, ...] (the worker's static graph inputs and its input rules)."""
        c = self.cfg
        long = torch.int64
        return DraftRows(torch.zeros(rows, c.dim, device=device),
                         torch.zeros(rows, dtype=long, device=device),
                         torch.zeros(rows, dtype=long, device=device),
                         torch.zeros(rows, dtype=long, device=device),
                         torch.zeros(rows, c.max_ancestors, 2, c.head_dim, device=device))

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    def allocate_cache(self, slots: int) -> KVCache:
        """Allocate the draft cache once; graphs captured later read these very tensors."""
        c = self.cfg
        self.cache = KVCache.zeros(1, slots, c.max_len, 1, c.head_dim, torch.float32,
                                   self.embed_w.device)
        return self.cache

    # ---- shared pieces ------------------------------------------------------------------------
    def _fuse(self, feat: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cat([self.norm_feat(feat), self.norm_emb(self.embed_w[tokens])], -1))

    def _qkv(self, x: torch.Tensor, pos: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [..., H, hd], k, v [..., 1, hd] with RoPE at pos [...]."""
        hd = self.cfg.head_dim
        xn = self.attn_norm(x)
        q = self.wq(xn).unflatten(-1, (self.cfg.n_heads, hd))
        k, v = self.wkv(xn).unflatten(-1, (2, 1, hd)).unbind(-3)
        cos, sin = self.rope_cos[pos], self.rope_sin[pos]
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def _finish(self, x: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        x = x + self.wo(att)
        return x + self.mlp(self.mlp_norm(x))

    # ---- the capturable draft call ------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, rows: DraftRows) -> tuple[torch.Tensor, DraftRows]:
        """One draft token per row: input_ids [M], rows (M rows) -> (logits [M, V], the next rows:
        the new feature, position + 1, this token's K/V among the ancestors)."""
        c = self.cfg
        hd, a = c.head_dim, c.max_ancestors
        slot, base, anc = rows.slot, rows.base, rows.ancestors
        pos = rows.position.clamp(0, c.max_len - 1)
        x = self._fuse(rows.feature, input_ids)
        q, k, v = self._qkv(x, pos)  # q [M, H, hd], k, v [M, 1, hd]
        cache = self.cache
        keys = cache.k[0][slot].squeeze(2)  # [M, L, hd]
        vals = cache.v[0][slot].squeeze(2)
        scale = 1.0 / math.sqrt(hd)
        s_pre = torch.einsum("mhd,mld->mhl", q, keys) * scale
        s_anc = torch.einsum("mhd,mad->mha", q, anc[:, :, 0]) * scale
        s_self = (q * k).sum(-1, keepdim=True) * scale
        pre_ok = torch.arange(keys.shape[1], device=pos.device)[None] < base[:, None]
        anc_ok = torch.arange(a, device=pos.device)[None] < (pos - base)[:, None]
        s = torch.cat([s_pre.masked_fill(~pre_ok[:, None], float("-inf")),
                       s_anc.masked_fill(~anc_ok[:, None], float("-inf")), s_self], dim=-1)
        p = torch.softmax(s, dim=-1)
        n = keys.shape[1]
        att = (torch.einsum("mhl,mld->mhd", p[..., :n], vals)
               + torch.einsum("mha,mad->mhd", p[..., n:n + a], anc[:, :, 1])
               + p[..., n + a:] * v)
        x = self._finish(x, att.flatten(1))
        j = (pos - base).clamp(0, a - 1)
        onehot = (torch.arange(a, device=j.device)[None] == j[:, None]).to(anc.dtype)
        onehot = onehot[:, :, None, None]  # [M, A, 1, 1]; one_hot would read j on the host
        new_kv = torch.stack([k.squeeze(1), v.squeeze(1)], dim=1)[:, None]  # [M, 1, 2, hd]
        anc = anc + onehot * (new_kv - anc)
        return self.logits(x), DraftRows(x, slot, rows.position + 1, base, anc)

    def initial_state(self, feat: torch.Tensor, slots: torch.Tensor, seq_lens: torch.Tensor) -> DraftRows:
        """Draft rows for the first draft token of each request: feat [b, dim], slots [b],
        seq_lens [b] (the token's position and the committed length: one int64 tensor, read
        only); no ancestors yet."""
        c = self.cfg
        b = feat.shape[0]
        lens = seq_lens.to(torch.int64)
        anc = torch.zeros(b, c.max_ancestors, 2, c.head_dim, dtype=torch.float32, device=feat.device)
        return DraftRows(feat.float(), slots.to(torch.int64), lens, lens, anc)

    # ---- extend (eager, writes the cache) -----------------------------------------------------
    def extend(self, feats: torch.Tensor, next_tokens: torch.Tensor, positions: torch.Tensor,
               slots: torch.Tensor, write_slot: torch.Tensor, mask: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the head over committed positions: feats [B, T, d] (the target's hidden at each
        position), next_tokens [B, T] (the token after each), positions [B, T]; writes the draft
        K/V at (write_slot, positions) and attends under mask [B, T, Lk]. Returns
        (features [B, T, d], logits [B, T, V])."""
        x = self._fuse(feats.float(), next_tokens)
        q, k, v = self._qkv(x, positions)
        att = cached_attention(q, k, v, self.cache.k[0], self.cache.v[0], slots, positions,
                               write_slot, mask)
        x = self._finish(x, att)
        return x, self.logits(x)

    # ---- training ------------------------------------------------------------------------------
    def train_forward(self, feats: torch.Tensor, next_tokens: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Two passes over [B, T]: pass 0 as `extend` (causal), pass 1 as the first draft call
        (row t fed pass 0's feature from t-1, attending to pass 0's keys < t and itself).
        Returns (pass-0 features [B, T, d], pass-0 logits, pass-1 logits [B, T-1, V])."""
        t = feats.shape[1]
        pos = torch.arange(t, device=feats.device)
        x0 = self._fuse(feats, next_tokens)
        q0, k0, v0 = self._qkv(x0, pos)  # [B, T, H, hd], [B, T, 1, hd]
        scale = 1.0 / math.sqrt(self.cfg.head_dim)
        s0 = torch.einsum("bthd,bsd->bhts", q0, k0[:, :, 0]) * scale
        causal = torch.ones(t, t, dtype=torch.bool, device=feats.device).tril()
        p0 = torch.softmax(s0.masked_fill(~causal, float("-inf")), -1)
        h0 = self._finish(x0, torch.einsum("bhts,bsd->bthd", p0, v0[:, :, 0]).flatten(2))
        x1 = self._fuse(h0[:, :-1], next_tokens[:, 1:])  # row t = position t + 1
        q1, k1, v1 = self._qkv(x1, pos[1:])
        s_prev = torch.einsum("bthd,bsd->bhts", q1, k0[:, :, 0]) * scale  # [B, H, T-1, T]
        strict = torch.ones(t - 1, t, dtype=torch.bool, device=feats.device).tril()  # s <= t -> s < t+1
        s_self = (q1 * k1).sum(-1).transpose(1, 2).unsqueeze(-1)  # [B, H, T-1, 1]
        p1 = torch.softmax(torch.cat([s_prev.masked_fill(~strict, float("-inf")), s_self * scale], -1), -1)
        att1 = (torch.einsum("bhts,bsd->bthd", p1[..., :t], v0[:, :, 0])
                + p1[..., t:].transpose(1, 2) * v1)
        h1 = self._finish(x1, att1.flatten(2))
        return h0, self.logits(h0), self.logits(h1)
