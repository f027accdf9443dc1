"""`HFTarget`: a transformers ``*ForCausalLM`` as the engine's target, run by its own model code.

The engine calls a target as ``target(tokens, rope_pos, write_pos, slots, mask, cache) -> (logits,
hidden)`` and reads ``cfg.vocab_size`` / ``cfg.max_len``, ``new_cache``, ``hidden_size`` and
``dtype`` (`TargetModel` is the embedded one). Here the model is transformers' own: its config's
attention implementation is ``"draftgraph"`` (`hf_attention`), it is called with
``use_cache=False``, the engine's positions as ``position_ids`` and the engine's cache, write
positions and mask as one keyword that transformers hands to the attention function; it builds
no mask and no cache of its own.

``hidden`` is what the draft reads: the residual stream entering each of ``feature_layers``
(layer ``L`` = the last layer's output before the final norm; `NORMED` = the final norm's
output, the EAGLE-1/2 feature; EAGLE-3 reads three layers), concatenated on the last dim;
``hidden_size`` is its width. The streams
are taken by forward pre-hooks (per thread: a background capture may trace while the serving
thread runs), so the forward costs nothing more than the model's.

Every backend (eager, trace, compile, cuda) runs it: no host reads in the forward, no Python
value that changes per call.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from .hf_attention import ATTN_NAME, CONTEXT_KEY, AttentionContext, register
from .hf_checks import check_backend, check_config
from .kv_cache import KVCache
from .q4_linear import weight_format

__all__ = ["HFTarget", "HFTargetConfig", "NORMED"]

logger = logging.getLogger(__name__)

NORMED = -1  # a feature layer id: the final norm's output (what EAGLE-1/2 heads read)


@dataclasses.dataclass(frozen=True)
class HFTargetConfig:
    """Shape of a transformers target as the engine sees it (``config_json``: the model's whole
    config, so that compiled code keyed by this never serves another model)."""

    model_type: str
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    max_len: int
    feature_layers: tuple[int, ...]
    config_json: str
    weights: str = "dense"  # "q4": the linear layers compute from Q4_1 codes (`q4_linear`)


class HFTarget(nn.Module):
    """A transformers causal LM (``model``, in eval mode) over a static per-slot cache of
    ``max_len`` positions; ``feature_layers``: the layers whose entering residual stream the
    draft reads (None: ``(L,)``, the last layer's output before the final norm). Refuses
    (ValueError naming the architecture and the feature) what the ``draftgraph`` attention
    does not implement (`hf_checks.check_config`). The model's config is switched to the
    ``draftgraph`` attention, so that model (and any model sharing its config object) runs only
    inside an `HFTarget` from then on: load a separate copy for transformers' own ``generate``."""

    def __init__(self, model: nn.Module, max_len: int, feature_layers: Sequence[int] | None = None) -> None:
        super().__init__()
        config = model.config
        if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 2:
            raise ValueError(f"max_len={max_len!r}: must be an int >= 2 (cache positions per request)")
        limit = getattr(config, "max_position_embeddings", None)
        if isinstance(limit, int) and max_len > limit:
            raise ValueError(f"max_len={max_len}: above the model's max_position_embeddings={limit}")
        check_config(config, max_len)
        n_layers = config.num_hidden_layers
        layers = (n_layers,) if feature_layers is None else tuple(feature_layers)
        bad = [i for i in layers if isinstance(i, bool) or not isinstance(i, int) or not NORMED <= i <= n_layers]
        if not layers or bad:
            raise ValueError(f"feature_layers={list(layers)}: each must be an int in [0, {n_layers}] (the residual "
                             f"stream entering that layer; {n_layers}: the last layer's output) or {NORMED} "
                             f"(the final norm's output)")
        register()
        model.set_attn_implementation(ATTN_NAME)
        # transformers documents config._attn_implementation as the model's attention switch
        if model.config._attn_implementation != ATTN_NAME:  # noqa: SLF001
            raise ValueError(f"{type(model).__name__}: does not route attention through transformers' "
                             f"AttentionInterface; it cannot run the '{ATTN_NAME}' attention")
        self.model = model.eval()
        heads = config.num_attention_heads
        self.cfg = HFTargetConfig(
            model_type=config.model_type, vocab_size=config.vocab_size, dim=config.hidden_size, n_layers=n_layers,
            n_heads=heads, n_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads, max_len=max_len,
            feature_layers=layers, config_json=config.to_json_string(use_diff=False),
            weights=weight_format(model))
        self._taps = threading.local()
        self._hooks = [self._tap(i) for i in sorted(set(layers))]
        self._probe()
        logger.info("target %s: %d layers, %d heads (%d K/V), hidden %d, cache %d positions, features %s",
                    type(model).__name__, n_layers, heads, self.cfg.n_kv_heads, self.cfg.dim, max_len, list(layers))

    def _tap(self, layer: int) -> Any:
        """A hook keeping the residual stream entering ``layer`` (L: the final norm's input;
        `NORMED`: its output)."""
        base = self.model.base_model
        taps = self._taps

        def keep(value: torch.Tensor) -> None:
            store = getattr(taps, "streams", None)
            if store is not None:
                store[layer] = value

        if layer == NORMED:
            return base.norm.register_forward_hook(lambda _m, _args, out: keep(out))
        module = base.norm if layer == self.cfg.n_layers else base.layers[layer]
        return module.register_forward_pre_hook(lambda _m, args: keep(args[0]))

    @torch.no_grad()
    def _probe(self) -> None:
        """One token through a one-position cache: an attention keyword the function does not
        implement raises now, at load, not at the first request."""
        cache = self.new_cache(1, max_len=1)
        zero = torch.zeros(1, 1, dtype=torch.long, device=self.device)
        self(zero, zero, zero, zero[0], torch.ones(1, 1, 1, dtype=torch.bool, device=self.device), cache)

    # ---- what the engine reads ----------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    @property
    def hidden_size(self) -> int:
        """Width of the ``hidden`` features `forward` returns (H per feature layer)."""
        return self.cfg.dim * len(self.cfg.feature_layers)

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def embed(self) -> nn.Module:
        """The input embedding (its weight's device is the model's)."""
        return self.model.get_input_embeddings()

    @property
    def final_norm(self) -> nn.Module:
        """The final norm (its ``weight`` and ``variance_epsilon``)."""
        return self.model.base_model.norm

    @property
    def lm_head(self) -> nn.Module:
        """The output projection (its ``weight`` [V, H])."""
        return self.model.get_output_embeddings()

    def check_backend(self, backend: str) -> None:
        """Refuse a graph ``backend`` this model cannot be captured under (dynamic RoPE)."""
        check_backend(self.model.config, backend)

    def new_cache(self, slots: int, max_len: int | None = None) -> KVCache:
        """A static cache of ``slots`` slots (slot 0 is the dummy slot), K/V heads per layer."""
        c = self.cfg
        return KVCache.zeros(c.n_layers, slots, max_len or c.max_len, c.n_kv_heads, c.head_dim, self.dtype,
                             self.device)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of last-layer features (the final norm, then the LM head)."""
        return self.lm_head(self.final_norm(hidden))

    def forward(self, tokens: torch.Tensor, rope_pos: torch.Tensor, write_pos: torch.Tensor, slots: Any,
                mask: torch.Tensor, cache: KVCache) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens / rope_pos / write_pos [B, T], slots [B] (or a slice of B contiguous slots),
        mask [B, T, Lk]: writes K/V of every token at (slot, write_pos) and attends under ``mask``
        over cache positions < Lk. Returns (logits [B, T, V], hidden [B, T, hidden_size])."""
        if isinstance(slots, slice):  # contiguous slots: the cache is read through a view
            wslot = torch.arange(slots.start, slots.stop, device=tokens.device)[:, None].expand_as(write_pos)
        else:
            wslot = slots.unsqueeze(1).expand_as(write_pos)
        ctx = AttentionContext(cache.k, cache.v, slots, write_pos, wslot, mask)
        self._taps.streams = streams = {}
        try:
            out = self.model(input_ids=tokens, position_ids=rope_pos, use_cache=False, **{CONTEXT_KEY: ctx})
        finally:
            self._taps.streams = None
        hidden = [streams[i] for i in self.cfg.feature_layers]
        return out.logits, hidden[0] if len(hidden) == 1 else torch.cat(hidden, -1)

    def describe(self) -> dict[str, Any]:
        """The model's identity for logs and stats."""
        fields = {k: v for k, v in dataclasses.asdict(self.cfg).items() if k != "config_json"}
        return {"architecture": type(self.model).__name__, **fields}
