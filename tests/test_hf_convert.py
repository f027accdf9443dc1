"""The embedded target as a transformers checkpoint, served with the trained embedded EAGLE head:
real acceptance (accepted tree nodes, so the K/V commit moves them) through the transformers
target path. Expected tokens: transformers' ``generate`` on the saved checkpoint, loaded apart.

And the conversion's exactness: transformers' own Llama, loaded from the folder in float64, gives
logits argmax-identical to the embedded target's (~1e-5 apart at most: transformers' RMSNorm and
RoPE run in float32) and equal within 1e-9 (measured: bitwise) with those two in float64; its
greedy ``generate`` equals `greedy_generate`."""

from __future__ import annotations

import pytest
import torch
from engine_support import models, prompts
from hf_support import oracle

from draftgraph.runtime import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.engine import SpecDecodeEngine
from draftgraph.runtime.models import greedy_generate
from draftgraph.runtime.models.corpus import held_out_prompts
from draftgraph.runtime.models.hf_convert import llama_config, save_transformers
from draftgraph.runtime.models.hf_load import load_target

MAX_NEW = 24
TREE = SpeculativeConfig(3, 2, tree_choices=((0,), (1,), (0, 0), (1, 0), (0, 0, 0)))


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory):
    """(the checkpoint folder, generate's tokens for 6 held-out prompts)."""
    target, _ = models()
    folder = save_transformers(target, tmp_path_factory.mktemp("embedded") / "llama")
    picked = [list(p) for p in prompts()[:6]]
    return folder, picked, oracle(folder, picked, MAX_NEW)


@pytest.mark.parametrize("spec, backend", [(SpeculativeConfig(3, 1), "eager"), (TREE, "eager"), (TREE, "trace")])
def test_embedded_head_drafts_for_the_converted_target(converted, spec, backend):
    folder, picked, want = converted
    target = load_target(folder, "float64", max_len=models()[0].cfg.max_len)
    _, head = models()
    args = RuntimeArgs(spec, CudaGraphConfig(PhaseGraphConfig(bs=(4,))), max_running_requests=4)
    phases = ("verify", "extend") if backend != "eager" else None
    engine = SpecDecodeEngine(args, target, head, backend=backend, capture="blocking", graph_phases=phases)
    try:
        assert engine.generate(picked, MAX_NEW) == want
        stats = engine.stats()
        assert stats["accept_length_mean"] > 2.0  # the trained head drafts well: real accepted paths committed
    finally:
        engine.close()


@pytest.fixture(scope="module")
def embedded(converted) -> tuple:
    """(the float64 transformers model loaded from the folder, the embedded target, 3 held-out prompts)."""
    from transformers import LlamaForCausalLM

    picked = [list(p) for p in held_out_prompts(3, seed=5, max_len=60)]
    return LlamaForCausalLM.from_pretrained(converted[0], dtype=torch.float64).eval(), models()[0], picked


def test_config_maps_the_shape(embedded):
    _, target, _ = embedded
    c, cfg = llama_config(target), target.cfg
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
            c.intermediate_size, c.vocab_size, c.max_position_embeddings) == \
        (cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_heads, cfg.ffn, cfg.vocab_size, cfg.max_len)
    assert c.rms_norm_eps == target.norm.eps == 1e-5 and not c.tie_word_embeddings
    assert c.rope_parameters["rope_theta"] == 10000.0


@torch.no_grad()
def test_logits_match_the_embedded_target(embedded):
    model, target, picked = embedded
    for p in picked:
        ids = torch.tensor([p])
        got, want = model(ids).logits[0], target.train_forward(ids)[0][0]
        assert torch.equal(got.argmax(-1), want.argmax(-1))
        # transformers' RMSNorm and RoPE angles are float32 even in a float64 model
        assert torch.allclose(got, want, rtol=0, atol=2e-5), (got - want).abs().max()


def _float64_internals(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers' Llama RMSNorm and rotary embedding evaluated in the input's dtype (they cast
    to float32 whatever the model's dtype)."""
    from transformers.models.llama import modeling_llama as ml

    def norm(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    def rotary(self, x, position_ids):
        dim = self.config.head_dim
        inv = 1.0 / self.config.rope_parameters["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        freqs = position_ids[..., None].double() * inv
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    monkeypatch.setattr(ml.LlamaRMSNorm, "forward", norm)
    monkeypatch.setattr(ml.LlamaRotaryEmbedding, "forward", rotary)


@torch.no_grad()
def test_logits_exact_with_float64_norm_and_rope(embedded, monkeypatch):
    """The mapping itself is exact: with transformers' two float32 pieces in float64 the logits
    agree to rounding."""
    model, target, picked = embedded
    _float64_internals(monkeypatch)
    for p in picked:
        ids = torch.tensor([p])
        got, want = model(ids).logits[0], target.train_forward(ids)[0][0]
        assert torch.allclose(got, want, rtol=0, atol=1e-9), (got - want).abs().max()


def test_generate_equals_greedy_generate(embedded):
    model, target, picked = embedded
    out = []
    for p in picked:
        ids = torch.tensor([p])
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=MAX_NEW)
        out.append(gen[0, len(p):].tolist())
    assert out == greedy_generate(target, picked, MAX_NEW)
