"""The shapes of the embedded default models, as transformers and published-head configs.

The default target is a transformers ``LlamaForCausalLM`` (grouped-query attention: 4 query
heads over 2 K/V heads) over the byte tokenizer; its draft is an EAGLE-3 head in the published
layout (SpecForge / SGLang / vLLM key names) reading the residual streams after layers 1, 3
and 5 (``eagle_aux_hidden_state_layer_ids``; the streams entering layers 2, 4 and 6, the last
one being the last layer's output before the final norm), with a draft vocabulary of the
`DRAFT_VOCAB` bytes the target writes most (``d2t`` maps them back). Both are built from these
functions at first use (`training`), saved with ``save_pretrained`` and loaded back through the
user's path (`hf_models.load_models`).
"""

from __future__ import annotations

from typing import Any

from .tokenizer import VOCAB_SIZE

__all__ = ["DRAFT_VOCAB", "EAGLE3_LAYER_IDS", "MAX_LEN", "head_config", "spec_dict", "target_config"]

DIM = 192
LAYERS = 6
HEADS = 4
KV_HEADS = 2
FFN = 512
MAX_LEN = 512
ROPE_THETA = 10000.0
EPS = 1e-5
HEAD_FFN = 384
DRAFT_VOCAB = 128
EAGLE3_LAYER_IDS = (1, 3, 5)  # layer outputs, i.e. the streams entering layers 2, 4 and 6


def target_config(layers: int = LAYERS) -> Any:
    """The default target's ``LlamaConfig`` (``layers`` decoder layers; the assistant model of
    `scripts/bench_hf.py` uses one)."""
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=DIM, intermediate_size=FFN, num_hidden_layers=layers,
                       num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=DIM // HEADS,
                       vocab_size=VOCAB_SIZE, max_position_embeddings=MAX_LEN, rms_norm_eps=EPS,
                       rope_theta=ROPE_THETA, tie_word_embeddings=False, attention_bias=False,
                       bos_token_id=None, eos_token_id=None, pad_token_id=None,
                       architectures=["LlamaForCausalLM"])


def head_config() -> Any:
    """The default EAGLE-3 head's config: one Llama decoder layer of the target's width, the
    layers it reads and its draft vocabulary (the keys SpecForge writes)."""
    from transformers import LlamaConfig

    config = LlamaConfig(hidden_size=DIM, intermediate_size=HEAD_FFN, num_hidden_layers=1,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=DIM // HEADS,
                         vocab_size=VOCAB_SIZE, max_position_embeddings=MAX_LEN, rms_norm_eps=EPS,
                         rope_theta=ROPE_THETA, tie_word_embeddings=False, attention_bias=False,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None,
                         architectures=["LlamaForCausalLMEagle3"])
    config.draft_vocab_size = DRAFT_VOCAB
    config.eagle_config = {"eagle_aux_hidden_state_layer_ids": list(EAGLE3_LAYER_IDS)}
    return config


def spec_dict() -> dict[str, Any]:
    """Everything above as plain values (part of the model cache key)."""
    return {"dim": DIM, "layers": LAYERS, "heads": HEADS, "kv_heads": KV_HEADS, "ffn": FFN, "max_len": MAX_LEN,
            "rope_theta": ROPE_THETA, "eps": EPS, "head_ffn": HEAD_FFN, "draft_vocab": DRAFT_VOCAB,
            "eagle3_layers": list(EAGLE3_LAYER_IDS), "vocab": VOCAB_SIZE}
