"""Debug mode: the worker checks draft inputs (ids in range, no NaN) and names the request row."""

from __future__ import annotations

import pytest
import torch

from draftgraph.runtime import DraftInput, EagleDraftWorker, RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.testing import TinyDraftModel


def _worker(monkeypatch, debug: str) -> EagleDraftWorker:
    monkeypatch.setenv("DRAFTGRAPH_DEBUG", debug)
    return EagleDraftWorker(RuntimeArgs(SpeculativeConfig(2, 2, 4)), TinyDraftModel(vocab_size=64))


def _input(ids, hidden=None):
    idx = torch.tensor(ids)
    return DraftInput(torch.full(idx.shape, 0.5), idx, hidden if hidden is not None else torch.zeros(len(ids), 32))


@pytest.mark.parametrize("ids,row", [([[1, 2], [3, 64]], 1), ([[-1, 2], [3, 4]], 0)])
def test_out_of_range_ids_name_the_row(monkeypatch, ids, row):
    w = _worker(monkeypatch, "1")
    with pytest.raises(ValueError, match=rf"topk_index row {row} .*\[0, 64\)"):
        w.draft_forward(_input(ids))


def test_nan_hidden_names_the_row(monkeypatch):
    w = _worker(monkeypatch, "1")
    hidden = torch.zeros(3, 32)
    hidden[2, 5] = float("nan")
    with pytest.raises(ValueError, match="hidden_states row 2: contains NaN"):
        w.draft_forward(_input([[1, 2], [3, 4], [5, 6]], hidden))


def test_off_without_debug(monkeypatch):
    w = _worker(monkeypatch, "0")
    assert not w.drafting.debug_checks
    w.draft_forward(_input([[1, 2], [3, 4]]))  # valid input runs
