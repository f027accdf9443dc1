"""The embedded default on the user's road (issue 42 item 4): the trained target is a transformers
checkpoint that transformers itself loads and decodes, its head is a folder in the published
EAGLE-3 layout, the engine serving them equals transformers' own ``generate``, and a damaged
checkpoint folder is written again from the cached weights."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from engine_support import MAX_NEW, build_engine, prompts, reference
from test_model_cache import TINY  # the tiny plan (its empty cache folder: the `cache` fixture)

from draftgraph.runtime.models import defaults

# the published EAGLE-3 key layout (SpecForge, SGLang's and vLLM's loaders)
EAGLE3_KEYS = {"fc.weight", "midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight",
               "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight",
               "midlayer.self_attn.v_proj.weight", "midlayer.self_attn.o_proj.weight",
               "midlayer.post_attention_layernorm.weight", "midlayer.mlp.gate_proj.weight",
               "midlayer.mlp.up_proj.weight", "midlayer.mlp.down_proj.weight", "norm.weight", "lm_head.weight",
               "d2t", "t2d"}


def test_transformers_generate_on_the_default_checkpoint_equals_the_engine():
    from transformers import AutoModelForCausalLM

    target_dir, _ = defaults.default_checkpoints()
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float64).eval()
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.num_key_value_heads == 2
    engine = build_engine(backend="eager")
    ps = [list(p) for p in prompts()[:4]]
    try:
        served = engine.generate(ps, MAX_NEW)
    finally:
        engine.close()
    for i, p in enumerate(ps):
        out = model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=0,
                             eos_token_id=None)
        assert out[0, len(p):].tolist() == served[i] == reference()[i], f"prompt {i}"
    assert engine.stats()["accept_length_mean"] > 2.0  # the head really drafts for this target


def test_the_default_head_is_in_the_published_eagle3_layout():
    from safetensors import safe_open

    _, head_dir = defaults.default_checkpoints()
    config = json.loads((head_dir / "config.json").read_text())
    assert config["draft_vocab_size"] == 128
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 5]
    with safe_open(str(head_dir / "model.safetensors"), framework="pt") as fh:
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}
    assert set(tensors) == EAGLE3_KEYS
    assert tuple(tensors["fc.weight"].shape) == (192, 3 * 192) and tuple(tensors["lm_head.weight"].shape) == (128, 192)
    assert tuple(tensors["midlayer.self_attn.q_proj.weight"].shape) == (192, 2 * 192)  # cat(embed, hidden)
    ids = torch.arange(128) + tensors["d2t"]
    assert bool((ids[1:] > ids[:-1]).all()) and 0 <= int(ids.min()) and int(ids.max()) < 260
    assert int(tensors["t2d"].sum()) == 128 and bool(tensors["t2d"][ids].all())


@pytest.mark.usefixtures("cache")  # an empty DRAFTGRAPH_CACHE (models/conftest.py)
def test_a_damaged_checkpoint_folder_is_written_again(caplog):
    defaults.default_models(plan=TINY)
    target_dir, _ = defaults.default_checkpoints(plan=TINY)
    weights = target_dir / "model.safetensors"
    raw = weights.read_bytes()
    weights.write_bytes(raw[: len(raw) // 2])  # a copy cut short
    with caplog.at_level(logging.WARNING, logger=defaults.__name__):
        target, head = defaults.default_models(plan=TINY)
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "damaged" in record.getMessage() and "writing it again" in record.getMessage()
    assert weights.read_bytes() == raw and type(head).__name__ == "Eagle3Head"  # one class per format
