"""Every validation rule of the configuration, messages included (also under python -O)."""

from __future__ import annotations

import types

import pytest

from draftgraph.runtime import (
    ConfigTypeError,
    CudaGraphConfig,
    PhaseGraphConfig,
    RuntimeArgs,
    SpeculativeConfig,
    chain_capacity,
    runtime_args_from_sglang,
)

SPEC_CASES = [
    # (kwargs, exception, message fragment)
    (dict(num_steps=3.0, topk=1), ConfigTypeError, "num_steps=3.0 (float): must be an int"),
    (dict(num_steps=True, topk=1), ConfigTypeError, "num_steps=True (bool): must be an int"),
    (dict(num_steps=3, topk="1"), ConfigTypeError, "topk='1' (str): must be an int"),
    (dict(num_steps=3, topk=2, num_draft_tokens=4.5), ConfigTypeError,
     "num_draft_tokens=4.5 (float): must be an int"),
    (dict(num_steps=0, topk=1), ValueError, "num_steps=0: must be >= 1"),
    (dict(num_steps=3, topk=0), ValueError, "topk=0: must be >= 1"),
    (dict(num_steps=3, topk=1, num_draft_tokens=3), ValueError,
     "num_draft_tokens == num_steps + 1 = 4"),
    (dict(num_steps=3, topk=2, num_draft_tokens=1), ValueError, "num_draft_tokens=1: must be >= 2"),
    (dict(num_steps=2, topk=2, num_draft_tokens=8), ValueError,
     "must be <= topk + (num_steps - 1) * topk^2 = 6"),
    (dict(num_steps=3, topk=2), ValueError, "required when topk > 1"),
]


@pytest.mark.parametrize("kwargs,exc,fragment", SPEC_CASES)
def test_speculative_config_rules(kwargs, exc, fragment):
    with pytest.raises(exc) as info:
        SpeculativeConfig(**kwargs)
    assert fragment in str(info.value)


def test_type_errors_are_also_value_errors():
    with pytest.raises(ValueError):
        SpeculativeConfig(num_steps="3", topk=1)
    with pytest.raises(TypeError):
        SpeculativeConfig(num_steps="3", topk=1)


def test_chain_default_and_tree_bound_edge():
    assert SpeculativeConfig(4, 1).num_draft_tokens == 5
    # the bound itself is allowed: N - 1 == k + (S-1) k^2
    assert SpeculativeConfig(3, 2, 2 + 2 * 4 + 1).num_draft_tokens == 11
    with pytest.raises(ValueError):
        SpeculativeConfig(3, 2, 12)


PHASE_CASES = [
    (dict(max_bs=0), ValueError, "cuda_graph_config.decode.max_bs=0: must be >= 1"),
    (dict(max_bs=2.0), ConfigTypeError, "cuda_graph_config.decode.max_bs=2.0 (float)"),
    (dict(bs=(4, 2)), ValueError, "must be sorted ascending and unique"),
    (dict(bs=(2, 2)), ValueError, "must be sorted ascending and unique"),
    (dict(bs=(1, -2)), ValueError, "cuda_graph_config.decode.bs[1]=-2: must be >= 1"),
    (dict(bs=()), ValueError, "must not be empty"),
    (dict(bs="12"), ConfigTypeError, "must be a sequence of ints"),
    (dict(bs=(1, 2, 4), max_bs=8), ValueError, "must equal max(bs)=4"),
    (dict(disabled="no"), ConfigTypeError, "disabled='no': must be a bool"),
]


@pytest.mark.parametrize("kwargs,exc,fragment", PHASE_CASES)
def test_phase_graph_config_rules(kwargs, exc, fragment):
    with pytest.raises(exc) as info:
        PhaseGraphConfig(**kwargs)
    assert fragment in str(info.value)


def test_phase_config_derives_max_bs_from_bs():
    p = PhaseGraphConfig(bs=[1, 2, 4, 16])
    assert p.bs == (1, 2, 4, 16) and p.max_bs == 16


def test_runtime_args_rules():
    spec = SpeculativeConfig(3, 1)
    with pytest.raises(ConfigTypeError, match="speculative=.*must be a SpeculativeConfig"):
        RuntimeArgs(speculative=(3, 1))
    with pytest.raises(ValueError, match="max_running_requests=0: must be >= 1"):
        RuntimeArgs(spec, max_running_requests=0)
    with pytest.raises(ConfigTypeError, match="cuda_graph_config=.*must be a CudaGraphConfig"):
        RuntimeArgs(spec, cuda_graph_config={"decode": {}})
    with pytest.raises(ValueError, match="device='gpu0'"):
        RuntimeArgs(spec, device="gpu0")
    with pytest.raises(ConfigTypeError, match="cuda_graph_config.decode="):
        CudaGraphConfig(decode={"max_bs": 4})


@pytest.mark.parametrize("max_bs,mrr,expected", [(None, None, 1), (64, None, 64), (None, 48, 48),
                                                  (16, 48, 48), (160, 48, 160)])
def test_chain_capacity(max_bs, mrr, expected):
    args = RuntimeArgs(SpeculativeConfig(3, 1), CudaGraphConfig(PhaseGraphConfig(max_bs=max_bs)),
                       max_running_requests=mrr)
    assert chain_capacity(args) == expected


def test_from_sglang_new_and_old_layouts():
    new = types.SimpleNamespace(
        speculative_num_steps=3, speculative_eagle_topk=4, speculative_num_draft_tokens=8,
        max_running_requests=32,
        cuda_graph_config=types.SimpleNamespace(decode=types.SimpleNamespace(max_bs=24, bs=None)),
    )
    a = runtime_args_from_sglang(new)
    assert a.speculative == SpeculativeConfig(3, 4, 8)
    assert a.decode.max_bs == 24 and a.max_running_requests == 32 and chain_capacity(a) == 32
    old = types.SimpleNamespace(
        speculative_num_steps=2, speculative_eagle_topk=1, speculative_num_draft_tokens=None,
        max_running_requests=None, cuda_graph_max_bs=None, cuda_graph_bs=[1, 2, 8],
    )
    b = runtime_args_from_sglang(old)
    assert b.speculative.num_draft_tokens == 3 and b.decode.bs == (1, 2, 8) and b.decode.max_bs == 8
    bad = types.SimpleNamespace(speculative_num_steps=2, speculative_eagle_topk=1,
                                speculative_num_draft_tokens=5)
    with pytest.raises(ValueError, match="num_draft_tokens=5"):
        runtime_args_from_sglang(bad)


def test_frozen():
    spec = SpeculativeConfig(3, 1)
    with pytest.raises(AttributeError):
        spec.num_steps = 4  # type: ignore[misc]


def test_validation_survives_python_O(python_O):
    """Every rule above, run again with asserts stripped (python -O)."""
    checked = python_O.rules("test_config", {"draftgraph.runtime.config.SpeculativeConfig": "SPEC_CASES",
                                             "draftgraph.runtime.config.PhaseGraphConfig": "PHASE_CASES"})
    assert checked == len(SPEC_CASES) + len(PHASE_CASES)
