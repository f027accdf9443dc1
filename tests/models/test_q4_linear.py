"""A target computed from Q4_1 codes (`--weights q4`): the codes come back exactly from a dense
checkpoint that a Q4_1 dequantization made, the int4 product is the dense product within
bfloat16's error, other weights are refused, and the engine serving a q4 target equals that q4
target's own greedy decoding (eager, and with the draft, verify and extend graphs). The same for
a Q8_0 output layer computed as two int4 halves.

The Q4_1 and Q8_0 tensors are made by gguf-py's own quantizer and dequantizer (what llama.cpp's
files hold), not by the code under test.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from hf_support import save_head, target_config

from draftgraph.runtime import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.engine import SpecDecodeEngine
from draftgraph.runtime.engine.loading import resolve_models
from draftgraph.runtime.models.greedy import greedy_generate
from draftgraph.runtime.models.hf_load import load_target
from draftgraph.runtime.models.hf_models import load_models
from draftgraph.runtime.models.q4_linear import Float32Linear, Q4Linear, Q8Linear, recover_q4_1, recover_q8_0

Q4_1 = GGMLQuantizationType.Q4_1
Q8_0 = GGMLQuantizationType.Q8_0
PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], [11, 250, 3, 3, 3, 3, 9, 40, 41]]
MAX_NEW = 12


def gguf_round_trip(w: torch.Tensor, kind: GGMLQuantizationType = Q4_1) -> torch.Tensor:
    """``w`` through gguf-py's quantizer of ``kind`` and back (float32)."""
    return torch.from_numpy(dequantize(quantize(w.float().numpy().astype(np.float32), kind), kind).copy())


def gguf_q4_1(w: torch.Tensor) -> torch.Tensor:
    return gguf_round_trip(w, Q4_1)


