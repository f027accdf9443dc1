"""Speculation schedules: S follows the batch size (0: plain decoding), each band's states capture
only its sizes, outputs stay greedy's across band changes, and speculation resumes cleanly."""

from __future__ import annotations

import json

import pytest
from engine_support import models, prompts

from draftgraph.runtime import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.args_file import runtime_args_from_dict
from draftgraph.runtime.engine import SpecDecodeEngine
from draftgraph.runtime.engine.scheduling import band_capture_sizes
from draftgraph.runtime.models import greedy_generate
from draftgraph.runtime.schedule import ScheduleBand, SpeculationSchedule


def _args(spec: SpeculativeConfig | None = None, schedule: str | None = None, max_bs: int = 8) -> RuntimeArgs:
    return RuntimeArgs(spec or SpeculativeConfig(3, 1), CudaGraphConfig(PhaseGraphConfig(max_bs=max_bs)),
                       max_running_requests=8,
                       schedule=SpeculationSchedule.parse(schedule) if schedule else None)


# ---- the schedule itself ----------------------------------------------------------------------------
def test_parse_reads_the_issue_example():
    s = SpeculationSchedule.parse("1:5,4:3,16:1,32:0")
    assert [(b.min_bs, b.max_bs, b.steps) for b in s.bands] == [
        (1, 3, (5,)), (4, 15, (3,)), (16, 31, (1,)), (32, None, (0,))]
    assert [s.band_index(b) for b in (1, 3, 4, 15, 16, 31, 32, 500)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert s.text() == "1:5,4:3,16:1,32:0" and SpeculationSchedule.parse(s.text()) == s
    assert SpeculationSchedule.parse("1:3|4|5,8:0").bands[0].steps == (3, 4, 5)


@pytest.mark.parametrize("text,match", [
    ("2:5,4:3", "schedule band 0: the first threshold is 2: it must be 1"),
    ("1:5,8:3,4:1", "schedule band 2: threshold 4 must be above the previous one"),
    ("1:5,0:3", "schedule band 1: threshold 0 must be an int >= 1"),
    ("1:65", r"schedule band 0 \(1:\): step count 65 must be an int in \[0, 64\]"),
    ("1:-1", "step count -1"),
    ("1:3|2", r"candidates \[3, 2\] must ascend"),
    ("1:0|2", "0 .speculation off. cannot be a candidate beside others"),
    ("1:x", "schedule band 0 '1:x': B and S must be integers"),
    ("1-5", "schedule band 0 '1-5': must be B:S"),
])
def test_bad_schedules_name_the_band_and_the_rule(text, match):
    with pytest.raises(ValueError, match=match):
        SpeculationSchedule.parse(text)


def test_args_file_forms():
    base = {"speculative": {"num_steps": 3, "topk": 1}}
    for form in ("1:5,4:3,32:0", {"1": 5, "4": 3, "32": 0}, {"bands": "1:5,4:3,32:0", "hysteresis": 2}):
        args = runtime_args_from_dict({**base, "schedule": form})
        assert args.schedule.text() == "1:5,4:3,32:0"
    table = runtime_args_from_dict({**base, "schedule": {"bands": {"1": [2, 3]}, "hysteresis": 2}}).schedule
    assert table.hysteresis == 2 and table.steps == ((2, 3),)
    with pytest.raises(ValueError, match="schedule key 'x': must be a batch size"):
        runtime_args_from_dict({**base, "schedule": {"x": 3}})
    with pytest.raises(TypeError, match="schedule=5"):
        runtime_args_from_dict({**base, "schedule": 5})


def test_hysteresis_keeps_a_hovering_batch_in_its_band():
    s = SpeculationSchedule.parse("1:5,4:3", hysteresis=1)
    assert s.band_index(3, current=1) == 1  # 3 is within 1 of the threshold 4: stay
    assert s.band_index(2, current=1) == 0
    assert s.band_index(3, current=0) == 0 and s.band_index(4, current=0) == 1  # up at once


def test_band_capture_sizes_cover_exactly_the_band():
    grid = [1, 2, 4, 8, 16, 24, 32]
    assert band_capture_sizes(grid, ScheduleBand(1, 3, (5,))) == [1, 2, 4]  # 3 pads to 4
    assert band_capture_sizes(grid, ScheduleBand(4, 15, (3,))) == [4, 8, 16]
    assert band_capture_sizes(grid, ScheduleBand(16, 31, (1,))) == [16, 24, 32]
    assert band_capture_sizes(grid, ScheduleBand(32, None, (2,))) == [32]
    assert band_capture_sizes(grid, ScheduleBand(40, None, (2,))) == []  # above the grid: eager


# ---- the engine ---------------------------------------------------------------------------------------
def _serve_staggered(engine: SpecDecodeEngine, n: int = 10) -> tuple[list[list[int]], list[int]]:
    """Requests of different lengths arriving over time, so the batch size rises and falls;
    returns (outputs, batch size of every step)."""
    ps = [list(p) for p in prompts()[:n]]
    lens = [6 + 5 * (i % 5) for i in range(n)]
    ids, sizes, nxt, step = [], [], 0, 0
    while nxt < n or engine.has_work():
        while nxt < n and (nxt <= 2 * step or not engine.has_work()):
            ids.append(engine.add_request(ps[nxt], lens[nxt]))
            nxt += 1
        engine.step()
        sizes.append(len(engine.running))
        step += 1
    return [engine.pop_result(i) for i in ids], lens


def _greedy(draft: str, n: int = 10) -> list[list[int]]:
    target, _ = models(draft)
    lens = [6 + 5 * (i % 5) for i in range(n)]
    ref = greedy_generate(target, [list(p) for p in prompts()[:n]], max(lens))
    return [r[:m] for r, m in zip(ref, lens)]


@pytest.mark.parametrize("draft,backend,text", [
    ("eagle", "eager", "1:3,3:0,5:2"),
    pytest.param("eagle", "trace", "1:3,3:0,5:2|4", marks=pytest.mark.slow),  # captures every band
    ("multi_layer", "eager", "1:4,3:0,5:2"),
])
def test_outputs_equal_greedy_across_bands_up_and_down_through_zero(draft, backend, text):
    target, d = models(draft)
    engine = SpecDecodeEngine(_args(schedule=text), target, d, backend=backend, capture="blocking")
    outs, _ = _serve_staggered(engine)
    assert outs == _greedy(draft)
    sch = engine.stats()["schedule"]
    assert all(b["served"] > 0 for b in sch["bands"]), sch  # every band served, 0 included
    assert sch["band_switches"] >= 3 and sum(b["served"] for b in sch["bands"]) == engine.stats()["steps"]


def test_a_band_state_captures_only_its_sizes_and_zero_captures_nothing():
    target, head = models()
    engine = SpecDecodeEngine(_args(schedule="1:3,3:2,6:0"), target, head, backend="trace", capture="blocking")
    sch = engine.stats()["schedule"]
    # max_bs=8 captures every size 1..8: band 1-2 reaches 1 and 2, band 3-5 reaches 3, 4 and 5
    assert [b["capture_sizes"] for b in sch["bands"]] == [[1, 2], [3, 4, 5], []]
    states = engine.policy.states()
    assert sorted(tuple(s.capture_sizes) for s in states) == [(1, 2), (3, 4, 5)]
    assert all(s.graphs is not None for s in states)
    assert engine.worker.state.graphs is None  # the args' own state captures nothing beside them


def test_reload_keeps_serving_the_schedule_losslessly():
    target, head = models()
    engine = SpecDecodeEngine(_args(schedule="1:3,4:0"), target, head, backend="eager")
    ids = [engine.add_request(list(p), 20) for p in prompts()[:6]]
    for _ in range(3):
        engine.step()
    engine.request_reload(_args(schedule="1:2,3:4"))  # a new schedule through the args
    while engine.has_work():
        engine.step()
    target_ref = greedy_generate(target, [list(p) for p in prompts()[:6]], 20)
    assert [engine.pop_result(i) for i in ids] == target_ref
    assert engine.stats()["schedule"]["schedule"] == "1:2,3:4"


@pytest.mark.slow  # the slow tier: captures of every band state, twice
@pytest.mark.parametrize("capture", ["blocking", "background"])
def test_a_reload_under_a_schedule_captures_only_band_states(capture):
    target, head = models()
    engine = SpecDecodeEngine(_args(schedule="1:3,3:2"), target, head, backend="trace", capture=capture)
    ids = [engine.add_request(list(p), 20) for p in prompts()[:4]]
    engine.step()
    engine.request_reload(_args(SpeculativeConfig(4, 1), schedule="1:4,3:2"))
    engine.step()
    assert engine.worker.generation == 1
    record = engine.worker.reloads.history[-1]
    assert record["ok"] and record["capture_s"] == 0.0 and record["capture_bytes"] == 0  # no full grid
    assert engine.worker.capture.wait(120)
    states = engine.policy.states()
    assert sorted(tuple(s.capture_sizes) for s in states) == [(1, 2), (3, 4, 5, 6, 7, 8)]
    assert all(s.graphs is not None for s in states)
    while engine.has_work():
        engine.step()
    assert [engine.pop_result(i) for i in ids] == greedy_generate(target, [list(p) for p in prompts()[:4]], 20)
    assert engine.stats()["graph_replays"] > 0


def test_schedule_checked_against_the_drafter():
    target, draft = models("multi_layer")
    with pytest.raises(ValueError, match=r"schedule band 1 \(4\+\): S=6: the multi-layer draft has 5 layers"):
        SpecDecodeEngine(_args(schedule="1:3,4:6"), target, draft, backend="eager")
    target, head = models()
    static = SpeculativeConfig(2, 2, tree_choices=((0,), (1,), (0, 0)))
    with pytest.raises(ValueError, match=r"schedule band 0 \(1-3\): S=3: a static tree's depth is fixed at 2"):
        SpecDecodeEngine(_args(static, schedule="1:3,4:0"), target, head, backend="eager")
    SpecDecodeEngine(_args(static, schedule="1:2,4:0"), target, head, backend="eager")  # depth or 0: fine
    with pytest.raises(ValueError, match="give the candidates per band"):
        SpecDecodeEngine(_args(schedule="1:3"), target, head, backend="eager", adaptive_steps=[2, 3])
    engine = SpecDecodeEngine(_args(schedule="1:3"), *models("multi_layer"), backend="eager")
    with pytest.raises(ValueError, match="S=7"):
        engine.request_reload(_args(schedule="1:7"))  # refused when asked


def test_speculation_resumes_as_if_it_had_never_stopped():
    """After a stretch at S=0 the drafter has extended over every committed token: its first
    speculative steps accept as much as those of an engine that speculated from the start at the
    same positions (prefilled with the same committed tokens). A drafter left behind by the S=0
    steps accepts about 1.5 there instead of 4."""
    target, head = models()
    n, k, new = 8, 12, 40
    ps = [list(p) for p in prompts()[:n]]
    ref = greedy_generate(target, ps, k + new)

    def first_steps(engine: SpecDecodeEngine, steps: int = 2) -> list[float]:
        out = []
        for _ in range(steps):
            engine.reset_stats()
            engine.step()
            out.append(engine.stats()["accept_length_mean"])
        return out

    resumed = SpecDecodeEngine(_args(schedule="1:0"), target, head, backend="eager", acceptance_watch=None)
    ids = [resumed.add_request(p, k + new) for p in ps]
    for _ in range(k):  # the prefill emits 1 token, each plain step 1 more: k + 1 in all
        resumed.step()
    assert [len(resumed.result(i)) for i in ids] == [k + 1] * n
    resumed.request_reload(_args(schedule="1:3"))
    after_pause = first_steps(resumed)
    # speculating from the start at the same position: prefilled with the same k + 1 tokens
    fresh = SpecDecodeEngine(_args(schedule="1:3"), target, head, backend="eager", acceptance_watch=None)
    fresh_ids = [fresh.add_request(p + r[:k], new) for p, r in zip(ps, ref)]
    all_along = first_steps(fresh)
    assert all_along[0] > 2.0
    for got, want in zip(after_pause, all_along):
        assert got >= 0.9 * want, (after_pause, all_along)
    while resumed.has_work() or fresh.has_work():
        for e in (resumed, fresh):
            if e.has_work():
                e.step()
    assert [resumed.pop_result(i) for i in ids] == ref
    assert [fresh.pop_result(i) for i in fresh_ids] == [r[k:k + new] for r in ref]


def test_cli_schedule_flags(capsys):
    from draftgraph.runtime.commands import cli
    assert cli.main(["info", "--schedule", "1:5,4:3,16:1,32:0", "--max-bs", "32", "--max-running", "64"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [b["band"] for b in out["schedule"]] == ["1-3", "4-15", "16-31", "32+"]
    assert out["schedule"][3]["capture_sizes"] == [] and out["schedule"][0]["capture_sizes"] == [1, 2, 3]
    assert set(out["schedule"][1]["capture_sizes"]) == {g for g in out["capture_sizes"] if 4 <= g <= 16}
    # an off band (S=0) captures its band's sizes for the width-1 verify and extend when phases
    # are captured: here 32+ over a grid topped at 32; none without phases (the CPU default) or graphs
    flags = ["info", "--schedule", "1:5,4:3,16:1,32:0", "--max-bs", "32", "--max-running", "64", "--backend", "trace"]
    assert cli.main([*flags, "--graph-phases", "verify,extend"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["graph_phases"] == ["verify", "extend"] and out["schedule"][3]["capture_sizes"] == [32]
    assert out["schedule"][0]["capture_sizes"] == [1, 2, 3]
    assert cli.main([*flags, "--graph-phases", ""]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["graph_phases"] == [] and out["schedule"][3]["capture_sizes"] == []
    assert cli.main([*flags[:-1], "eager", "--graph-phases", "verify"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert all(b["capture_sizes"] == [] for b in out["schedule"]) and "graph_phases" not in out
    assert cli.main(["info", "--schedule", "2:5"]) == 2
    assert "the first threshold is 2" in capsys.readouterr().err


def test_cli_schedule_with_adaptive_is_refused_naming_both(capsys):
    """Issue 40: ``--schedule`` with ``--adaptive`` silently dropped the candidates (the run served
    the schedule). Refused before the models load; ``--adaptive ''`` (off) is consistent."""
    from draftgraph.runtime.commands import cli

    flags = ["simulate", "--schedule", "1:3,4:1", "--requests", "1", "--no-greedy", "--backend", "eager",
             "--max-loop-steps", "3", "--json"]
    assert cli.main([*flags, "--adaptive", "1,2,3"]) == 2
    err = capsys.readouterr().err
    assert "--adaptive='1,2,3' with --schedule='1:3,4:1'" in err and "give one of the two" in err
