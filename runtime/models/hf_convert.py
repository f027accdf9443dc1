"""The embedded target as a transformers checkpoint: `to_transformers` builds the
``LlamaForCausalLM`` that computes the same function (fused q/k/v split, the same RMSNorm
epsilon, RoPE base and half-split rotation, SwiGLU), `save_transformers` writes it with
``save_pretrained`` (loadable by ``AutoModelForCausalLM.from_pretrained`` and `load_target`).

The embedded EAGLE head reads the target's last layer output before the final norm, which is
`HFTarget`'s default feature, so it drafts for the converted target unchanged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .target import TargetModel

__all__ = ["llama_config", "save_transformers", "to_transformers"]


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