def save_q4_target(folder: Path, seed: int = 0, output_q8: bool = True) -> Path:
    """A 4-layer tiny Llama whose decoder linears hold Q4_1-dequantized weights and whose lm_head
    holds Q8_0-dequantized ones (as a GGUF's tensors would; ``output_q8=False``: a dense lm_head)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(target_config("llama", 4))
    with torch.no_grad():
        for name, mod in model.named_modules():
            if isinstance(mod, torch.nn.Linear):
                if not name.endswith("lm_head"):
                    mod.weight.copy_(gguf_q4_1(mod.weight))
                elif output_q8:
                    mod.weight.copy_(gguf_round_trip(mod.weight, Q8_0))
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("q4")
    return {"q4": save_q4_target(root / "q4"), "q4_dense_out": save_q4_target(root / "q4d", output_q8=False),
            "head": save_head(root / "head", "eagle3", draft_vocab=200)}


def test_codes_come_back_exactly_and_the_product_is_close():
    w = torch.randn(96, 128) * 0.1
    dense = gguf_q4_1(w)
    codes, scale, minimum = recover_q4_1(dense)
    assert codes.dtype == torch.int32 and int(codes.min()) >= 0 and int(codes.max()) <= 15
    back = (codes.view(96, 4, 32).float() * scale[..., None] + minimum[..., None]).view(96, 128)
    assert torch.equal(back, dense)  # bit for bit: the file's weights, nothing re-rounded
    layer = Q4Linear(codes, scale, minimum, bias=torch.full((96,), 0.5))
    x = torch.randn(2, 5, 128)
    want = torch.nn.functional.linear(x.double(), dense.double(), torch.full((96,), 0.5, dtype=torch.float64))
    got = layer(x)
    assert got.shape == (2, 5, 96) and got.dtype == torch.float32
    err = (got.double() - want).abs().max().item()
    assert err < 0.03 * want.abs().max().item()  # bf16 activations and scales: ~3 significant digits
    assert err > 0  # and it is the int4 kernel's result, not the dense product


def test_q8_0_codes_come_back_exactly_and_the_two_halves_are_the_product():
    w = torch.randn(160, 128) * 0.1
    w[3, :32] = 0.0  # an all-zero block (scale 0)
    dense = gguf_round_trip(w, Q8_0)
    codes, scale = recover_q8_0(dense)
    assert codes.dtype == torch.int32 and int(codes.min()) >= -127 and int(codes.max()) <= 127
    assert torch.equal((codes.view(160, 4, 32).float() * scale[..., None]).view(160, 128), dense)
    layer = Q8Linear(codes, scale)
    # the halves' weights are bf16(d) * c: a one-hot row reads one column back, each half's weight
    # rounded to bf16 (c = 16 h + l: an error within 2^-8 of |16 h d| + |l d|, below half a code d)
    eye = torch.eye(128, dtype=torch.float64)
    cols = layer(eye).T  # [160, 128]
    d = scale.bfloat16().double().repeat_interleave(32, 1)
    high = torch.div(codes, 16, rounding_mode="floor").double()
    want = codes.double() * d
    assert ((cols - want).abs() <= 2 ** -8 * (16 * high.abs() + (codes - 16 * high).abs()) * d).all()
    x = torch.randn(3, 7, 128, dtype=torch.float64)
    ref = torch.nn.functional.linear(x, dense.double())
    got = layer(x)
    assert got.shape == (3, 7, 160) and got.dtype == torch.float64
    err = (got - ref).abs().max().item()
    assert 0 < err < 0.02 * ref.abs().max().item()
    # row-invariant: a row's result does not depend on the rows beside it (the engine's losslessness)
    flat = x.reshape(21, 128)
    assert all(torch.equal(layer(flat)[i], layer(flat[i:i + 1])[0]) for i in range(21))


def test_weights_that_are_not_q8_0_are_refused():
    with pytest.raises(ValueError, match="not a Q8_0 tensor"):
        recover_q8_0(torch.randn(32, 64))
    with pytest.raises(ValueError, match="not a Q8_0 tensor"):  # Q4_1 values are not Q8_0 ones
        recover_q8_0(gguf_q4_1(torch.randn(32, 64)))
    with pytest.raises(ValueError, match="multiple of 32"):
        recover_q8_0(torch.randn(32, 40))


def test_weights_that_are_not_q4_1_are_refused(folders, tmp_path):
    with pytest.raises(ValueError, match="not a Q4_1 tensor"):
        recover_q4_1(torch.randn(32, 64))
    with pytest.raises(ValueError, match="multiple of 32"):
        recover_q4_1(torch.randn(32, 48))
    from hf_support import save_target

    dense = save_target(tmp_path / "dense", "llama")
    with pytest.raises(ValueError, match="not a Q4_1 tensor"):
        load_target(dense, "float64", max_len=64, weights="q4")
    with pytest.raises(ValueError, match="keeps its stream in float64"):
        load_target(folders["q4"], "float32", max_len=64, weights="q4")
    with pytest.raises(ValueError, match="weights='int4'"):
        load_target(folders["q4"], "float32", max_len=64, weights="int4")
    with pytest.raises(ValueError, match="--weights='q4'.*toy"):
        resolve_models("toy", None, None, "q4")
    with pytest.raises(ValueError, match="--weights='fp8'"):
        resolve_models("toy", None, None, "fp8")


def test_a_q4_target_is_its_own_identity(folders):
    dense = load_target(folders["q4"], "float64", max_len=64)
    q4 = load_target(folders["q4"], "float64", max_len=64, weights="q4")
    assert dense.cfg.weights == "dense" and q4.cfg.weights == "q4" and dense.cfg != q4.cfg  # graph keys differ
    layers = [m for m in q4.model.model.modules() if isinstance(m, Q4Linear)]  # the decoder's
    assert len(layers) == 4 * 7 and isinstance(q4.model.lm_head, Q8Linear)
    assert isinstance(load_target(folders["q4_dense_out"], "float64", max_len=64, weights="q4").model.lm_head,
                      Float32Linear)  # an output layer that is not Q8_0 stays dense
    a = greedy_generate(dense, PROMPTS, MAX_NEW)
    b = greedy_generate(q4, PROMPTS, MAX_NEW)
    assert sum(x == y for p, q in zip(a, b) for x, y in zip(p, q)) >= 0.5 * sum(map(len, a))  # the same model, roughly


@pytest.mark.parametrize("backend", ["eager", "trace"])
def test_the_engine_on_a_q4_target_equals_its_own_greedy(folders, backend):
    target, head = load_models(folders["q4"], folders["head"], "float64", max_len=96, weights="q4")
    assert target.dtype == torch.float64 and head.dtype == torch.float32  # the draft only proposes
    want = greedy_generate(target, PROMPTS, MAX_NEW)
    spec = SpeculativeConfig(3, 2, tree_choices=((0,), (1,), (0, 0), (1, 0), (0, 0, 0)))
    args = RuntimeArgs(spec, CudaGraphConfig(PhaseGraphConfig(bs=(4,))), max_running_requests=4)
    phases = ("verify", "extend") if backend != "eager" else None
    engine = SpecDecodeEngine(args, target, head, backend=backend, capture="blocking", graph_phases=phases)
    try:
        assert engine.generate(PROMPTS, MAX_NEW) == want
        assert [greedy_generate(target, [p], MAX_NEW)[0] for p in PROMPTS] == want  # one at a time: the same
        if backend != "eager":
            stats = engine.stats()
            assert stats["eager_steps"] == 0 and stats["phases"]["verify"]["replays"] > 0
    finally:
        engine.close()
