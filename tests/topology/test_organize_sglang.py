"""Differential tests: select_top_k_tokens / organize_draft_results against SGLang 0.5.23."""

from __future__ import annotations

import torch
from draft_support import assert_same, draft_loop, tree_lists
from hypothesis import given, settings
from hypothesis import strategies as st

from draftgraph.runtime import fast_topk, organize_draft_results, select_top_k_tokens
from draftgraph.runtime.config import max_tree_candidates
from draftgraph.runtime.testing import TinyDraftModel
from draftgraph.runtime.topology.organize import organize_chain_steps

MODEL = TinyDraftModel(vocab_size=48, hidden_size=16, seed=3)


@st.composite
def draft_shapes(draw):
    k = draw(st.integers(1, 8))
    s = draw(st.integers(1, 6))
    b = draw(st.integers(1, 5))
    n = s + 1 if k == 1 else draw(st.integers(2, max_tree_candidates(s, k) + 1))
    return b, k, s, n, draw(st.integers(0, 2**16)), draw(st.booleans())


def run_loop(select, b, k, s, seed, coarse):
    """Draft loop over the tiny model with ``select``; coarse probabilities force score ties."""
    gen = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(b, MODEL.vocab_size, generator=gen), -1)
    hook = (lambda p: torch.round(p * 16) / 16) if coarse else None
    if hook is not None:
        probs = hook(probs)
    topk_p, topk_index = fast_topk(probs, k, -1)
    hidden = torch.randn(b, MODEL.hidden_size, generator=gen)
    return draft_loop(select, MODEL, topk_p, topk_index, hidden, s, k, hook)


@settings(max_examples=60, deadline=None)
@given(draft_shapes())
def test_select_and_organize_match_sglang(sglang_ref, shape):
    b, k, s, n, seed, coarse = shape
    ours = run_loop(select_top_k_tokens, b, k, s, seed, coarse)
    ref = run_loop(sglang_ref.select_top_k_tokens, b, k, s, seed, coarse)
    for i, (a, r) in enumerate(zip(ours, ref)):
        assert_same(a[0], r[0], f"step {i} input_ids")
        assert_same(a[1], r[1], f"step {i} hidden")
        assert_same(a[2], r[2], f"step {i} scores")
        for j in range(3):
            assert_same(a[3][j], r[3][j], f"step {i} tree_info[{j}]")
    lists = tree_lists(ours)
    got = organize_draft_results(*lists, n)
    want = sglang_ref.organize_draft_results(*lists, n)
    for j, name in enumerate(("parent_list", "top_scores_index", "draft_tokens")):
        assert_same(got[j], want[j], name)
    assert got[0].shape == (b, 0 if s == 1 else 1 + (s - 1) * k)
    assert got[1].shape == (b, n - 1)


def sglang_chain_organize(ref, topk_p, topk_index, s, n):
    """SGLang's multi-layer general path, composed from its two public functions."""
    _, _, _, info = ref.select_top_k_tokens(0, topk_p, topk_index, None, None, 1)
    if s == 1:
        return ref.organize_draft_results([info[0]], [info[1]], [info[2]], n)
    b = topk_index.shape[0]
    scores = [info[0][:, :, i].unsqueeze(-1) for i in range(s)]
    tokens = [info[1][:, i].unsqueeze(-1) for i in range(s)]
    parents = [info[2]] + [torch.full((b, 1), i, dtype=torch.long) for i in range(1, s)]
    return ref.organize_draft_results(scores, tokens, parents, n)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 64), st.integers(1, 8), st.integers(0, 1000))
def test_chain_general_path_matches_sglang(sglang_ref, b, s, seed):
    gen = torch.Generator().manual_seed(seed)
    topk_p = torch.rand(b, s, generator=gen)
    topk_index = torch.randint(0, 1000, (b, s), generator=gen)
    got = organize_chain_steps(topk_p, topk_index, None, s, s + 1)
    want = sglang_chain_organize(sglang_ref, topk_p, topk_index, s, s + 1)
    for j in range(3):
        assert_same(got[j], want[j], f"output {j}")
