"""The alarm for a draft that does not fit its target: the first drafted token accepted in under
5% of the verifies of the acceptance window gives one warning naming the likely causes, counted
in stats and metrics, then quiet until the rate recovers."""

from __future__ import annotations

import logging

import pytest

from draftgraph.runtime.engine import AcceptanceWatch
from draftgraph.runtime.engine.acceptance import AcceptanceMonitor


def _feed(monitor: AcceptanceMonitor, rates: list[float]) -> None:
    for r in rates:
        monitor.observe(1.0 + r, 0, r)


def test_warns_once_while_the_first_token_rate_stays_low(caplog):
    monitor = AcceptanceMonitor(AcceptanceWatch(window_steps=4))
    with caplog.at_level(logging.WARNING, logger="draftgraph.runtime.engine.acceptance"):
        _feed(monitor, [0.5] * 4)
        assert not monitor.misfit and monitor.as_dict()["first_token_rate"] == 0.5
        _feed(monitor, [0.0] * 8)
        assert monitor.misfit and monitor.misfit_warnings == 1
        _feed(monitor, [1.0] * 4)
        assert not monitor.misfit
        _feed(monitor, [0.0] * 4)
    assert monitor.misfit_warnings == 2
    lines = [r.getMessage() for r in caplog.records if "does not fit its target" in r.getMessage()]
    assert len(lines) == 2 and "EAGLE-3 layers off by one" in lines[0] and "0.0% of the verifies" in lines[0]
    assert monitor.as_dict()["misfit_warnings"] == 2


def test_not_watched_without_a_rate_and_before_the_window_fills():
    monitor = AcceptanceMonitor(AcceptanceWatch(window_steps=4))
    monitor.observe(1.0, 0)  # no rate given: the first-token watch sees nothing
    _feed(monitor, [0.0] * 3)
    assert not monitor.misfit and monitor.as_dict()["first_token_rate"] is None


@pytest.mark.parametrize("bad", [-0.1, 1.5, True, "0.05"])
def test_min_first_token_rate_is_checked(bad):
    with pytest.raises(ValueError, match="min_first_token_rate"):
        AcceptanceWatch(min_first_token_rate=bad)
