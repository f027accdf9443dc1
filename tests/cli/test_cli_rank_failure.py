"""A rank that stops ends `simulate --world-size` with one line per failed rank and exit 2, never
a raw traceback (issue 49, point 4)."""

from __future__ import annotations

from draftgraph.runtime.ranks.launch import RankLaunchError

TRACEBACK = ("raised:\nTraceback (most recent call last):\n  File \"x.py\", line 1, in f\n"
             "draftgraph.runtime.ranks.coordinator.RankDivergenceError: rank 1 diverged from the leader at step 8\n")


def test_a_failed_rank_is_one_line_and_exit_2(monkeypatch, capsys):
    import draftgraph.runtime as runtime
    from draftgraph.runtime.commands import cli

    def failing(world_size, fn, args=(), timeout_s=0.0, **kw):
        raise RankLaunchError("1 of 2 ranks failed", {1: TRACEBACK}, {0: {}})

    monkeypatch.setattr(runtime, "spawn_ranks", failing)
    assert cli.main(["simulate", "--world-size", "2", "--backend", "eager", "--requests", "1"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == ["draftgraph: error: simulate --world-size 2: rank 1 stopped: "
                                "draftgraph.runtime.ranks.coordinator.RankDivergenceError: rank 1 diverged "
                                "from the leader at step 8"]
