"""A head that does not fit its target accepts about nothing: the first drafted token's acceptance
under 5% over the window is warned about once (naming the likely causes) and counted."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from engine_support import engine_args, models, prompts

from draftgraph.runtime import SpeculativeConfig
from draftgraph.runtime.engine import SpecDecodeEngine
from draftgraph.runtime.engine.acceptance import AcceptanceMonitor, AcceptanceWatch
from draftgraph.runtime.models import greedy_generate


def test_the_first_token_rate_is_counted_per_request_over_the_window(caplog):
    monitor = AcceptanceMonitor(AcceptanceWatch(window_steps=4, min_first_token_rate=0.25))
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            monitor.observe(1.0, 0, (0, 4))
        assert monitor.first_token_rate() is None and monitor.misfit_warnings == 0  # window not full yet
        monitor.observe(2.0, 0, (4, 4))  # 4 of 16 requests: 25%, not under 25%
        assert monitor.first_token_rate() == pytest.approx(0.25) and not monitor.misfit
        monitor.observe(1.0, 0, (0, 4))  # the window slides: 4 of 16 still (the first step left)
        monitor.observe(1.0, 0, (0, 4))
        assert monitor.first_token_rate() == pytest.approx(4 / 16)
        monitor.observe(1.0, 0, (0, 4))
        monitor.observe(1.0, 0, (0, 4))  # 0 of 16
        assert monitor.misfit and monitor.misfit_warnings == 1
        monitor.observe(1.0, 0, (0, 4))  # still low: no second warning
    assert monitor.misfit_warnings == 1
    assert caplog.text.count("accepts about nothing") == 1 and "EAGLE-3" in caplog.text
    for _ in range(4):
        monitor.observe(3.0, 1, (4, 4))
    assert not monitor.misfit and monitor.as_dict()["first_token_rate"] == 1.0


@pytest.mark.parametrize("rate", [-0.1, 1.5, "5%", True])
def test_a_bad_threshold_is_refused_naming_the_field(rate):
    with pytest.raises(ValueError, match="min_first_token_rate"):
        AcceptanceWatch(min_first_token_rate=rate)


def _engine(head, watch):
    target, _ = models()
    return SpecDecodeEngine(engine_args(SpeculativeConfig(3, 1)), target, head, backend="eager",
                            acceptance_watch=watch)


def test_a_scrambled_head_is_flagged_and_counted_and_a_fitting_one_is_not(caplog):
    from prometheus_client import CollectorRegistry

    from draftgraph.runtime.engine.metrics import register_engine_metrics

    _, head = models()
    watch = AcceptanceWatch(window_steps=8)
    good = _engine(head, watch)
    wrong = copy.deepcopy(head)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():  # a head for another model: its weights shuffled
        for p in wrong.parameters():
            if p.dim() >= 2:
                p.copy_(p.flatten()[torch.randperm(p.numel(), generator=gen)].view_as(p))
    bad = _engine(wrong, watch)
    registry = CollectorRegistry()
    register_engine_metrics(bad, registry)
    batch = [list(p) for p in prompts()[:4]]
    with caplog.at_level(logging.WARNING):
        good_out = good.generate(batch, 48)
        assert "accepts about nothing" not in caplog.text
        bad_out = bad.generate(batch, 48)
    assert good_out == bad_out == greedy_generate(models()[0], batch, 48)  # lossless: only speed is lost
    assert good.stats()["acceptance_watch"]["misfit_warnings"] == 0
    st = bad.stats()["acceptance_watch"]
    assert st["misfit_warnings"] == 1 and st["first_token_rate"] < 0.05, st
    assert "accepts about nothing" in caplog.text
    assert registry.get_sample_value("draftgraph_draft_misfit_warnings_total") == 1
