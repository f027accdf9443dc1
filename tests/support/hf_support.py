"""Tiny transformers checkpoints for the tests: random-initialised targets of each supported family
saved with ``save_pretrained``, random EAGLE-1/2 and EAGLE-3 heads saved in the published key
layout, and the oracle: transformers' own ``generate`` (greedy) on a separately loaded copy.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, VOCAB, FFN = 64, 4, 2, 16, 300, 128
MAX_POS = 256
FAMILIES = {  # model_type -> (config class, what the family adds)
    "llama": ("LlamaConfig", {}),
    "qwen2": ("Qwen2Config", {"tie_word_embeddings": True}),  # q/k/v bias; tied embeddings
    "mistral": ("MistralConfig", {}),  # sliding_window 4096 >= any cache here: never cuts
    "qwen3": ("Qwen3Config", {"head_dim": HEAD_DIM}),  # q/k norms
}


def target_config(family: str, layers: int = 3, **overrides: Any) -> Any:
    """A tiny config of ``family`` (GQA: 4 query heads, 2 K/V heads) with no special tokens, so
    that ``generate`` never stops early."""
    import transformers

    cls, extra = FAMILIES[family]
    kw = dict(hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=layers, num_attention_heads=HEADS,
              num_key_value_heads=KV_HEADS, vocab_size=VOCAB, max_position_embeddings=MAX_POS, bos_token_id=None,
              eos_token_id=None, pad_token_id=None, initializer_range=0.1)
    return getattr(transformers, cls)(**{**kw, **extra, **overrides})


def save_target(folder: Path, family: str, layers: int = 3, seed: int = 0, **overrides: Any) -> Path:
    """A random ``family`` model saved with ``save_pretrained`` into ``folder``."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(target_config(family, layers, **overrides)).save_pretrained(folder)
    return folder


def head_tensors(fmt: str, seed: int = 1, layers: int = 1, draft_vocab: int = 200,
                 target_hidden: int = HIDDEN) -> dict[str, torch.Tensor]:
    """Random tensors of a head in the published layout (``fmt`` "eagle1" or "eagle3")."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.1

    h, ffn = HIDDEN, 96
    sd: dict[str, torch.Tensor] = {}
    if fmt == "eagle1":
        sd["fc.weight"], sd["fc.bias"] = r(h, 2 * h), r(h)
        prefixes, width = [f"layers.{i}." for i in range(layers)], h
    else:
        sd["fc.weight"] = r(h, 3 * target_hidden)
        prefixes, width = ["midlayer."], 2 * h
        sd["midlayer.input_layernorm.weight"] = 1 + r(h)
        sd["midlayer.hidden_norm.weight"] = 1 + r(h)
        sd["norm.weight"] = 1 + r(h)
        sd["lm_head.weight"] = r(draft_vocab, h)
        kept = torch.sort(torch.randperm(VOCAB, generator=g)[:draft_vocab]).values
        sd["d2t"] = kept - torch.arange(draft_vocab)  # target id = draft id + d2t[draft id]
        sd["t2d"] = torch.zeros(VOCAB, dtype=torch.bool).index_fill_(0, kept, True)
    for i, p in enumerate(prefixes):
        if fmt == "eagle1" and i > 0:
            sd[p + "input_layernorm.weight"] = 1 + r(h)
        sd[p + "self_attn.q_proj.weight"] = r(HEADS * HEAD_DIM, width)
        sd[p + "self_attn.k_proj.weight"] = r(KV_HEADS * HEAD_DIM, width)
        sd[p + "self_attn.v_proj.weight"] = r(KV_HEADS * HEAD_DIM, width)
        sd[p + "self_attn.o_proj.weight"] = r(h, HEADS * HEAD_DIM)
        sd[p + "post_attention_layernorm.weight"] = 1 + r(h)
        sd[p + "mlp.gate_proj.weight"] = r(ffn, h)
        sd[p + "mlp.up_proj.weight"] = r(ffn, h)
        sd[p + "mlp.down_proj.weight"] = r(h, ffn)
    return sd


def head_config(fmt: str, layers: int = 1, draft_vocab: int = 200, **extra: Any) -> dict[str, Any]:
    """A head's config.json (a Llama config, as the published heads ship)."""
    cfg: dict[str, Any] = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=HIDDEN,
                               intermediate_size=96, num_hidden_layers=layers, num_attention_heads=HEADS,
                               num_key_value_heads=KV_HEADS, vocab_size=VOCAB, rms_norm_eps=1e-6,
                               max_position_embeddings=MAX_POS, rope_theta=10000.0, bias=True)
    if fmt == "eagle3":
        cfg["architectures"] = ["LlamaForCausalLMEagle3"]
        cfg["draft_vocab_size"] = draft_vocab
    return {**cfg, **extra}


def save_head(folder: Path, fmt: str, layers: int = 1, draft_vocab: int = 200, seed: int = 1,
              tensors: dict[str, torch.Tensor] | None = None, **config: Any) -> Path:
    """A random head saved as ``model.safetensors`` + ``config.json`` into ``folder``."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    sd = tensors if tensors is not None else head_tensors(fmt, seed, layers, draft_vocab)
    save_file(sd, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(head_config(fmt, layers, draft_vocab, **config)))
    return folder


def oracle(folder: Path, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
    """transformers' greedy ``generate`` of each prompt (float64, its default attention), on a
    copy loaded apart from the engine's."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()
    out = []
    for p in prompts:
        ids = torch.tensor([list(p)])
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=max_new_tokens)
        out.append(gen[0, len(p):].tolist())
    return out
