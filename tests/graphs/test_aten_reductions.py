"""Reductions kept on ATen's kernels in compiled graphs (graphs/core/aten_reductions.py): the rewrite
leaves the graph's results unchanged, and the compile backend's replay of a graph with RMSNorm
and softmax equals eager to the bit on data other than the capture inputs."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from draftgraph.graphs import GraphCaptureManager
from draftgraph.graphs.compile.inductor import compiler_available
from draftgraph.graphs.core.aten_reductions import keep_aten_reductions

W = torch.linspace(-1.0, 1.0, 48, dtype=torch.float64).reshape(8, 6)


def _norm_softmax(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """RMSNorm, a softmax, a log-softmax and a plain sum over the last dim of x [B, 8]."""
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
    s = h @ W
    return torch.softmax(s, -1), torch.log_softmax(s, -1), s.sum(-1) + s.sum()


def _targets(gm: torch.fx.GraphModule) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def test_rewrite_replaces_each_reduction_and_keeps_the_bits():
    x = torch.randn(5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    gm = make_fx(_norm_softmax)(x)
    new, count = keep_aten_reductions(gm)
    names = _targets(new)
    assert count == 5
    assert sum(n.startswith("draftgraph_aten.") for n in names) == 5
    assert not any(n.split(".")[1] in ("mean", "_softmax", "_log_softmax", "sum") for n in names
                   if n.startswith("aten."))
    want = _norm_softmax(x)
    got = new(x)
    assert all(torch.equal(a, b) for a, b in zip(want, got))


def _rope_table(pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A transformers RoPE table computed in the forward (float32, as Llama's rotary embedding)."""
    inv = 1.0 / (100000 ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64))
    ang = pos.float()[..., None] * inv
    return ang.cos(), ang.sin()


def test_rewrite_keeps_cos_and_sin_on_aten():
    pos = torch.arange(0, 300)[None]
    new, count = keep_aten_reductions(make_fx(_rope_table)(pos))
    names = _targets(new)
    assert count == 2 and {"draftgraph_aten.cos.default", "draftgraph_aten.sin.default"} <= set(names)
    assert all(torch.equal(a, b) for a, b in zip(_rope_table(pos), new(pos)))


def test_forms_with_a_dtype_are_left_alone():
    def f(x: torch.Tensor) -> torch.Tensor:
        return x.sum(-1, dtype=torch.float64)

    gm = make_fx(f)(torch.ones(2, 3))
    new, count = keep_aten_reductions(gm)
    assert count == 0 and new is gm


@pytest.mark.slow
@pytest.mark.skipif(not compiler_available(), reason="no C++ compiler for inductor")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_compiled_replay_equals_eager_bitwise_on_fresh_data(dtype):
    gen = torch.Generator().manual_seed(1)
    w = W.to(dtype)

    def step(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
        p = torch.softmax(h @ w, -1)
        return p, torch.nn.functional.silu(h) * p.sum(-1, keepdim=True)

    static = {"x": torch.randn(4, 8, dtype=dtype, generator=gen)}
    with torch.no_grad():
        m = GraphCaptureManager(step, static, (4,), backend="compile")
        m.capture()
        assert m.stats.compile_fallbacks == 0 and m.stats.sizes[4].engine == "inductor"
        for _ in range(3):
            x = torch.randn(4, 8, dtype=dtype, generator=gen) * 3
            want = step(x)
            got = m.run({"x": x}, clone=True)
            assert all(torch.equal(a, b) for a, b in zip(want, got))


@pytest.mark.slow
@pytest.mark.skipif(not compiler_available(), reason="no C++ compiler for inductor")
def test_compiled_rope_table_equals_eager_bitwise():
    """Inductor's own cos / sin differ from ATen's in the last bit on these positions (the
    SmolLM2 verify kept its FX replay for it); kept on ATen, the compiled table is eager's."""
    static = {"pos": torch.arange(200, 204)[None].repeat(4, 1)}
    with torch.no_grad():
        m = GraphCaptureManager(_rope_table, static, (4,), backend="compile")
        m.capture()
        assert m.stats.compile_fallbacks == 0 and m.stats.sizes[4].engine == "inductor"
        for start in (0, 37, 291):
            pos = torch.arange(start, start + 4)[None].repeat(4, 1) + torch.arange(4)[:, None] * 5
            want = _rope_table(pos)
            got = m.run({"pos": pos}, clone=True)
            assert all(torch.equal(a, b) for a, b in zip(want, got))
