"""The embedded target as a transformers checkpoint: `to_transformers` builds the
``LlamaForCausalLM`` that computes the same function (fused q/k/v split, the same RMSNorm
epsilon, RoPE base and half-split rotation, SwiGLU), `save_transformers` writes it with
``save_pretrained`` (loadable by ``AutoModelForCausalLM.from_pretrained`` and `load_target`).

The embedded EAGLE head reads the target's last layer output before the final norm, which is
`HFTarget`'s default feature, so it drafts for the converted target unchanged.

RoPE needs no q/k permutation: the embedded `apply_rope` rotates the pairs (x[i], x[i + head_dim / 2])
by frequency i, which is transformers' ``rotate_half`` convention (not interleaved pairs). The
norms are pre-norm with the weight after the normalisation, eps 1e-5 (transformers' Llama default
is 1e-6, so it is set).

Exactness (tests/test_hf_convert.py): the function is the same, but transformers' Llama computes
two things in float32 whatever the model's dtype: ``LlamaRMSNorm`` casts its input to float32,
and the rotary embedding builds its frequencies and angles in float32. A float64 checkpoint
therefore differs from the embedded float64 target by up to ~1e-5 in the logits (7.8e-6 over 8
held-out prompts of up to 96 tokens; argmax-identical). With those two pieces evaluated in float64
the logits were bitwise equal on those prompts.

The embedded EAGLE head has no published EAGLE-1/2 or EAGLE-3 layout: `PUBLISHED_LAYOUT_GAP`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .target import TargetModel

__all__ = ["PUBLISHED_LAYOUT_GAP", "llama_config", "save_transformers", "to_transformers"]

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
    """The ``LlamaConfig`` of the embedded target's shape (no special tokens)."""
    from transformers import LlamaConfig

    c = target.cfg
    return LlamaConfig(hidden_size=c.dim, intermediate_size=c.ffn, num_hidden_layers=c.n_layers,
                       num_attention_heads=c.n_heads, num_key_value_heads=c.n_heads, head_dim=c.head_dim,
                       vocab_size=c.vocab_size, max_position_embeddings=c.max_len,
                       rms_norm_eps=target.norm.eps, rope_theta=10000.0, tie_word_embeddings=False,
                       bos_token_id=None, eos_token_id=None, pad_token_id=None, architectures=["LlamaForCausalLM"])


@torch.no_grad()
def to_transformers(target: TargetModel) -> Any:
    """A ``LlamaForCausalLM`` (eval mode, the target's dtype) holding the target's weights."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(llama_config(target)).to(target.dtype).eval()
    state = {"model.embed_tokens.weight": target.embed.weight, "model.norm.weight": target.norm.weight,
             "lm_head.weight": target.lm_head.weight}
    for i, blk in enumerate(target.blocks):
        q, k, v = blk.wqkv.weight.chunk(3, 0)
        p = f"model.layers.{i}."
        state.update({p + "input_layernorm.weight": blk.attn_norm.weight, p + "self_attn.q_proj.weight": q,
                      p + "self_attn.k_proj.weight": k, p + "self_attn.v_proj.weight": v,
                      p + "self_attn.o_proj.weight": blk.wo.weight,
                      p + "post_attention_layernorm.weight": blk.mlp_norm.weight,
                      p + "mlp.gate_proj.weight": blk.mlp.gate.weight, p + "mlp.up_proj.weight": blk.mlp.up.weight,
                      p + "mlp.down_proj.weight": blk.mlp.down.weight})
    model.load_state_dict({k: t.detach().clone() for k, t in state.items()}, strict=True)
    return model


def save_transformers(target: TargetModel, folder: str | Path) -> Path:
    """`to_transformers` saved with ``save_pretrained`` into ``folder``; returns it."""
    folder = Path(folder)
    to_transformers(target).save_pretrained(folder)
    return folder
