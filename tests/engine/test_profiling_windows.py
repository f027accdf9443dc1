"""Issue 24: every engine stage a range, windows of engine steps, a bounded trace, the answer
printed. Traces are parsed here with plain json, independently of profile_report.py."""

from __future__ import annotations

import json
import statistics
import sys

import pytest
import torch
from engine_support import prompts

from draftgraph.graphs import spans as spans_module
from draftgraph.graphs.spans import disable_nvtx, enable_nvtx, span, trace_spans
from draftgraph.runtime import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.commands import cli
from draftgraph.runtime.engine.engine import SpecDecodeEngine
from draftgraph.runtime.engine.profiling import StepProfiler, check_windows, parse_profile_steps, profile_steps
from draftgraph.runtime.engine.stats import STAGES

SIM = ["simulate", "--requests", "3", "--adaptive", "", "--no-greedy", "--backend", "eager",
       "--max-bs", "4", "--max-running", "4"]


def _loaded(engine: SpecDecodeEngine) -> SpecDecodeEngine:
    """``engine`` with four requests of 40 tokens added."""
    for p in prompts()[:4]:
        engine.add_request(list(p), 40)
    return engine


def _ranges(path) -> list[dict]:
    """The trace's complete events, by start (draftgraph's spans-only traces hold nothing else)."""
    events = json.loads(path.read_text())["traceEvents"]
    return sorted((e for e in events if e.get("ph") == "X"), key=lambda e: e["ts"])


def _inside(outer: dict, events: list[dict]) -> list[str]:
    end = outer["ts"] + outer["dur"]
    return [e["name"].split("[")[0] for e in events
            if e is not outer and outer["ts"] <= e["ts"] and e["ts"] + e["dur"] <= end]


def _step_index(label: str) -> int:
    return int(label.split("[", 1)[1].rstrip("]").split(",")[0].removeprefix("i="))


def test_parse_profile_steps_reads_windows() -> None:
    assert parse_profile_steps("2-6") == ((2, 6),)
    assert parse_profile_steps(" 0-0, 3-4,9 ") == ((0, 0), (3, 4), (9, 9))


@pytest.mark.parametrize("text,rule", [("5-2", "B >= A"), ("1-3,2-4", "overlaps"), ("4-5,1-2", "overlaps"),
                                       ("a-b", "whole numbers"), ("1-2-3", "whole numbers"),
                                       ("-1-2", "whole numbers"), ("", "A-B")])
def test_bad_windows_name_the_flag_value_and_rule(text: str, rule: str) -> None:
    with pytest.raises(ValueError) as exc:
        parse_profile_steps(text)
    assert "--profile-steps" in str(exc.value) and rule in str(exc.value)


def test_check_windows_rejects_non_int_windows() -> None:
    with pytest.raises(ValueError, match="windows: window"):
        check_windows([(1.5, 2)])
    with pytest.raises(ValueError, match="at least one"):
        check_windows([])


