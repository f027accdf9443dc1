"""The `draftgraph` command end to end, as a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

CLI = [sys.executable, "-m", "draftgraph.runtime"]


pytestmark = pytest.mark.usefixtures("trained_models")  # subprocesses load the cached models


def _run(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow  # the slow tier: a simulate subprocess, trace graphs of two states and a reload
def test_simulate_json_with_bad_reload_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"speculative": {"num_steps": 0, "topk": 1}}')
    p = _run("simulate", "--requests", "6", "--json", "--max-bs", "4", "--adaptive", "2,3", "--backend", "trace",
             "--reload-at", "3", "--reload-config", str(bad))
    assert p.returncode == 0, p.stderr
    assert "reload rejected" in p.stderr and "num_steps" in p.stderr
    r = json.loads(p.stdout)
    assert r["tokens_generated"] == r["requested_tokens"]
    assert r["lossless"] is True
    assert 1.0 <= r["accept_length_mean"] <= 4.0
    assert r["graph_replays"] + r["eager_steps"] == r["verify_steps"]
    assert r["speedup"] > 0 and r["greedy_tokens_per_s"] > 0
    assert "replay" in r["spans"] or "eager_fallback" in r["spans"]


@pytest.mark.slow  # the slow tier: a simulate subprocess with a reload
def test_simulate_reload_applies(tmp_path):
    good = tmp_path / "good.json"
    good.write_text('{"speculative": {"num_steps": 2, "topk": 2, "num_draft_tokens": 4},'
                    ' "max_running_requests": 8}')
    p = _run("simulate", "--requests", "5", "--json", "--backend", "eager", "--adaptive", "",
             "--reload-at", "2", "--reload-config", str(good))
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert [x["ok"] for x in r["reloads"]["recent"]] == [True]
    assert r["reloads"]["applied"] == 1 and r["reloads"]["failed"] == 0
    assert r["spec"][:3] == [2, 2, 4] and r["lossless"] is True
    target, draft = r["models"]["target"], r["models"]["draft"]  # the demo's models, said in the report
    assert target.startswith("LlamaForCausalLM through transformers from ") and target.endswith("/target")
    assert draft.startswith("EAGLE-3 head (published layout) from ") and draft.endswith("/eagle3")


@pytest.mark.parametrize("argv,frag", [(["simulate", "--no-such-flag"], "unrecognized"),
                                       (["info", "--topk", "0"], "topk=0"),
                                       (["info", "--tree-choices", "[[1]]", "--topk", "1"], "tree_choices")])
def test_bad_flags_exit_2(argv, frag):
    p = _run(*argv, timeout=120)
    assert p.returncode == 2
    assert frag in p.stderr


def test_generate_prints_text_and_speedup():
    p = _run("generate", "def main():\n    ", "--max-new-tokens", "24", "--backend", "eager")
    assert p.returncode == 0, p.stderr
    assert "identical to greedy: True" in p.stdout and "speedup" in p.stdout
    # the embedded default runs the user's road: a transformers checkpoint and a published head
    assert "-- target: LlamaForCausalLM through transformers from " in p.stdout
    assert "-- draft: EAGLE-3 head (published layout) from " in p.stdout
    assert "-- accept length " in p.stdout


def test_generate_without_speculation_says_so_instead_of_an_acceptance():
    p = _run("generate", "def main():\n    ", "--max-new-tokens", "8", "--backend", "eager", "--schedule", "1:0")
    assert p.returncode == 0, p.stderr
    assert "no step speculated (plain steps only)" in p.stdout and "accept length" not in p.stdout
    assert "identical to greedy: True" in p.stdout


@pytest.mark.slow  # the slow tier: rank processes (~11 s)
def test_simulate_two_ranks_same_generation_every_step(tmp_path):
    cfg = tmp_path / "r.json"
    cfg.write_text('{"speculative": {"num_steps": 2, "topk": 1}, "max_running_requests": 8}')
    p = _run("simulate", "--world-size", "2", "--requests", "3", "--json", "--backend", "eager",
             "--adaptive", "", "--poll-every", "2", "--reload-at", "2", "--reload-config", str(cfg))
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["generations_identical"] is True
    assert all(rank["generations"] == [0, 1] for rank in r["ranks"])
    assert r["rank0"]["lossless"] is True


@pytest.mark.slow  # the slow tier: a simulate subprocess under the torch profiler
def test_simulate_profile_writes_trace_with_spans(tmp_path):
    # blocking capture: every step replays (in the background a loaded machine may finish first)
    p = _run("simulate", "--requests", "2", "--adaptive", "", "--no-greedy", "--json", "--backend", "trace",
             "--capture", "blocking", "--profile", str(tmp_path))
    assert p.returncode == 0, p.stderr
    trace = (tmp_path / "trace.json").read_text()
    assert '"replay[bs=' in trace  # draftgraph's spans are in the torch-profiler trace
    r = json.loads(p.stdout)
    prof = r["profile"]  # the summary: the profiler's ranges agree with the span recorder
    assert prof["trace"] == str(tmp_path / "trace.json") and prof["wall_s"] > 0
    assert prof["spans"]["replay"] == r["spans"]["replay"] == r["graph_replays"] > 0


@pytest.mark.parametrize("argv,command", [(["simulate"], "_simulate"), (["generate", "hi"], "_generate")])
def test_ctrl_c_prints_one_line_and_exits_130(argv, command, monkeypatch, capsys):
    from draftgraph.runtime.commands import cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, command, interrupted)
    assert cli.main(argv) == 130
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [f"draftgraph: {argv[0]} interrupted"]


# ---- issue 32: reports -------------------------------------------------------------------------
@pytest.mark.slow  # the slow tier: a simulate subprocess with the greedy baseline
def test_max_loop_steps_reports_prefix_agreement():
    p = _run("simulate", "--requests", "4", "--backend", "eager", "--adaptive", "", "--max-loop-steps", "6")
    assert p.returncode == 0, p.stderr
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("identical to greedy"))
    assert line.startswith("identical to greedy (prefixes)") and "True" in line, line
    assert "cut by --max-loop-steps" in line


def test_ctrl_c_in_the_greedy_baseline_prints_the_report_of_what_ran(monkeypatch, capsys):
    from draftgraph.runtime.commands import cli, simulate

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(simulate, "greedy_generate", interrupted)
    assert cli.main(["simulate", "--requests", "3", "--backend", "eager", "--adaptive", ""]) == 130
    out, err = capsys.readouterr()
    assert "tokens generated" in out and "Ctrl-C in the greedy baseline" in out
    assert "simulate interrupted" in err


def test_a_hung_capture_unit_does_not_keep_simulate_waiting(monkeypatch):
    import threading

    from draftgraph.graphs.manager import GraphCaptureManager
    from draftgraph.runtime import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
    from draftgraph.runtime.commands import simulate
    from draftgraph.runtime.engine import SpecDecodeEngine
    from draftgraph.runtime.worker.capture_queue import CaptureQueue

    release, started = threading.Event(), threading.Event()
    real = GraphCaptureManager._capture_one
    real_step = SpecDecodeEngine.step

    def hang(self, backend, size, copies=False):
        started.set()
        release.wait(120)
        return real(self, backend, size, copies)

    def step_once_the_unit_hangs(self, *a, **k):  # the loop ends only after the unit started
        assert started.wait(60), "the capture unit never started"
        return real_step(self, *a, **k)

    monkeypatch.setattr(GraphCaptureManager, "_capture_one", hang)
    monkeypatch.setattr(CaptureQueue, "_wait_for_a_turn", lambda self: None)  # no idle wait: start at once
    monkeypatch.setattr(SpecDecodeEngine, "step", step_once_the_unit_hangs)
    monkeypatch.setattr(simulate, "CLOSE_TIMEOUT_S", 0.5, raising=False)
    args = RuntimeArgs(SpeculativeConfig(3, 1), CudaGraphConfig(PhaseGraphConfig(bs=(1, 2))), max_running_requests=2)
    cfg = simulate.SimulationConfig(args=args, backend="trace", requests=2, adaptive_steps=(), greedy=False,
                                    progress=False, min_new=4, max_new=6, capture="background")
    box: list = []
    t = threading.Thread(target=lambda: box.append(simulate.run_simulation(cfg, sighup=None)), daemon=True)
    t.start()
    try:
        t.join(90)  # a generous hang guard: the loop takes seconds
        assert not t.is_alive(), "simulate still waits for the hung capture unit"
    finally:
        release.set()
        t.join(60)
    assert box and box[0]["capture_stopped"] is False and box[0]["tokens_generated"] > 0
    # the report says what is pending, a lower bound on its time (no unit finished) and that
    # those steps were served eager
    from draftgraph.runtime.commands.cli import _ready_text

    eta = box[0]["graphs_eta"]
    assert (eta["pending"], eta["compiles"], eta["basis"], eta["units_measured"]) == (2, 0, "at least", 0)
    assert eta["per_check_s"] > 0 and eta["seconds"] == pytest.approx(2 * eta["per_check_s"])
    text = _ready_text(box[0])
    assert text.startswith("not yet: 2 of 2 capture units pending (background); compiling them takes at least ")
    assert "none finished here" in text and "served eager meanwhile" in text


@pytest.mark.parametrize("flag", ["--metrics-file", "--profile"])
def test_an_unwritable_output_exits_2_before_serving(tmp_path, flag):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    target = str(blocker / ("m.prom" if flag == "--metrics-file" else "trace-dir"))
    p = _run("simulate", "--requests", "2", "--backend", "eager", "--adaptive", "", "--no-greedy", flag, target,
             timeout=120)
    assert p.returncode == 2, p.stderr
    assert f"{flag}={target!r}" in p.stderr and "checked before serving" in p.stderr
    assert "tokens generated" not in p.stdout


def test_the_no_cuda_runtime_notice_is_dropped_on_a_cpu_machine():
    """torch logs "No CUDA runtime is found, using CUDA_HOME=..." at every compile start on a CPU
    machine; the command drops that one message (the plain import shows it: the check can fail)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the notice is kept there")
    plain = "import torch.utils.cpp_extension"
    via_cli = ("import contextlib, io\nfrom draftgraph.runtime.commands import cli\n"
               "with contextlib.redirect_stdout(io.StringIO()):\n    cli.main(['info'])\n"
               "import torch.utils.cpp_extension")
    runs = {name: subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
            for name, code in (("plain", plain), ("cli", via_cli))}
    for name, run in runs.items():
        assert run.returncode == 0, (name, run.stderr[-2000:])
    if "No CUDA runtime is found" not in runs["plain"].stderr:
        pytest.skip("this torch does not log the notice here (no CUDA_HOME found)")
    assert "No CUDA runtime is found" not in runs["cli"].stderr, runs["cli"].stderr[-2000:]
