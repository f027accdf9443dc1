"""build_tree against a slow per-request reference written here, and the chain closed form."""

from __future__ import annotations

import pytest
import torch
from draft_support import draft_loop, tree_lists
from hypothesis import given, settings
from hypothesis import strategies as st

from draftgraph.runtime import build_tree as build
from draftgraph.runtime import fast_topk, organize_draft_results, select_top_k_tokens
from draftgraph.runtime.config import max_tree_candidates
from draftgraph.runtime.testing import TinyDraftModel

MODEL = TinyDraftModel(vocab_size=40, hidden_size=12, seed=5)


def drafted(b, k, s, n, seed):
    gen = torch.Generator().manual_seed(seed)
    topk_p, topk_index = fast_topk(torch.softmax(torch.randn(b, 40, generator=gen), -1), k, -1)
    hidden = torch.randn(b, 12, generator=gen)
    steps = draft_loop(select_top_k_tokens, MODEL, topk_p, topk_index, hidden, s, k)
    return organize_draft_results(*tree_lists(steps), n)


def slow_reference(verified, parent_list, top_idx, tokens, seq_len, k, n):
    """Per request, plain Python: parent node by search, then depth, mask and links."""
    cand = top_idx.tolist()
    plist = parent_list.tolist()
    parent = [-1]
    for c in cand:
        slot = c // k
        if slot == 0:
            parent.append(0)
        else:
            parent.append(cand.index(plist[slot]) + 1)
    depth = [0] * n
    mask = [[False] * n for _ in range(n)]
    for i in range(n):
        j = i
        while j != -1:
            mask[i][j] = True
            j = parent[j]
        depth[i] = sum(mask[i]) - 1
    children = {i: [j for j in range(1, n) if parent[j] == i] for i in range(n)}
    next_token = [children[i][0] if children[i] else -1 for i in range(n)]
    next_sib = [-1] * n
    for kids in children.values():
        for a, b in zip(kids, kids[1:]):
            next_sib[a] = b
    return {
        "tokens": [verified] + tokens.tolist(),
        "positions": [seq_len + d for d in depth],
        "parents": parent,
        "mask": mask,
        "next_token": next_token,
        "next_sibling": next_sib,
    }


@st.composite
def shapes(draw):
    k = draw(st.integers(1, 5))
    s = draw(st.integers(1, 5))
    n = s + 1 if k == 1 else draw(st.integers(2, max_tree_candidates(s, k) + 1))
    return draw(st.integers(1, 4)), k, s, n, draw(st.integers(0, 9999))


@settings(max_examples=60, deadline=None)
@given(shapes())
def test_build_tree_matches_slow_reference(shape):
    b, k, s, n = shape[:4]
    parent_list, top_idx, tokens = drafted(*shape)
    verified = torch.arange(100, 100 + b)
    seq_lens = torch.arange(7, 7 + b)
    tree = build(verified, parent_list, top_idx, tokens, seq_lens, k, s, n)
    assert tree.tokens.shape == (b * n,) and tree.positions.shape == (b * n,)
    for r in range(b):
        ref = slow_reference(int(verified[r]), parent_list[r], top_idx[r], tokens[r],
                             int(seq_lens[r]), k, n)
        rows = slice(r * n, (r + 1) * n)
        assert tree.tokens[rows].tolist() == ref["tokens"]
        assert tree.positions[rows].tolist() == ref["positions"]
        assert tree.parents[r].tolist() == ref["parents"]
        assert tree.tree_mask[r].tolist() == ref["mask"]
        assert tree.retrieve_next_token[r].tolist() == ref["next_token"]
        assert tree.retrieve_next_sibling[r].tolist() == ref["next_sibling"]
        assert tree.retrieve_index[r].tolist() == list(range(r * n, (r + 1) * n))


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 6), st.integers(1, 7))
def test_chain_closed_form(b, s):
    n = s + 1
    parent_list, top_idx, tokens = drafted(b, 1, s, n, seed=b * 10 + s)
    seq_lens = torch.full((b,), 30)
    tree = build(torch.zeros(b, dtype=torch.long), parent_list, top_idx, tokens, seq_lens, 1, s, n)
    causal = torch.tril(torch.ones(n, n, dtype=torch.bool))
    assert torch.equal(tree.tree_mask, causal.expand(b, n, n))
    assert tree.retrieve_next_token.tolist() == [list(range(1, n)) + [-1]] * b
    assert tree.retrieve_next_sibling.tolist() == [[-1] * n] * b
    assert tree.positions.view(b, n).tolist() == [list(range(30, 30 + n))] * b


def test_unselected_parent_is_reported():
    # candidate 3 (slot 1 -> parent candidate 0) selected without candidate 0
    parent_list = torch.tensor([[-1, 0, 1]])
    top_idx = torch.tensor([[1, 3]])
    tokens = torch.tensor([[5, 6]])
    with pytest.raises(ValueError, match=r"top_scores_index\[0, 1\] = 3 \(request 0, node 2\): its "
                                         r"parent candidate parent_list\[0, 1\] = 0 was not selected"):
        build(torch.tensor([1]), parent_list, top_idx, tokens, torch.tensor([4]), 2, 2, 3)
    # validate=False: the kernel's answer, node 2 left out of the retrieval tree
    tree = build(torch.tensor([1]), parent_list, top_idx, tokens, torch.tensor([4]), 2, 2, 3,
                 validate=False)
    assert tree.parents.tolist() == [[-1, 0, -1]]
    assert tree.retrieve_next_token.tolist() == [[1, -1, -1]]
    assert tree.positions.tolist() == [4, 5, 5]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_build_tree_on_cuda_matches_cpu():
    import random

    from test_tree_kernel import random_case

    fields = ("tokens", "positions", "parents", "tree_mask", "retrieve_index",
              "retrieve_next_token", "retrieve_next_sibling")
    for b, k, s, n in ((3, 1, 4, 5), (4, 4, 3, 9), (2, 2, 5, 12)):
        parent_list, top_idx, tokens = drafted(b, k, s, n, seed=b + k)
        verified, seq_lens = torch.arange(b), torch.full((b,), 9)
        cpu = build(verified, parent_list, top_idx, tokens, seq_lens, k, s, n)
        gpu = build(*(t.cuda() for t in (verified, parent_list, top_idx, tokens, seq_lens)), k, s, n)
        for name in fields:
            assert torch.equal(getattr(cpu, name), getattr(gpu, name).cpu()), name
    rnd = random.Random(0)  # malformed and unsorted inputs, validate=False (issue 20)
    for b, k, s, n in ((3, 2, 4, 9), (2, 3, 3, 12), (4, 1, 6, 4)):
        parents, selected = random_case(rnd, b, k, s, n, mutations=3)
        plist, top_idx = torch.tensor(parents).view(b, -1), torch.tensor(selected)
        args = (torch.arange(b), plist, top_idx, top_idx + 3, torch.full((b,), 9))
        cpu = build(*args, k, s, n, validate=False)
        gpu = build(*(t.cuda() for t in args), k, s, n, validate=False)
        for name in fields:
            assert torch.equal(getattr(cpu, name), getattr(gpu, name).cpu()), name