@pytest.mark.parametrize("value", ["5-2", "1-3,2-4", "x"])
def test_cli_bad_windows_exit_2_naming_the_flag(value: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main([*SIM, "--profile-steps", value])
    assert exc.value.code == 2
    assert "--profile-steps" in capsys.readouterr().err


def test_spans_only_without_a_dir_exits_2(capsys) -> None:
    assert cli.main([*SIM, "--profile-spans-only"]) == 2
    assert "--profile-spans-only" in capsys.readouterr().err


def test_a_window_of_five_steps_gives_five_step_ranges_with_their_stages(tmp_path, nvtx_off, make_engine) -> None:
    eng = _loaded(make_engine())
    with profile_steps(eng, tmp_path, [(2, 6)], spans_only=True) as summary:
        for _ in range(9):
            eng.step()
    ranges = _ranges(tmp_path / "trace.json")
    steps = [e for e in ranges if e["name"].startswith("step[")]
    assert [_step_index(e["name"]) for e in steps] == [2, 3, 4, 5, 6]
    for e in steps:
        inner = _inside(e, ranges)
        assert "draft" in inner and "verify" in inner
        assert set(inner) <= {*STAGES, "organize_fast", "eager_run", "eager_fallback", "replay", "served"}
        served = [r["name"] for r in ranges if r["name"].startswith("served[") and _within(r, e)]
        assert served == ["served[bs=4,S=3,topk=1,N=4,mode=eager,reason=no_graphs]"]
    # nothing outside the window: every range lies in one of the step ranges
    assert all(any(s["ts"] <= e["ts"] <= s["ts"] + s["dur"] for s in steps) for e in ranges)
    assert summary["steps_recorded"] == 5 and summary["trace_bytes"] < 5 * 4096


def _within(inner: dict, outer: dict) -> bool:
    return outer["ts"] <= inner["ts"] <= outer["ts"] + outer["dur"]


def test_two_windows_give_both_and_nothing_between(tmp_path, nvtx_off, make_engine) -> None:
    eng = _loaded(make_engine())
    with profile_steps(eng, tmp_path, [(1, 2), (5, 6)], spans_only=True) as summary:
        for _ in range(8):
            eng.step()
    ranges = _ranges(tmp_path / "trace.json")
    steps = [e for e in ranges if e["name"].startswith("step[")]
    assert [_step_index(e["name"]) for e in steps] == [1, 2, 5, 6]
    gap = (steps[1]["ts"] + steps[1]["dur"], steps[2]["ts"])
    assert not [e for e in ranges if gap[0] < e["ts"] < gap[1]]
    assert summary["windows"] == [[1, 2], [5, 6]] and summary["steps_recorded"] == 4


def test_windows_drive_the_cuda_profiler_api(monkeypatch, make_engine) -> None:
    calls: list[tuple[str, int]] = []
    eng = _loaded(make_engine())
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: calls.append(("start", eng.step_index)))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: calls.append(("stop", eng.step_index)))
    with profile_steps(eng, None, [(1, 2), (4, 4)], cuda_profiler=True) as summary:
        for _ in range(6):
            eng.step()
    # step_index is the next step's index: start before step 1, stop after step 2, ...
    assert calls == [("start", 2), ("stop", 3), ("start", 5), ("stop", 5)]
    assert summary["steps_recorded"] == 3 and "trace" not in summary


def test_a_window_still_open_at_close_is_written(tmp_path, nvtx_off, make_engine) -> None:
    eng = _loaded(make_engine())
    profiler = StepProfiler(tmp_path, [(1, 100)], spans_only=True, cuda_profiler=False)
    eng.profiler = profiler
    for _ in range(3):
        eng.step()
    eng.profiler = None
    summary = profiler.close()
    assert summary["ranges"]["step"]["calls"] == 2
    with pytest.raises(ValueError, match="already attached"):
        eng.profiler = profiler
        with profile_steps(eng, tmp_path):
            pass


@pytest.mark.slow  # the slow tier: a torch-profiler trace of every op
def test_ops_trace_holds_aten_ops_and_the_same_ranges(tmp_path, nvtx_off, make_engine) -> None:
    eng = _loaded(make_engine(backend="trace"))
    with profile_steps(eng, tmp_path / "ops", [(1, 2)]) as ops:
        for _ in range(3):
            eng.step()
    with profile_steps(eng, tmp_path / "spans", [(4, 5)], spans_only=True) as spans:
        for _ in range(3):
            eng.step()
    events = json.loads((tmp_path / "ops" / "trace.json").read_text())["traceEvents"]
    assert any(e.get("cat") == "cpu_op" for e in events)
    names = [e["name"].split("[")[0] for e in events if e.get("cat") == "user_annotation"]
    assert names.count("step") == 2 and names.count("replay") == 2 and names.count("verify") == 2
    assert ops["spans"] == spans["spans"]  # the same ranges, recorded both ways
    assert spans["trace_bytes"] * 20 < ops["trace_bytes"]


def _table_rows(text: str) -> dict[str, list[str]]:
    rows = {}
    for line in text.split("profiled ranges", 1)[1].splitlines()[2:]:
        cells = line.split()
        if cells:
            rows[cells[0]] = cells[1:]
    return rows


