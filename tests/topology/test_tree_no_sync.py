"""The serving path's `build_tree(..., validate=False)` reads nothing on the host (issue 29): on a
chain, a static tree and a general (dynamic) tree drafted by a worker, within and above the
topology buffers' capacity, with and without the result's layout, it makes no host sync and
gives exactly what ``validate=True`` gives."""

from __future__ import annotations

import pytest
import torch

from draftgraph.graphs import GraphCaptureError
from draftgraph.graphs.sync_audit import no_host_sync
from draftgraph.runtime import EagleDraftWorker, RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.testing import TinyDraftModel, make_draft_input
from draftgraph.runtime.topology.verify_tree import build_tree

CAPACITY = 4
FIELDS = ("tokens", "positions", "parents", "tree_mask", "retrieve_index", "retrieve_next_token",
          "retrieve_next_sibling")
SPECS = {
    "chain": SpeculativeConfig(4, 1),
    "static_tree": SpeculativeConfig(3, 4, tree_choices=((0,), (1,), (2,), (0, 0), (0, 1), (1, 0),
                                                         (0, 0, 0))),
    "general_tree": SpeculativeConfig(3, 2, 6),
}
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device")])]


def drafted(spec, b, device):
    """A worker's draft result for b rows and the other build_tree inputs (verified, seq_lens)."""
    args = RuntimeArgs(spec, max_running_requests=CAPACITY, device=device)
    worker = EagleDraftWorker(args, TinyDraftModel(device=device))
    inp = make_draft_input(b, spec.topk, seed=b, device=device)
    result = worker.draft_forward(inp)
    seq_lens = torch.arange(b, device=device, dtype=torch.int32) * 7 + 3
    return result, inp.topk_index[:, 0].clone(), seq_lens


def build(spec, result, verified, seq_lens, validate, layout):
    return build_tree(verified, *result, seq_lens, spec.layout_topk, spec.num_steps,
                      spec.num_draft_tokens, validate, layout=result.layout if layout else None)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("b", [1, CAPACITY, CAPACITY + 3])  # views of the constants, then copies
@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("layout", [True, False], ids=["layout", "no_layout"])
def test_build_tree_without_validation_makes_no_host_sync_and_equals_validated(name, b, layout,
                                                                               device):
    spec = SPECS[name]
    result, verified, seq_lens = drafted(spec, b, device)
    assert (result.layout is None) == (name == "general_tree")
    with no_host_sync():
        fast = build(spec, result, verified, seq_lens, False, layout)
    checked = build(spec, result, verified, seq_lens, True, layout)
    for field in FIELDS:
        got, want = getattr(fast, field), getattr(checked, field)
        assert got.dtype == want.dtype and torch.equal(got, want), field


@pytest.mark.parametrize("name", ["chain", "general_tree"])
def test_the_detector_sees_the_validation_sync(name):
    """``validate=True`` on the general route reads its verdict on the host: the net catches it
    (the test above is not passing for want of a detector)."""
    spec = SPECS[name]
    result, verified, seq_lens = drafted(spec, CAPACITY + 1, "cpu")
    with pytest.raises((GraphCaptureError, AssertionError), match="host sync"), no_host_sync(cuda=False):
        build(spec, result, verified, seq_lens, True, False)


def test_the_detector_sees_a_scalar_read_below_python():
    """An op whose output size depends on values (nonzero: a sync on CUDA) reads nothing through
    a Python-level tensor method; the dispatch net catches it."""
    with pytest.raises(AssertionError, match="host syncs"), no_host_sync(cuda=False):
        torch.arange(3).nonzero()
