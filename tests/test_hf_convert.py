"""The embedded target written as a transformers ``LlamaForCausalLM`` (`hf_convert`): transformers'
own Llama, loaded from the folder in float64, computes the embedded target's function (logits
argmax-identical, ~1e-5 apart at most because transformers' RMSNorm and RoPE run in float32;
equal within 1e-9, measured bitwise, with those two in float64), its greedy ``generate`` equals
`greedy_generate`, and the folder served through `load_target` with the embedded EAGLE head
(`load_embedded`) gives ``generate``'s tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from draftgraph.runtime import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.engine import SpecDecodeEngine
from draftgraph.runtime.models import default_models, greedy_generate
from draftgraph.runtime.models.corpus import held_out_prompts
from draftgraph.runtime.models.hf_convert import llama_config, load_embedded, save_llama

pytestmark = pytest.mark.usefixtures("trained_models")

MAX_NEW = 24


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory, trained_models: None) -> tuple[Path, object, object]:
    """(the folder, the embedded float64 target, its EAGLE head)."""
    target, head = default_models()
    return save_llama(target, tmp_path_factory.mktemp("llama") / "embedded"), target, head


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return [list(p) for p in held_out_prompts(3, seed=5, max_len=60)]


def _hf(folder: Path):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()


def _float64_internals(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers' Llama RMSNorm and rotary embedding evaluated in the input's dtype (they cast
    to float32 whatever the model's dtype)."""
    from transformers.models.llama import modeling_llama as ml

    def norm(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    def rotary(self, x, position_ids):
        cfg = self.config
        dim = cfg.head_dim
        inv = 1.0 / cfg.rope_parameters["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        freqs = position_ids[..., None].double() * inv
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    monkeypatch.setattr(ml.LlamaRMSNorm, "forward", norm)
    monkeypatch.setattr(ml.LlamaRotaryEmbedding, "forward", rotary)


def test_config_maps_the_shape(converted):
    _, target, _ = converted
    c, cfg = llama_config(target), target.cfg
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
            c.intermediate_size, c.vocab_size, c.max_position_embeddings) == \
        (cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_heads, cfg.ffn, cfg.vocab_size, cfg.max_len)
    assert c.rms_norm_eps == target.norm.eps == 1e-5 and not c.tie_word_embeddings
    assert c.rope_parameters["rope_theta"] == 10000.0


@torch.no_grad()
def test_logits_match_the_embedded_target(converted, prompts):
    folder, target, _ = converted
    model = _hf(folder)
    for p in prompts:
        ids = torch.tensor([p])
        got, want = model(ids).logits[0], target.train_forward(ids)[0][0]
        assert torch.equal(got.argmax(-1), want.argmax(-1))
        # transformers' RMSNorm and RoPE angles are float32 even in a float64 model
        assert torch.allclose(got, want, rtol=0, atol=2e-5), (got - want).abs().max()


@torch.no_grad()
def test_logits_exact_with_float64_norm_and_rope(converted, prompts, monkeypatch):
    """The mapping itself is exact: with transformers' two float32 pieces in float64 the logits
    agree to rounding."""
    folder, target, _ = converted
    _float64_internals(monkeypatch)
    model = _hf(folder)
    for p in prompts:
        ids = torch.tensor([p])
        got, want = model(ids).logits[0], target.train_forward(ids)[0][0]
        assert torch.allclose(got, want, rtol=0, atol=1e-9), (got - want).abs().max()


def _generate(model, prompts: list[list[int]], n: int) -> list[list[int]]:
    out = []
    for p in prompts:
        ids = torch.tensor([p])
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n)
        out.append(gen[0, len(p):].tolist())
    return out


@pytest.fixture(scope="module")
def hf_greedy(converted, prompts) -> list[list[int]]:
    return _generate(_hf(converted[0]), prompts, MAX_NEW)


def test_generate_equals_greedy_generate(converted, prompts, hf_greedy):
    assert hf_greedy == greedy_generate(converted[1], prompts, MAX_NEW)


@pytest.mark.parametrize("backend", ["eager", "trace"])
def test_engine_serves_the_folder_with_the_embedded_head(converted, prompts, hf_greedy, backend):
    folder, _, head = converted
    target, draft = load_embedded(folder, head, "float64", max_len=128)
    assert target.cfg.feature_layers == (target.cfg.n_layers,)  # the pre-norm last-layer output
    args = RuntimeArgs(SpeculativeConfig(3, 1), CudaGraphConfig(PhaseGraphConfig(bs=(4,))), max_running_requests=4)
    engine = SpecDecodeEngine(args, target, draft, backend=backend, capture="blocking")
    try:
        assert engine.generate(prompts, MAX_NEW) == hf_greedy
        assert engine.stats()["accept_length_mean"] > 1.5  # the trained head still drafts well
    finally:
        engine.close()


def test_load_embedded_refuses_a_head_of_another_shape(converted, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    folder, _, head = converted
    other = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                        num_attention_heads=4, max_position_embeddings=256)
    LlamaForCausalLM(other).save_pretrained(tmp_path / "other")
    with pytest.raises(ValueError, match="hidden 64, vocabulary 300; the head was trained for hidden 192"):
        load_embedded(tmp_path / "other", head)