@pytest.mark.slow  # the slow tier: a full simulate run with a trace
def test_printed_table_and_json_agree_with_the_trace(tmp_path, capsys, nvtx_off) -> None:
    assert cli.main([*SIM, "--json", "--profile", str(tmp_path / "j"), "--profile-steps", "1-4",
                     "--profile-spans-only"]) == 0
    prof = json.loads(capsys.readouterr().out)["profile"]
    assert cli.main([*SIM, "--profile", str(tmp_path / "t"), "--profile-steps", "1-4",
                     "--profile-spans-only"]) == 0
    printed = _table_rows(capsys.readouterr().out)
    ranges = _ranges(tmp_path / "j" / "trace.json")
    by_name: dict[str, list[float]] = {}
    for e in ranges:
        by_name.setdefault(e["name"].split("[")[0], []).append(e["dur"] / 1e3)
    assert by_name["step"] and len(by_name["step"]) == 4
    step_total = sum(by_name["step"])
    assert set(prof["ranges"]) == set(by_name) == set(printed)
    for name, durs in by_name.items():
        row = prof["ranges"][name]
        assert row["calls"] == len(durs) == int(printed[name][0])
        assert row["total_ms"] == pytest.approx(sum(durs))
        assert row["p50_ms"] == pytest.approx(statistics.median(durs))
        assert row["share"] == pytest.approx(sum(durs) / step_total)
    # the stages of the steps never add up to more than the steps
    assert sum(prof["ranges"][s]["total_ms"] for s in STAGES if s in prof["ranges"]) <= step_total


def test_nvtx_receives_the_same_names(monkeypatch, nvtx_off, make_engine) -> None:
    pushed: list[str] = []
    depth = [0]

    class Domain:
        def push_range(self, message: str) -> None:
            pushed.append(message)
            depth[0] += 1

        def pop_range(self) -> None:
            depth[0] -= 1

    class FakeNvtx:
        @staticmethod
        def get_domain(name: str) -> Domain:
            assert name == "draftgraph"
            return Domain()

    monkeypatch.setattr(spans_module, "_nvtx", FakeNvtx)
    monkeypatch.setattr(spans_module._SWITCH, "domain", None)
    eng = _loaded(make_engine())
    assert enable_nvtx()
    try:
        with trace_spans() as traced:
            for _ in range(3):
                eng.step()
    finally:
        disable_nvtx()
    assert depth[0] == 0
    assert sorted(pushed) == sorted(e["name"] for e in traced)
    assert {p.split("[")[0] for p in pushed} >= {"step", "admit", "draft", "verify", "extend"}


def test_off_the_stage_spans_are_the_shared_null_context(nvtx_off, make_engine) -> None:
    assert span("draft") is span("verify")  # nothing listens: no range object is built
    eng = _loaded(make_engine())
    with trace_spans() as traced:
        pass
    eng.step()
    assert traced == [] and eng.step_index == 1
    assert tuple(eng.stats()["stage_s"]) == STAGES


def test_stage_plot_is_written_with_matplotlib(tmp_path, nvtx_off, make_engine) -> None:
    pytest.importorskip("matplotlib")
    eng = _loaded(make_engine())
    with profile_steps(eng, tmp_path, [(0, 2)], spans_only=True) as summary:
        for _ in range(3):
            eng.step()
    svg = (tmp_path / "stages.svg").read_text()
    assert summary["stages_svg"] == str(tmp_path / "stages.svg") and "<svg" in svg


def test_no_stage_plot_without_matplotlib(tmp_path, monkeypatch, nvtx_off, make_engine) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails as if not installed
    eng = _loaded(make_engine())
    with profile_steps(eng, tmp_path, [(0, 1)], spans_only=True) as summary:
        for _ in range(2):
            eng.step()
    assert summary["stages_svg"] is None and not (tmp_path / "stages.svg").exists()
    assert summary["ranges"]["step"]["calls"] == 2


def test_a_reload_is_a_range_inside_its_step(tmp_path, nvtx_off, make_engine) -> None:
    eng = _loaded(make_engine())
    new = RuntimeArgs(SpeculativeConfig(2, 1), CudaGraphConfig(PhaseGraphConfig(max_bs=4)),
                      max_running_requests=4)
    with profile_steps(eng, tmp_path, spans_only=True):
        eng.step()
        eng.request_reload(new)
        eng.step()
    ranges = _ranges(tmp_path / "trace.json")
    steps = [e for e in ranges if e["name"].startswith("step[")]
    assert [_step_index(e["name"]) for e in steps] == [0, 1]
    assert "apply_reload" not in _inside(steps[0], ranges)
    assert "apply_reload" in _inside(steps[1], ranges)
    applied = next(e for e in ranges if e["name"] == "apply_reload")
    # the engine applies a request in two phases: the worker's prepare and commit ranges
    assert {"reload_prepare", "reload_commit"} <= set(_inside(applied, ranges))
    assert eng.worker.spec.num_steps == 2


