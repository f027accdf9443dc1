"""`SamplingParams` checks its fields (naming field, value and rule) and the keyed uniforms are a
pure function of (seed, position, column): in (0, 1), uniform, and the same in and out of a
traced graph."""

from __future__ import annotations

import pytest
import torch

from draftgraph.runtime import SamplingParams
from draftgraph.runtime.sampling import SamplingRows, choose_tokens, keyed_uniform


@pytest.mark.parametrize("kw,error,match", [
    ({"temperature": -0.1}, ValueError, "temperature=-0.1: must be >= 0"),
    ({"temperature": float("nan")}, ValueError, "temperature=nan: must be finite"),
    ({"temperature": "hot"}, TypeError, "temperature='hot': must be a number"),
    ({"top_p": 0.0}, ValueError, r"top_p=0.0: must be in \(0, 1\]"),
    ({"top_p": 1.5}, ValueError, r"top_p=1.5: must be in \(0, 1\]"),
    ({"top_k": -1}, ValueError, "top_k=-1: must be >= 0"),
    ({"top_k": 2.0}, TypeError, "top_k=2.0: must be an int"),
    ({"min_p": 1.2}, ValueError, r"min_p=1.2: must be in \[0, 1\]"),
    ({"seed": -3}, ValueError, r"seed=-3: must be in \[0, 2\*\*63 - 1\]"),
    ({"seed": 2**63}, ValueError, "seed=9223372036854775808"),
    ({"seed": True}, TypeError, "seed=True: must be an int or None"),
])
def test_bad_fields_are_refused_by_name(kw, error, match):
    with pytest.raises(error, match=match):
        SamplingParams(**kw)


def test_params_are_frozen_and_greedy_means_temperature_zero():
    p = SamplingParams(0.0)
    assert p.greedy and not SamplingParams().greedy
    with pytest.raises(AttributeError):
        p.temperature = 1.0  # type: ignore[misc]
    assert SamplingParams(0.7, top_k=3).with_seed(9) == SamplingParams(0.7, top_k=3, seed=9)


def test_uniforms_are_keyed_open_and_uniform():
    seed = torch.tensor([0, 1, 2**40 + 3, 2**63 - 1])
    pos = torch.tensor([[0, 1], [0, 1], [5, 6], [7, 7]])
    u = keyed_uniform(seed, pos, 5000)
    assert u.dtype == torch.float64 and bool((u > 0).all()) and bool((u < 1).all())
    # a pure function: recomputed, or for one row alone, the same numbers
    assert torch.equal(u, keyed_uniform(seed, pos, 5000))
    assert torch.equal(u[2:3], keyed_uniform(seed[2:3], pos[2:3], 5000))
    # every key differs: another seed, another position, another column
    assert not torch.equal(u[0, 0], u[1, 0]) and not torch.equal(u[0, 0], u[0, 1])
    assert not torch.equal(u[3, 0], u[3, 1][torch.arange(5000).roll(1)])
    flat = u.flatten()
    assert abs(float(flat.mean()) - 0.5) < 0.005 and abs(float(flat.var()) - 1 / 12) < 0.002
    hist = torch.histc(flat.float(), bins=20, min=0, max=1)
    assert float(hist.min()) > 0.9 * flat.numel() / 20  # no bin starved


def test_choose_inside_a_trace_equals_eager():
    """The draw is ordinary tensor ops: make_fx records it and the replay gives the same tokens."""
    from torch.fx.experimental.proxy_tensor import make_fx

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 3, 50, generator=g, dtype=torch.float64)
    pos = torch.arange(12).view(4, 3)
    rows = SamplingRows.of([SamplingParams(1.0, seed=1), SamplingParams(0.0), SamplingParams(0.5, top_k=5, seed=2),
                            SamplingParams(1.0, top_p=0.5, min_p=0.1, seed=3)], "cpu")

    def f(lg, ps, t, tp, tk, mp, sd):
        return choose_tokens(lg, ps, SamplingRows(t, tp, tk, mp, sd))

    args = (logits, pos, rows.temperature, rows.top_p, rows.top_k, rows.min_p, rows.seed)
    gm = make_fx(f)(*args)
    assert torch.equal(gm(*args), f(*args))
    assert torch.equal(f(*args)[1], logits[1].argmax(-1))  # the greedy row: the argmax
