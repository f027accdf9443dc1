"""build_tree on every input SGLang's build_tree_kernel_efficient accepts (issue 20).

Oracles: `tree_kernel_reference.reference_tree` (the kernel's rules as a per-request Python loop)
and SGLang's own Triton kernel under Triton's CPU interpreter (checked against each other too).
Inputs: random parent lists and selections, valid (unsorted rows, any root slot value, chains
exactly num_steps deep) and malformed (parents not selected, cycles, too-deep chains, duplicates,
lookups that would hit the next request's row, negative parent values).
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tree_kernel_reference import KernelTree, expected_error, reference_tree, sglang_triton_tree

from draftgraph.graphs import GraphCaptureManager
from draftgraph.runtime import build_tree

RULE_WORDS = {"range": "out of range", "missing": "was not selected", "cycle": "cycle",
              "deep": "num_steps"}


def _step_of(c: int, k: int) -> int:
    """Draft step of candidate index c (SGLang's layout: k, then k*k per step)."""
    return 0 if c < k else 1 + (c - k) // (k * k)


def _step_range(i: int, k: int) -> range:
    return range(0, k) if i == 0 else range(k + (i - 1) * k * k, k + i * k * k)


def random_case(rnd: random.Random, b: int, k: int, s: int, n: int, mutations: int,
                shuffle: bool = True) -> tuple[list[list[int]], list[list[int]]]:
    """(parent_list [b][W], selected [b][N-1]) in SGLang's layout: a valid tree (every slot's
    value a candidate of the previous step, the selection closed under parents), rows shuffled,
    any root slot value; then ``mutations`` random malformations."""
    width = 1 + (s - 1) * k if s > 1 else 0
    total = k + (s - 1) * k * k
    parents, selected = [], []
    for _ in range(b):
        plist = [rnd.randint(-3, total + 3)] + [
            rnd.choice(_step_range((slot - 1) // k, k)) for slot in range(1, width)
        ]
        kids: dict[int, list[int]] = {}
        for c in range(k, total):
            kids.setdefault(plist[c // k], []).append(c)
        available, sel = list(range(k)), []
        while len(sel) < n - 1:  # every candidate is reachable from step 0: never stuck
            c = available.pop(rnd.randrange(len(available)))
            sel.append(c)
            available += kids.get(c, [])
        if shuffle:
            rnd.shuffle(sel)
        else:
            sel.sort()
        parents.append(plist)
        selected.append(sel)
    for _ in range(mutations if width > 1 else 0):
        r = rnd.randrange(b)
        plist, sel = parents[r], selected[r]
        slot = rnd.randrange(1, width)
        kind = rnd.choice(("unselected", "any", "same_step", "same_step", "self", "next_row", "dup",
                           "negative", "huge"))
        if kind == "unselected":
            plist[slot] = rnd.choice([c for c in range(total) if c not in sel] or [total + 7])
        elif kind == "any":  # a selected candidate of any step: cycles and deep chains
            plist[slot] = rnd.choice(sel)
        elif kind == "same_step":  # a candidate as deep as the slot's children: deep chains
            same = [c for c in sel if _step_of(c, k) == 1 + (slot - 1) // k]
            if same:
                plist[slot] = rnd.choice(same)
        elif kind == "self":
            movable = [c for c in sel if c // k >= 1]
            if movable:
                c = rnd.choice(movable)
                plist[c // k] = c
        elif kind == "next_row":
            plist[slot] = selected[(r + 1) % b][0]
        elif kind == "dup" and len(sel) > 1:
            i, j = rnd.sample(range(len(sel)), 2)
            sel[i] = sel[j]
        elif kind == "negative":
            plist[slot] = rnd.choice((-1, -2, -100))
        else:
            plist[slot] = 10**9 + slot
    return parents, selected


@st.composite
def cases(draw, max_mutations: int = 4, max_n: int = 14):
    """(parent_list, selected, seq_lens, topk, num_steps, N) as lists."""
    k = draw(st.integers(1, 4))
    s = draw(st.integers(1, 5))
    total = k + (s - 1) * k * k
    n = draw(st.integers(2, min(total, max_n - 1) + 1))
    b = draw(st.integers(1, 4))
    mutations = draw(st.integers(0, max_mutations))
    rnd = random.Random(draw(st.integers(0, 2**32 - 1)))
    parents, selected = random_case(rnd, b, k, s, n, mutations, shuffle=draw(st.booleans()))
    seq_lens = [rnd.randint(0, 50) for _ in range(b)]
    return parents, selected, seq_lens, k, s, n


def tensors(parents, selected, seq_lens, dtype=torch.long):
    b = len(selected)
    width = len(parents[0])
    return (torch.tensor(parents, dtype=dtype).view(b, width), torch.tensor(selected, dtype=dtype),
            torch.tensor(seq_lens, dtype=dtype))


def run(parents, selected, seq_lens, k, s, n, validate=False, dtype=torch.long, **kw):
    plist, sel, lens = tensors(parents, selected, seq_lens, dtype)
    b = sel.shape[0]
    verified = torch.arange(100, 100 + b)
    tokens = sel + 1000
    return build_tree(verified, plist, sel, tokens, lens, k, s, n, validate, **kw)


def assert_tree(tree, ref: KernelTree, n: int, parents: bool = True) -> None:
    b = tree.parents.shape[0]
    assert tree.positions.view(b, n).tolist() == ref.positions, "positions"
    assert tree.tree_mask.tolist() == ref.mask, "tree_mask"
    assert tree.retrieve_index.tolist() == ref.retrieve_index, "retrieve_index"
    assert tree.retrieve_next_token.tolist() == ref.next_token, "retrieve_next_token"
    assert tree.retrieve_next_sibling.tolist() == ref.next_sibling, "retrieve_next_sibling"
    if parents:
        assert tree.parents.tolist() == ref.parents, "parents"


def assert_same_kernel_tree(a: KernelTree, b: KernelTree) -> None:
    for name in ("positions", "mask", "retrieve_index", "next_token", "next_sibling"):
        assert getattr(a, name) == getattr(b, name), name


# ---- properties -----------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(cases())
def test_validate_false_is_the_kernel(case):
    parents, selected, seq_lens, k, s, n = case
    for negative_is_root in (False, True):
        tree = run(*case, negative_is_root=negative_is_root)
        assert_tree(tree, reference_tree(parents, selected, seq_lens, k, s, n, negative_is_root), n)


@settings(max_examples=200, deadline=None)
@given(cases())
def test_validate_true_accepts_well_formed_and_names_the_first_problem(case):
    parents, selected, seq_lens, k, s, n = case
    problem = expected_error(parents, selected, k, s)
    if problem is None:
        tree = run(*case, validate=True)
        assert_tree(tree, reference_tree(parents, selected, seq_lens, k, s, n, True), n)
        return
    rule, r, node = problem
    with pytest.raises(ValueError) as err:
        run(*case, validate=True)
    msg = str(err.value)
    assert RULE_WORDS[rule] in msg, msg
    assert f"request {r}, node {node}" in msg, msg


@settings(max_examples=120, deadline=None)
@given(cases(max_mutations=0))
def test_well_formed_inputs_pass_validation(case):
    parents, selected, seq_lens, k, s, n = case
    assert expected_error(parents, selected, k, s) is None
    tree = run(*case, validate=True)
    assert_tree(tree, reference_tree(parents, selected, seq_lens, k, s, n), n)
    # a well-formed tree's mask row is exactly the ancestors: positions = seq_len + row sum - 1
    b = len(selected)
    depth = tree.tree_mask.sum(-1) - 1
    assert torch.equal(tree.positions.view(b, n), torch.tensor(seq_lens).unsqueeze(1) + depth)


@settings(max_examples=40, deadline=None)
@given(cases(max_n=10))
def test_reference_and_build_tree_equal_sglang_triton_kernel(case):
    parents, selected, seq_lens, k, s, n = case
    plist, sel, lens = tensors(parents, selected, seq_lens)
    sglang = sglang_triton_tree(plist, sel, lens, k, s, n)
    assert_same_kernel_tree(reference_tree(parents, selected, seq_lens, k, s, n), sglang)
    assert_tree(run(*case, negative_is_root=False), sglang, n, parents=False)


@settings(max_examples=30, deadline=None)
@given(cases(), st.sampled_from([torch.int32, torch.int64]))
def test_integer_dtypes(case, dtype):
    parents, selected, seq_lens, k, s, n = case
    tree = run(*case, dtype=dtype)
    assert_tree(tree, reference_tree(parents, selected, seq_lens, k, s, n, True), n)
    assert tree.positions.dtype == torch.long


def test_out_of_range_indices_raise_or_stay_in_bounds():
    rnd = random.Random(3)
    for _ in range(50):
        k, s = rnd.randint(1, 3), rnd.randint(1, 4)
        total = k + (s - 1) * k * k
        n = rnd.randint(2, min(total, 8) + 1)
        parents, selected = random_case(rnd, 2, k, s, n, 2)
        # without parent columns (S == 1) any slot hangs off the root: only negatives are bad
        bad = rnd.choice((-1, -k - 1) if s == 1 else (-1, -k - 1, total * 3 + k, 10**6))
        selected[1][rnd.randrange(n - 1)] = bad
        with pytest.raises(ValueError, match="out of range") as err:
            run(parents, selected, [5, 6], k, s, n, validate=True)
        assert "request 1" in str(err.value)
        tree = run(parents, selected, [5, 6], k, s, n)  # unspecified, but no error, no OOB read
        assert tree.tree_mask.shape == (2, n, n) and tree.positions.shape == (2 * n,)


# ---- the bullets, one by one --------------------------------------------------------

# SGLang's organize output for k=2, S=3, N=6: candidate c's slot is c // 2.
PLIST = [-1, 0, 1, 2, 3]  # slot 1 -> cand 0, 2 -> cand 1, 3 -> cand 2, 4 -> cand 3
SEL = [0, 1, 2, 4, 6]  # 0,1 at depth 1; 2 (slot 1: under 0), 4 (slot 2: under 1); 6 (slot 3: under 2)


def test_root_slot_is_never_read():
    base = run([PLIST], [SEL], [10], 2, 3, 6, validate=True)
    assert base.positions.tolist() == [10, 11, 11, 12, 12, 13]
    assert base.tree_mask[0, :, 0].all()
    for root_value in (0, 1, 2, 4, 6, 99, -7):
        for validate in (True, False):
            tree = run([[root_value] + PLIST[1:]], [SEL], [10], 2, 3, 6, validate=validate)
            for name in ("positions", "parents", "tree_mask", "retrieve_next_token",
                         "retrieve_next_sibling"):
                assert torch.equal(getattr(tree, name), getattr(base, name)), (root_value, name)


def test_unsorted_rows_are_the_same_tree_relabelled():
    sorted_tree = run([PLIST], [SEL], [10], 2, 3, 6, validate=True)
    rnd = random.Random(0)
    for _ in range(20):
        perm = list(range(5))
        rnd.shuffle(perm)
        sel = [SEL[p] for p in perm]
        for validate in (True, False):
            tree = run([PLIST], [sel], [10], 2, 3, 6, validate=validate)
            node = [0] + [p + 1 for p in perm]  # new node i holds old node node[i]
            pos = sorted_tree.positions.tolist()
            assert tree.positions.tolist() == [pos[node[i]] for i in range(6)]
            old_mask = sorted_tree.tree_mask[0]
            assert tree.tree_mask[0].tolist() == [[bool(old_mask[node[i], node[j]]) for j in range(6)]
                                                  for i in range(6)]
            parents = tree.parents[0].tolist()
            old_parents = sorted_tree.parents[0].tolist()
            assert [node[p] if p >= 0 else -1 for p in parents] == [old_parents[node[i]] for i in range(6)]


def test_unselected_parent_validate_false_is_the_kernel():
    # candidates 6 and 7 (slot 3 -> candidate 2) selected without candidate 2; 4 (slot 2 ->
    # candidate 1) is fine.
    sel = [0, 1, 4, 6, 7]
    tree = run([PLIST], [sel], [10], 2, 3, 6)
    assert tree.parents[0].tolist() == [-1, 0, 0, 2, -1, -1]
    assert tree.retrieve_next_token[0].tolist() == [1, -1, 3, -1, -1, -1]
    assert tree.retrieve_next_sibling[0].tolist() == [-1, 2, -1, -1, -1, -1]
    assert tree.positions.tolist() == [10, 11, 11, 12, 11, 11]  # the walk stops at the orphan
    assert tree.tree_mask[0, 4].tolist() == [True, False, False, False, True, False]
    with pytest.raises(ValueError, match=r"top_scores_index\[0, 3\] = 6 \(request 0, node 4\).*"
                                         r"parent_list\[0, 3\] = 2 was not selected"):
        run([PLIST], [sel], [10], 2, 3, 6, validate=True)


def test_orphan_with_selected_descendants():
    # node of candidate 2 (slot 1 -> parent_list 99: not selected); candidate 4 (slot 2) under it
    plist = [-1, 99, 2, 5, 3]
    sel = [2, 4, 0, 1]
    tree = run([plist], [sel], [0], 2, 3, 5)
    assert tree.parents[0].tolist() == [-1, -1, 1, 0, 0]
    assert tree.retrieve_next_token[0].tolist() == [3, 2, -1, -1, -1]
    assert tree.retrieve_next_sibling[0].tolist() == [-1, -1, -1, 4, -1]
    assert tree.positions.tolist() == [0, 1, 2, 1, 1]
    assert tree.tree_mask[0, 2].tolist() == [True, True, True, False, False]


@pytest.mark.parametrize("validate", [False, True])
def test_parent_search_never_reads_the_next_request(validate):
    # request 0's candidate 2 wants candidate 1, which only request 1 selected (its first entry)
    parents = [[-1, 1, 0, 0, 0], [-1, 0, 1, 0, 0]]
    selected = [[0, 2, 3], [1, 0, 2]]
    if validate:
        with pytest.raises(ValueError, match=r"request 0, node 2\).*was not selected"):
            run(parents, selected, [3, 4], 2, 3, 4, validate=True)
        return
    tree = run(parents, selected, [3, 4], 2, 3, 4)
    assert tree.parents.tolist() == [[-1, 0, -1, -1], [-1, 0, 0, 2]]
    assert tree.retrieve_next_token.tolist() == [[1, -1, -1, -1], [1, -1, 3, -1]]
    ref = reference_tree(parents, selected, [3, 4], 2, 3, 4)
    assert_tree(tree, ref, 4)


def test_cycles_are_cut_after_num_steps():
    # k=1, S=4: slot = candidate. 1 -> parent_list[1] = 2, 2 -> parent_list[2] = 1: a 2-cycle;
    # 3 -> itself.
    sel = [0, 1, 2, 3]
    for s in (4, 7):  # 7 > N: the cut falls after more rounds than there are nodes
        plist = [-1, 2, 1, 3] + [0] * (s - 4)  # the kernel's width 1 + (S-1)k
        tree = run([plist], [sel], [20], 1, s, 5)
        assert tree.positions.tolist() == [20, 21, 20 + s, 20 + s, 20 + s]
        assert tree.tree_mask[0].tolist() == [
            [True, False, False, False, False],
            [True, True, False, False, False],
            [True, False, True, True, False],
            [True, False, True, True, False],
            [True, False, False, False, True],
        ]
        assert tree.parents[0].tolist() == [-1, 0, 3, 2, 4]
        assert tree.retrieve_next_token[0].tolist() == [1, -1, 3, 2, 4]
        assert_tree(tree, reference_tree([plist], [sel], [20], 1, s, 5), 5)
        with pytest.raises(ValueError, match=r"request 0, node 2\).*\[2, 3, 2\] is a cycle"):
            run([plist], [sel], [20], 1, s, 5, validate=True)


def test_self_parent_and_a_cut_walk_count_num_steps_marks():
    tree = run([[-1, 1, 0]], [[1]], [0], 1, 3, 2)  # node 1 is its own parent
    assert tree.positions.tolist() == [0, 3]
    assert tree.tree_mask[0].tolist() == [[True, False], [True, True]]
    assert tree.retrieve_next_token[0].tolist() == [-1, 1]
    with pytest.raises(ValueError, match="cycle"):
        run([[-1, 1, 0]], [[1]], [0], 1, 3, 2, validate=True)


def test_chains_exactly_num_steps_deep_pass_and_deeper_ones_are_cut():
    # k=1 chain of S=4 nodes: parent_list [-1, 0, 1, 2], selection 0..3
    chain = run([[-1, 0, 1, 2]], [[0, 1, 2, 3]], [5], 1, 4, 5, validate=True)
    assert chain.positions.tolist() == [5, 6, 7, 8, 9]
    assert chain.tree_mask[0].tolist() == torch.tril(torch.ones(5, 5, dtype=torch.bool)).tolist()
    # k=2, S=2: slot 2 (candidates 4, 5) points at candidate 2 of the same step: 4 -> 2 -> 0 is
    # three nodes deep, one more than num_steps. The kernel cuts the walk after two marks.
    deep = ([[-1, 0, 2]], [[0, 2, 4]], [5], 2, 2, 4)
    cut = run(*deep)
    assert cut.parents[0].tolist() == [-1, 0, 1, 2]
    assert cut.positions.tolist() == [5, 6, 7, 7]
    assert cut.tree_mask[0, 3].tolist() == [True, False, True, True]
    with pytest.raises(ValueError, match=r"request 0, node 3\).*has 3 nodes; a node is at most "
                                         r"num_steps = 2 deep"):
        run(*deep, validate=True)


def test_duplicate_selection_first_occurrence_is_the_parent():
    # candidate 0 selected twice (nodes 1 and 3): 2 (slot 1 -> 0) hangs under node 1
    tree = run([PLIST], [[0, 2, 0, 1, 4]], [0], 2, 3, 6, validate=True)
    assert tree.parents[0].tolist() == [-1, 0, 1, 0, 0, 4]
    assert tree.retrieve_next_token[0].tolist() == [1, 2, -1, -1, 5, -1]
    assert tree.retrieve_next_sibling[0].tolist() == [-1, 3, -1, 4, -1, -1]


def test_negative_parent_value_is_the_root_unless_asked_for_the_kernel():
    # static layout (topk 1): nodes 0 and 1 at depth 1 (parent -1), node 2 under node 0
    plist, sel = [[-1, -1, 0]], [[0, 1, 2]]
    static = run(plist, sel, [0], 1, 2, 4, validate=True)
    assert static.parents[0].tolist() == [-1, 0, 0, 1]
    assert static.retrieve_next_token[0].tolist() == [1, 3, -1, -1]
    assert static.retrieve_next_sibling[0].tolist() == [-1, 2, -1, -1]
    kernel = run(plist, sel, [0], 1, 2, 4, negative_is_root=False)
    assert kernel.parents[0].tolist() == [-1, 0, -1, 1]  # the kernel finds no candidate -1
    assert kernel.retrieve_next_token[0].tolist() == [1, 3, -1, -1]
    assert kernel.retrieve_next_sibling[0].tolist() == [-1, -1, -1, -1]
    for name in ("positions", "tree_mask"):  # the same mask and positions either way
        assert torch.equal(getattr(static, name), getattr(kernel, name)), name
    with pytest.raises(ValueError, match="not selected"):
        run(plist, sel, [0], 1, 2, 4, validate=True, negative_is_root=False)


def test_single_step_has_no_parent_columns():
    tree = run([[]], [[2, 0, 1]], [4], 3, 1, 4, validate=True)
    assert tree.parents[0].tolist() == [-1, 0, 0, 0]
    assert tree.retrieve_next_token[0].tolist() == [1, -1, -1, -1]
    assert tree.retrieve_next_sibling[0].tolist() == [-1, 2, 3, -1]
    assert tree.positions.tolist() == [4, 5, 5, 5]
    # no parent column: every node hangs off the root, whatever its slot (depth-1 static trees)
    flat = run([[]], [[3, 0, 1]], [4], 1, 1, 4, validate=True)
    assert flat.parents[0].tolist() == [-1, 0, 0, 0]
    with pytest.raises(ValueError, match="out of range"):
        run([[]], [[-1, 0, 1]], [4], 3, 1, 4, validate=True)


def test_argument_errors_name_the_field():
    ok = dict(parents=[PLIST], selected=[SEL], seq_lens=[1], k=2, s=3, n=6)
    for field, value, exc in (("k", 0, ValueError), ("k", 2.0, TypeError), ("s", 0, ValueError),
                              ("n", True, TypeError)):
        args = dict(ok, **{field: value})
        with pytest.raises(exc, match={"k": "topk", "s": "num_steps", "n": "num_draft_tokens"}[field]):
            run(**args)
    plist, sel, lens = tensors([PLIST], [SEL], [1])
    tok = sel + 1
    with pytest.raises(TypeError, match="top_scores_index dtype"):
        build_tree(torch.tensor([1]), plist, sel.float(), tok, lens, 2, 3, 6)
    with pytest.raises(TypeError, match="parent_list dtype"):
        build_tree(torch.tensor([1]), plist.bool(), sel, tok, lens, 2, 3, 6)
    with pytest.raises(ValueError, match="parent_list"):
        build_tree(torch.tensor([1]), plist.repeat(2, 1), sel, tok, lens, 2, 3, 6)


# ---- SGLang's published vectors -------------------------------------------------------------

# SGLang's test_build_tree_kernel_efficient (topk 4, depth 4, 8 draft tokens, seq_lens 5 and 10):
# the organize outputs of its score/token/parent lists, and the outputs it asserts.
PUB_PARENTS = [[-1, 0, 1, 2, 3, 4, 8, 9, 10, 20, 24, 21, 28],
               [-1, 0, 1, 2, 3, 4, 5, 6, 7, 24, 28, 20, 21]]
PUB_INDEX = [[0, 1, 4, 8, 20, 24, 36], [0, 4, 5, 6, 7, 24, 36]]
PUB_TOKENS = [[29896, 29906, 29889, 29974, 29946, 29896, 29946],
              [13, 22550, 4136, 16492, 8439, 29871, 29941]]
PUB_POSITIONS = [5, 6, 6, 7, 7, 8, 8, 9, 10, 11, 12, 12, 12, 12, 13, 14]
PUB_NEXT = [[1, 3, 4, 5, 6, 7, -1, -1], [1, 2, -1, 6, -1, -1, 7, -1]]
PUB_SIBLING = [[-1, 2, -1, -1, -1, -1, -1, -1], [-1, -1, 3, 4, 5, -1, -1, -1]]
# root-to-leaf paths of the same tree (the older build_tree_kernel's retrive_index rows)
PUB_PATHS = [[[0, 2, 4, 6], [0, 1, 3, 5, 7]], [[0, 1, 2], [0, 1, 4], [0, 1, 5], [0, 1, 3, 6, 7]]]


@pytest.mark.parametrize("validate", [True, False])
def test_sglang_published_vector(validate):
    tree = build_tree(torch.tensor([29974, 13]), torch.tensor(PUB_PARENTS), torch.tensor(PUB_INDEX),
                      torch.tensor(PUB_TOKENS), torch.tensor([5, 10]), 4, 4, 8, validate)
    assert tree.positions.tolist() == PUB_POSITIONS
    assert tree.retrieve_index.tolist() == [list(range(8)), list(range(8, 16))]
    assert tree.retrieve_next_token.tolist() == PUB_NEXT
    assert tree.retrieve_next_sibling.tolist() == PUB_SIBLING
    assert tree.tokens.tolist() == [29974, *PUB_TOKENS[0], 13, *PUB_TOKENS[1]]
    for r, paths in enumerate(PUB_PATHS):
        for path in paths:
            for d, node in enumerate(path):
                row = [j in path[:d + 1] for j in range(8)]
                assert tree.tree_mask[r, node].tolist() == row, (r, node)


def test_sglang_published_vector_unsorted_and_any_root_slot():
    perm = [5, 2, 0, 6, 3, 1, 4]
    plist = torch.tensor(PUB_PARENTS)
    plist[:, 0] = torch.tensor([3, 0])
    index = torch.tensor(PUB_INDEX)[:, perm]
    tree = build_tree(torch.tensor([29974, 13]), plist, index, torch.tensor(PUB_TOKENS)[:, perm],
                      torch.tensor([5, 10]), 4, 4, 8)
    node = [0] + [p + 1 for p in perm]
    pos = torch.tensor(PUB_POSITIONS).view(2, 8)
    assert tree.positions.view(2, 8).tolist() == pos[:, node].tolist()
    ref = reference_tree(plist.tolist(), index.tolist(), [5, 10], 4, 4, 8)
    assert_tree(tree, ref, 8)


def test_sglang_cpu_chain_vector():
    """SGLang's CPU topk-1 chain test passes parent_list [0, 1] (the root slot holds 0, slot 1
    holds 1). Its asserted positions hold; by the kernel's rules node 2 (candidate 1, slot 1 ->
    candidate 1) is its own parent, so retrieve_next_token is [1, -1, 2], not the [1, 2, -1]
    that test asserts (SGLang's Triton kernel gives [1, -1, 2] too)."""
    args = (torch.tensor([7, 9]), torch.tensor([[0, 1], [0, 1]]), torch.tensor([[0, 1], [0, 1]]),
            torch.tensor([[11, 12], [21, 22]]), torch.tensor([5, 8]), 1, 2, 3)
    tree = build_tree(*args, validate=False)
    assert tree.positions.tolist() == [5, 6, 7, 8, 9, 10]
    assert tree.retrieve_index.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert tree.retrieve_next_sibling.tolist() == [[-1, -1, -1], [-1, -1, -1]]
    assert tree.tokens.tolist() == [7, 11, 12, 9, 21, 22]
    assert tree.retrieve_next_token.tolist() == [[1, -1, 2], [1, -1, 2]]
    with pytest.raises(ValueError, match="cycle"):
        build_tree(*args)
    # the chain as SGLang's organize writes it: parent_list [-1, 0]
    chain = build_tree(args[0], torch.tensor([[-1, 0], [-1, 0]]), *args[2:])
    assert chain.positions.tolist() == [5, 6, 7, 8, 9, 10]
    assert chain.retrieve_next_token.tolist() == [[1, 2, -1], [1, 2, -1]]


def test_sglang_cpu_chain_vector_on_the_triton_kernel():
    got = sglang_triton_tree(torch.tensor([[0, 1], [0, 1]]), torch.tensor([[0, 1], [0, 1]]),
                             torch.tensor([5, 8]), 1, 2, 3)
    assert got.next_token == [[1, -1, 2], [1, -1, 2]]
    assert got.positions == [[5, 6, 7], [8, 9, 10]]


# ---- captured: the trace backend ------------------------------------------------------------


def test_captured_build_tree_replays_malformed_inputs_like_eager():
    k, s, n, sizes = 2, 4, 9, (2, 4)
    width = 1 + (s - 1) * k

    def step(verified, parent_list, top_scores_index, tokens, seq_lens):
        b = verified.shape[0]
        t = build_tree(verified, parent_list, top_scores_index, tokens, seq_lens, k, s, n,
                       validate=False)
        return (t.tokens.view(b, n), t.positions.view(b, n), t.parents, t.tree_mask,
                t.retrieve_index, t.retrieve_next_token, t.retrieve_next_sibling)

    def batch(b, seed):
        rnd = random.Random(seed)
        parents, selected = random_case(rnd, b, k, s, n, mutations=3)
        plist, sel, lens = tensors(parents, selected, [rnd.randint(0, 30) for _ in range(b)])
        return {"verified": torch.arange(b), "parent_list": plist, "top_scores_index": sel,
                "tokens": sel + 7, "seq_lens": lens}

    static = {name: t.new_zeros((max(sizes), *t.shape[1:])) for name, t in batch(4, 0).items()}
    assert static["parent_list"].shape[1] == width
    manager = GraphCaptureManager(step, static, sizes, backend="trace")
    manager.capture()
    assert all(manager.node_count(size) for size in sizes)
    for seed in range(1, 25):
        b = 1 + seed % 4
        inputs = batch(b, seed)
        got = manager.run(inputs, clone=True)
        want = step(**inputs)
        for name, g, w in zip(("tokens", "positions", "parents", "tree_mask", "retrieve_index",
                               "retrieve_next_token", "retrieve_next_sibling"), got, want):
            assert torch.equal(g, w), (seed, name)
    manager.release()