def test_a_profiler_attached_mid_window_records_the_rest(tmp_path, nvtx_off, make_engine) -> None:
    eng = _loaded(make_engine())
    eng.step()
    eng.step()
    with profile_steps(eng, tmp_path, [(0, 3), (5, 5)], spans_only=True) as summary:
        for _ in range(5):
            eng.step()
    steps = [e for e in _ranges(tmp_path / "trace.json") if e["name"].startswith("step[")]
    assert [_step_index(e["name"]) for e in steps] == [2, 3, 5]
    assert summary["steps_recorded"] == 3


# ---- issue 32: a failed export never takes a step's results; an ops recording is bounded -------
def test_a_failing_export_returns_the_steps_results_and_is_reported(tmp_path, monkeypatch, caplog, nvtx_off,
                                                                    make_engine):
    eng = make_engine()
    quick = eng.add_request(list(prompts()[5]), 1)  # ends at admission: in step 0's results
    for p in prompts()[:3]:
        eng.add_request(list(p), 40)

    def full_disk(self, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", full_disk)
    profiler = eng.profiler = StepProfiler(tmp_path, [(0, 0), (2, 3)], cuda_profiler=False)
    assert quick in eng.step()  # the window's export failed after the step committed
    assert eng.pop_result(quick) is not None
    for _ in range(4):
        eng.step()  # no further window opens: the disk is still full
    eng.profiler = None
    summary = profiler.close()
    assert summary["export_failures"] == 1 and "No space left" in summary["errors"][0]
    assert summary["steps_recorded"] == 1 and "profile export" in caplog.text


def _retained(profiler: StepProfiler) -> int:
    return len(json.dumps(profiler._events))  # noqa: SLF001 (what the profiler holds until close)


def test_ops_mode_without_windows_is_capped(tmp_path, monkeypatch, caplog, nvtx_off, make_engine):
    from draftgraph.runtime.engine import profiling

    monkeypatch.setattr(profiling, "MAX_OPS_STEPS", 3)
    eng = _loaded(make_engine())
    profiler = eng.profiler = StepProfiler(tmp_path, None, cuda_profiler=False)
    for _ in range(3):
        eng.step()
    at_cap = _retained(profiler)
    for _ in range(5):
        eng.step()
    assert _retained(profiler) == at_cap > 0  # nothing more held after the cap
    eng.profiler = None
    summary = profiler.close()
    assert summary["steps_recorded"] == 3 and summary["capped_at"] == 3
    assert "--profile-steps" in caplog.text


@pytest.mark.parametrize("windows", [[(0, 10**20)], [(0, 1), (2, 10**20)]], ids=["one-huge", "two"])
def test_ops_mode_with_an_explicit_huge_window_gets_the_same_cap(tmp_path, monkeypatch, caplog, nvtx_off,
                                                                   make_engine, windows):
    """Issue 40: ``--profile-steps 0-10**20`` recorded without a cap (RSS 1,181 vs 186 MiB)."""
    from draftgraph.runtime.engine import profiling

    monkeypatch.setattr(profiling, "MAX_OPS_STEPS", 3)
    eng = _loaded(make_engine())
    profiler = eng.profiler = StepProfiler(tmp_path, windows, cuda_profiler=False)
    for _ in range(3):
        eng.step()
    at_cap = _retained(profiler)
    for _ in range(4):
        eng.step()
    assert not profiler.recording
    assert _retained(profiler) == at_cap > 0  # nothing more held after the cap
    eng.profiler = None
    summary = profiler.close()
    assert summary["steps_recorded"] == 3 and summary["capped_at"] == 3
    assert "MAX_OPS_STEPS" in caplog.text and "--profile-steps" in caplog.text
