"""The "auto" speed check times the replay and the eager step in alternating pairs: a load that
changes during the measurement slows both sides of a round alike, so the verdict follows the
steps' own costs (a fake clock stands in for the machine)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from draftgraph.graphs.compile import speed


class _LoadedMachine:
    """A clock and two steps: ``slow`` costs 1.5 units, ``fast`` 1 unit, times the machine's load
    (1 for the first ``quiet_calls`` calls, ``busy`` after: another process started)."""

    def __init__(self, quiet_calls: int, busy: float) -> None:
        self.now = 0.0
        self.calls = 0
        self.quiet_calls = quiet_calls
        self.busy = busy

    def _run(self, cost: float) -> None:
        load = 1.0 if self.calls < self.quiet_calls else self.busy
        self.calls += 1
        self.now += cost * load

    def slow(self) -> None:
        self._run(1.5)

    def fast(self) -> None:
        self._run(1.0)

    def perf_counter(self) -> float:
        return self.now


@pytest.mark.parametrize("quiet_calls", [0, 5, 9, 12, 19, 100])
def test_the_slower_step_is_found_slower_whenever_the_load_changes(monkeypatch, quiet_calls):
    machine = _LoadedMachine(quiet_calls, busy=5.0)
    monkeypatch.setattr(speed, "time", SimpleNamespace(perf_counter=machine.perf_counter))
    a_s, b_s, ratio = speed.paired_seconds(machine.slow, machine.fast, rounds=9)
    assert ratio == pytest.approx(1.5)  # every round ran both at one load: 1.5 / 1
    assert machine.calls == 2 + 2 * 9

