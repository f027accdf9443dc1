"""`simulate` and `generate` take SIGHUP for their whole life, and Ctrl-C in the serving loop
still prints the report of what finished. Each run is a subprocess that sends itself the
signal at a chosen moment (the default action of SIGHUP would end the test runner)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.slow,  # the slow tier (make test-all, CI): CLI subprocesses, one per signal moment
              pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="needs SIGHUP (POSIX)"),
              pytest.mark.usefixtures("trained_models")]  # subprocesses load the cached models

# The driver patches one moment of the run to send SIGHUP (or raise Ctrl-C), then runs the CLI.
DRIVER = textwrap.dedent("""
    import os, signal, sys
    import draftgraph.runtime.commands.simulate as sim
    import draftgraph.runtime.models as models
    from draftgraph.runtime.engine import SpecDecodeEngine
    from draftgraph.runtime.commands.cli import main

    moment = os.environ["MOMENT"]
    hup = lambda: os.kill(os.getpid(), signal.SIGHUP)

    def wrap(owner, name, before):
        real = getattr(owner, name)
        def patched(*a, **k):
            before()
            return real(*a, **k)
        setattr(owner, name, patched)

    if moment == "loading":      # simulate: while the models load
        wrap(sim, "default_models", hup)
    elif moment == "gen-loading":  # generate: while the models load
        wrap(models, "default_models", hup)
    elif moment == "report":     # after the loop, while the report is made
        wrap(sim, "_greedy_baseline", hup)
    elif moment == "ctrl-c":     # Ctrl-C at the engine's 6th step
        calls = []
        def ctrl_c():
            calls.append(1)
            if len(calls) == 6:
                raise KeyboardInterrupt
        wrap(SpecDecodeEngine, "step", ctrl_c)
    elif moment == "bar":        # SIGHUP at the engine's 3rd step, the progress bar on stderr
        import time
        calls = []
        def hup_at_3():
            calls.append(1)
            if len(calls) == 3:
                hup()
                time.sleep(0.5)  # the reader thread answers while the bar is shown
        wrap(SpecDecodeEngine, "step", hup_at_3)
    elif moment == "exit":       # while the interpreter tears down, after its own signal handling ended
        class Late:
            def __del__(self, kill=os.kill, pid=os.getpid(), sig=signal.SIGHUP):
                kill(pid, sig)
        late = Late()
    sys.exit(main(sys.argv[1:]))
""")


def _run(moment: str, *argv: str) -> subprocess.CompletedProcess:
    import os
    env = dict(os.environ, MOMENT=moment)
    return subprocess.run([sys.executable, "-c", DRIVER, *argv], capture_output=True, text=True,
                          timeout=300, env=env)


def _reload_file(tmp_path) -> str:
    path = tmp_path / "args.json"
    path.write_text('{"speculative": {"num_steps": 2, "topk": 2, "num_draft_tokens": 4},'
                    ' "max_running_requests": 8}')
    return str(path)


SIM = ("simulate", "--requests", "4", "--json", "--backend", "eager", "--adaptive", "")


def test_sighup_while_models_load_is_applied_at_the_first_step(tmp_path):
    p = _run("loading", *SIM, "--reload-config", _reload_file(tmp_path))
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(p.stdout)
    assert r["sighup"] == {"received": 1, "early": 1, "requested": 1, "rejected": 0, "ignored": 0}
    assert r["reloads"]["applied"] == 1 and r["reloads"]["recent"][0]["step"] == 0
    assert r["spec"][:3] == [2, 2, 4] and r["lossless"] is True


def test_sighup_without_a_reload_file_is_logged_and_ignored():
    p = _run("loading", *SIM)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "SIGHUP ignored" in p.stderr
    r = json.loads(p.stdout)
    assert r["sighup"]["ignored"] == 1 and r["reloads"]["requested"] == 0 and r["lossless"] is True


def test_sighup_after_the_loop_is_logged_not_fatal(tmp_path):
    p = _run("report", *SIM, "--reload-config", _reload_file(tmp_path))
    assert p.returncode == 0, p.stderr[-2000:]
    assert "SIGHUP after the serving loop ended: ignored" in p.stderr
    r = json.loads(p.stdout)
    assert r["reloads"]["requested"] == 0 and r["lossless"] is True


def test_sighup_while_the_process_exits_is_not_fatal(tmp_path):
    """Issue 40: Python gives SIGHUP its default action back while it finalizes; a SIGHUP then
    ended the process (exit -1 after a whole run)."""
    p = _run("exit", *SIM, "--reload-config", _reload_file(tmp_path))
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    assert json.loads(p.stdout)["lossless"] is True


def test_a_rejected_reload_is_logged_on_a_line_of_its_own_not_on_the_progress_bar(tmp_path):
    """Issue 40: the rejection was appended to the bar's line (``draftgraph simulate: 40%|... reload
    rejected``). tqdm clears its line with carriage returns: the message must follow a newline or a
    cleared line, never the bar's text."""
    bad = tmp_path / "bad.json"
    bad.write_text('{"speculative": {"num_steps": "many"}}')
    p = _run("bar", "simulate", "--requests", "4", "--backend", "eager", "--adaptive", "", "--no-greedy",
             "--reload-config", str(bad))
    assert p.returncode == 0, p.stderr[-2000:]
    at = p.stderr.index("reload rejected")
    line = p.stderr[:at].rsplit("\n", 1)[-1]  # what the terminal shows before it on its line
    assert line.rsplit("\r", 1)[-1].strip() == "", repr(line[-300:])
    assert "draftgraph simulate" in p.stderr  # the bar was there


def test_sighup_while_generate_loads_is_not_fatal():
    p = _run("gen-loading", "generate", "hello", "--max-new-tokens", "8", "--backend", "eager")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "SIGHUP ignored: generate has no reload file" in p.stderr


def test_ctrl_c_in_the_loop_prints_the_report_of_what_finished():
    p = _run("ctrl-c", *SIM)
    assert p.returncode == 130, p.stderr[-2000:]
    assert p.stderr.rstrip().splitlines()[-1] == "draftgraph: simulate interrupted"
    r = json.loads(p.stdout)
    assert r["interrupted"] is True and r["loop_steps"] == 5  # five steps served, the 6th cut
    assert 0 < r["tokens_generated"] < r["requested_tokens"]
    assert "lossless" not in r  # no baseline for a cut run
