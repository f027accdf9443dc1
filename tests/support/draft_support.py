"""Small helpers of the worker, topology and SGLang tests: bitwise tensor equality and the EAGLE
draft loop written out (per step ``select`` then a model forward), with the lists organize takes."""

from __future__ import annotations

import torch


def assert_same(a: torch.Tensor, b: torch.Tensor, what: str = "") -> None:
    """Bitwise equality with dtype and shape."""
    assert a.dtype == b.dtype, f"{what}: dtype {a.dtype} != {b.dtype}"
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    assert torch.equal(a, b), f"{what}: values differ"


def draft_loop(select, model, topk_p, topk_index, hidden, num_steps, topk, probs_hook=None):
    """The EAGLE draft loop written out for tests: per step ``select`` then a model forward.

    Returns one (input_ids, hidden, scores, tree_info) record per step; ``probs_hook`` may
    transform the probabilities (e.g. coarsen them to force ties).
    """
    from draftgraph.runtime import fast_topk

    scores, steps = None, []
    for i in range(num_steps):
        ids, hidden, scores, info = select(i, topk_p, topk_index, hidden, scores, topk)
        steps.append((ids, hidden, scores, info))
        if i == num_steps - 1:
            break
        logits, hidden = model(ids, hidden)
        probs = torch.softmax(logits, -1)
        if probs_hook is not None:
            probs = probs_hook(probs)
        topk_p, topk_index = fast_topk(probs, topk, -1)
    return steps


def tree_lists(steps):
    """(score_list, token_list, parents_list) of a draft_loop result, for organize."""
    return tuple([step[3][j] for step in steps] for j in range(3))
