"""The embedded target as a transformers checkpoint: `to_llama` / `save_llama` write the trained
`TargetModel` as a ``LlamaForCausalLM`` that transformers' own Llama code runs, and
`load_embedded` serves that folder with the embedded EAGLE head (docs/models.md).

The mapping (checked in tests/test_hf_convert.py):

- ``embed`` -> ``model.embed_tokens``; ``lm_head`` -> ``lm_head`` (untied); ``norm`` ->
  ``model.norm``; per block ``attn_norm`` -> ``input_layernorm``, ``mlp_norm`` ->
  ``post_attention_layernorm``, ``mlp.gate/up/down`` -> ``mlp.gate_proj/up_proj/down_proj``,
  ``wo`` -> ``self_attn.o_proj``; ``wqkv`` [3d, d] splits into q, k, v rows (its output is viewed
  as [3, heads, head_dim]), no K/V grouping (``num_key_value_heads`` = heads).
- RoPE: the embedded `apply_rope` rotates the pairs (x[i], x[i + head_dim / 2]) by the angle of
  frequency i, which is transformers' ``rotate_half`` convention (cos/sin repeated over the two
  halves), theta 10000: no q/k permutation is needed (an interleaved-pairs model would need one).
- RMSNorm: eps 1e-5 (transformers' Llama default is 1e-6: set explicitly), weight after the
  normalisation, pre-norm blocks and a final norm before the LM head, as in transformers.

Exactness: the function is the same, but transformers' Llama computes two things in float32
whatever the model's dtype: ``LlamaRMSNorm`` casts its input to float32 before normalising, and
the rotary embedding builds its inverse frequencies and angles in float32. A float64 checkpoint
therefore differs from the embedded float64 target by up to ~1e-5 in the logits (7.8e-6 over 8
held-out prompts of up to 96 tokens; argmax-identical). With those two pieces evaluated in
float64 the logits were bitwise equal on those prompts.

The embedded EAGLE head is not expressible in a published EAGLE-1/2 or EAGLE-3 layout; see
`PUBLISHED_LAYOUT_GAP`. `load_embedded` serves it as it is, next to the converted target (the
engine's draft-head interface is the same for both): its input is the target's last-layer
output before the final norm, which `HFTarget`'s default feature layer provides.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from .eagle_head import EagleDraftHead
from .target import TargetModel
from .tokenizer import BOS_ID, EOS_ID

__all__ = ["PUBLISHED_LAYOUT_GAP", "llama_config", "load_embedded", "save_default", "save_llama", "to_llama"]

logger = logging.getLogger(__name__)

ROPE_THETA = 10000.0  # `layers.rope_tables`' default, which `TargetModel` uses

PUBLISHED_LAYOUT_GAP = (
    "The embedded EAGLE head is not expressible in the published EAGLE-1/2 layout (fc [H, 2H] over "
    "cat(embed, feature), Llama layers with no input_layernorm on layer 0, no final norm, logits = "
    "the target's lm_head on the last layer's output): (1) it RMS-normalises the token embedding "
    "with its own weight (norm_emb) before fc, a per-token scaling the published fc, fed the raw "
    "embedding, cannot express; (2) its single layer has an input norm (attn_norm) between fc and "
    "q/k/v, which published layer 0 lacks; (3) its logits are the target's lm_head after the "
    "target's final norm, and the published head has no norm there. Its feature (the target's "
    "pre-norm hidden, normalised by its own norm_feat) would fold into fc's columns as "
    "w_feat / w_final_norm, but (1)-(3) are nonlinear. EAGLE-3 does not fit either: its residual "
    "is fc(target streams) alone, while the embedded head's residual mixes the embedding in (fc "
    "over both), and it would need the same final norm and input norm.")


def llama_config(target: TargetModel) -> Any:
    """The ``LlamaConfig`` of ``target``'s shape (untied embeddings, eps 1e-5, theta 10000)."""
    from transformers import LlamaConfig

    c = target.cfg
    eps = {target.norm.eps, *(b.attn_norm.eps for b in target.blocks), *(b.mlp_norm.eps for b in target.blocks)}
    if len(eps) != 1:
        raise ValueError(f"norm eps values {sorted(eps)}: a Llama config has one rms_norm_eps")
    return LlamaConfig(vocab_size=c.vocab_size, hidden_size=c.dim, intermediate_size=c.ffn,
                       num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads,
                       num_key_value_heads=c.n_heads, head_dim=c.head_dim, max_position_embeddings=c.max_len,
                       rms_norm_eps=eps.pop(), rope_theta=ROPE_THETA, tie_word_embeddings=False,
                       attention_bias=False, mlp_bias=False, hidden_act="silu",
                       bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=EOS_ID)


