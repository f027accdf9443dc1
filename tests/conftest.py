"""Shared fixtures: the SGLang reference (differential oracle) and small helpers."""

from __future__ import annotations

import os
import threading
import types
import warnings

# SGLang wraps select_top_k_tokens' later steps in torch.compile; eagerly it is bitwise the same
# (see shared/sglang-oracle.md) and skips a multi-second CPU compile per shape.
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
# The compiled-code store is off unless a test turns it on (tests/test_compile_store*.py): a
# test that counts compiles must not load what an earlier test stored.
os.environ.setdefault("DRAFTGRAPH_COMPILED", "0")

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _capture_threads_finish_within_their_test():
    """A background capture thread a test started finishes before the next test runs, so no
    test measures memory or time beside another test's captures (bounded: a hang fails)."""
    yield
    for t in threading.enumerate():
        if t.name == "draftgraph-capture":
            t.join(180)
            assert not t.is_alive(), "a draftgraph capture thread outlived its test by 180 s"


@pytest.fixture(scope="session")
def sglang_ref() -> types.SimpleNamespace:
    """SGLang 0.5.23's select_top_k_tokens and organize_draft_results, or a skip with the reason.

    With DRAFTGRAPH_REQUIRE_SGLANG=1 (CI) a missing reference is an error, not a skip.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from sglang.srt.speculative import eagle_utils, spec_utils
    except Exception as exc:  # ImportError, or an import-time failure of its dependencies
        if os.environ.get("DRAFTGRAPH_REQUIRE_SGLANG") == "1":
            raise
        pytest.skip(f"SGLang reference not importable (pip install --no-deps sglang==0.5.23 "
                    f"plus requirements-oracle.txt): {exc!r}")
    return types.SimpleNamespace(
        select_top_k_tokens=spec_utils.select_top_k_tokens,
        organize_draft_results=eagle_utils.organize_draft_results,
    )


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
