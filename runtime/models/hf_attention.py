"""The ``draftgraph`` attention function for transformers models (DESIGN.md §18).

Registered once in transformers' attention registry (`register`); a model whose config says
``_attn_implementation = "draftgraph"`` calls it from its own attention modules with the query,
key and value after RoPE (and q/k norms, biases: the model's own code). The engine's per-call
context (`AttentionContext`: its static per-slot K/V cache, the write positions and the mask of
the slot rows) reaches it as the keyword `CONTEXT_KEY` through transformers' ``**kwargs``. It
writes K/V (K/V heads, not repeated query heads) into the layer's cache at (slot, write
position) and attends from the cache under the engine's mask (a verify tree's or a causal one).
transformers builds no mask and no cache for it: the name has no mask function registered, and
the model is called with ``use_cache=False``.

An attention keyword it does not implement (attention sinks, soft-capping, a dropout in
training) raises ValueError naming it, never ignored; a sliding window is accepted only where
the loader checked it can never cut the cache (window >= cache length).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from .layers import cached_attention

__all__ = ["ATTN_NAME", "CONTEXT_KEY", "AttentionContext", "draftgraph_attention", "register"]

ATTN_NAME = "draftgraph"
CONTEXT_KEY = "draftgraph_context"
# keywords transformers passes that change nothing here: the positions (RoPE is applied before
# the call), the cache switch (always off) and a sliding window the loader proved never cuts
_IGNORED = frozenset({"position_ids", "use_cache", "sliding_window", "output_attentions", "is_causal"})


class AttentionContext(NamedTuple):
    """One target forward's attention inputs: the cache's K and V per layer, ``slots`` [B] (or a
    slice of B contiguous slots), ``write_pos`` / ``write_slot`` [B, T] and ``mask`` [B, T, Lk]
    (bool, True = attend over cache positions < Lk)."""

    k: tuple[torch.Tensor, ...]
    v: tuple[torch.Tensor, ...]
    slots: Any
    write_pos: torch.Tensor
    write_slot: torch.Tensor
    mask: torch.Tensor


def draftgraph_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attention_mask: Any, dropout: float = 0.0, scaling: float | None = None,
                         **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: query [B, Hq, T, d], key / value [B, Hk, T, d] ->
    (out [B, T, Hq, d], None)."""
    ctx = kwargs.get(CONTEXT_KEY)
    if not isinstance(ctx, AttentionContext):
        raise ValueError(f"{type(module).__name__}: attention '{ATTN_NAME}' called without {CONTEXT_KEY}=; "
                         f"this model runs only inside a draftgraph target (HFTarget.forward)")
    extra = sorted(k for k, v in kwargs.items() if k != CONTEXT_KEY and k not in _IGNORED and v is not None)
    if extra or attention_mask is not None or dropout:
        what = extra[0] if extra else ("attention_mask" if attention_mask is not None else f"dropout={dropout}")
        raise ValueError(f"{type(module).__name__}: attention keyword {what!r} is not implemented by the "
                         f"'{ATTN_NAME}' attention (it would be ignored, changing the model's output)")
    layer = module.layer_idx
    b, hq, t, d = query.shape
    out = cached_attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), ctx.k[layer],
                           ctx.v[layer], ctx.slots, ctx.write_pos, ctx.write_slot, ctx.mask, scale=scaling)
    return out.unflatten(-1, (hq, d)), None


def register() -> None:
    """Register `draftgraph_attention` under `ATTN_NAME` (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, draftgraph_attention)