def _state_dict(target: TargetModel) -> dict[str, torch.Tensor]:
    """``target``'s weights under transformers' Llama names (`to_llama`'s mapping)."""
    d = target.cfg.dim
    out = {"model.embed_tokens.weight": target.embed.weight, "model.norm.weight": target.norm.weight,
           "lm_head.weight": target.lm_head.weight}
    for i, blk in enumerate(target.blocks):
        p = f"model.layers.{i}."
        w = blk.wqkv.weight  # rows: q (heads x head_dim), then k, then v
        out |= {p + "self_attn.q_proj.weight": w[:d], p + "self_attn.k_proj.weight": w[d:2 * d],
                p + "self_attn.v_proj.weight": w[2 * d:], p + "self_attn.o_proj.weight": blk.wo.weight,
                p + "input_layernorm.weight": blk.attn_norm.weight,
                p + "post_attention_layernorm.weight": blk.mlp_norm.weight,
                p + "mlp.gate_proj.weight": blk.mlp.gate.weight, p + "mlp.up_proj.weight": blk.mlp.up.weight,
                p + "mlp.down_proj.weight": blk.mlp.down.weight}
    return {k: v.detach().clone().contiguous() for k, v in out.items()}


@torch.no_grad()
def to_llama(target: TargetModel, dtype: torch.dtype | None = None) -> Any:
    """A ``LlamaForCausalLM`` (eval mode, ``dtype`` or the target's) computing ``target``'s
    function; every tensor is checked to be loaded (no random initialisation left)."""
    from transformers import LlamaForCausalLM

    dtype = dtype or target.dtype
    model = LlamaForCausalLM(llama_config(target)).to(dtype)
    weights = _state_dict(target)
    missing, unexpected = model.load_state_dict({k: v.to(dtype) for k, v in weights.items()}, strict=False)
    missing = [k for k in missing if not k.endswith("rotary_emb.inv_freq")]
    if missing or unexpected:
        raise ValueError(f"Llama mapping incomplete: missing {missing}, unexpected {unexpected}")
    model.generation_config.eos_token_id = None  # greedy_generate never stops early: neither does generate
    model.generation_config.pad_token_id = EOS_ID
    return model.eval()


def save_llama(target: TargetModel, folder: str | Path, dtype: torch.dtype = torch.float32) -> Path:
    """Write ``target`` as a ``LlamaForCausalLM`` folder (config.json, generation_config.json,
    model.safetensors) in ``dtype`` (float32: the trained weights' precision); returns it."""
    folder = Path(folder)
    to_llama(target, dtype).save_pretrained(folder)
    logger.info("wrote the embedded target as LlamaForCausalLM to %s (%s)", folder, dtype)
    return folder


def save_default(folder: str | Path, seed: int = 0) -> tuple[Path, EagleDraftHead]:
    """The trained default target (`default_models`) written to ``folder``, and its EAGLE head
    (to serve with `load_embedded`)."""
    from .defaults import default_models

    target, head = default_models(seed=seed, draft="eagle")
    return save_llama(target, folder), head


def load_embedded(folder: str | Path, head: EagleDraftHead, dtype: str | torch.dtype = "float64",
                  max_len: int | None = None, device: str | torch.device = "cpu") -> tuple[Any, EagleDraftHead]:
    """(`HFTarget` of the converted checkpoint ``folder``, a copy of the embedded ``head`` bound to
    it): the head's frozen embedding, final norm and LM head are taken from the checkpoint, and
    its feature is the target's last-layer output before the final norm (HFTarget's default)."""
    from .hf_load import load_target

    target = load_target(folder, dtype=dtype, max_len=max_len, device=device)
    if (target.cfg.dim, target.vocab_size) != (head.cfg.dim, head.vocab_size):
        raise ValueError(f"{folder}: hidden {target.cfg.dim}, vocabulary {target.vocab_size}; the head was trained "
                         f"for hidden {head.cfg.dim}, vocabulary {head.vocab_size}")
    base = target.model.base_model
    shim = SimpleNamespace(embed=base.embed_tokens, norm=SimpleNamespace(weight=base.norm.weight,
                                                                          eps=base.norm.variance_epsilon),
                           lm_head=target.model.get_output_embeddings(),
                           cfg=SimpleNamespace(dim=target.cfg.dim, max_len=target.cfg.max_len))
    bound = EagleDraftHead(shim, cfg=head.cfg, seed=0)
    bound.load_state_dict(head.state_dict())
    return target, bound.to(device).eval().requires_grad_(False)
