"""The soak benchmark, short (issue 25): 2,000 requests through one engine, each result taken
with pop_result, keep the live tensor count flat (a count, not a time) and sampled outputs
equal to greedy decoding."""

from __future__ import annotations

import importlib
import pathlib

import pytest

pytestmark = pytest.mark.slow  # the slow tier (make test-all, CI): the soak, 2,000 requests

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _bench(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))  # scripts/ is a package at the repository root
    return importlib.import_module("scripts.bench_soak")


def test_two_thousand_requests_keep_live_tensors_flat(monkeypatch):
    bench = _bench(monkeypatch)
    res = bench.soak(2_000, every=500)
    counts = [t for _, t, _ in res["checkpoints"]]
    assert [n for n, _, _ in res["checkpoints"]] == [500, 1000, 1500, 2000]
    assert counts == [counts[0]] * 4, counts  # nothing kept per request
    assert res["failed"] == 0 and len(res["samples"]) >= 20
    assert bench.check_samples(res["target"], res["samples"]) == 0


def test_the_soak_sees_a_leak(monkeypatch):
    """The count is able to fail: an engine that keeps one tensor per finished request shows it."""
    bench = _bench(monkeypatch)
    import torch

    from draftgraph.runtime.engine import SpecDecodeEngine
    kept: list[torch.Tensor] = []
    real = SpecDecodeEngine.pop_result

    def leaky(self, rid):
        kept.append(torch.zeros(1))
        return real(self, rid)

    monkeypatch.setattr(SpecDecodeEngine, "pop_result", leaky)
    res = bench.soak(300, every=100)
    counts = [t for _, t, _ in res["checkpoints"]]
    assert counts[2] - counts[0] == 200
