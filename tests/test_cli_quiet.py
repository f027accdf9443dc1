"""The command's start-up output: torch's NumPy notice (numpy is not a dependency) is dropped
for the ``draftgraph`` command and kept for other programs; the blocking capture shows progress."""

from __future__ import annotations

import subprocess
import sys

_RUN = """
import runpy, sys
sys.modules["numpy"] = None  # as after a plain pip install: torch finds no NumPy
sys.argv = [{argv0!r}, "--help"]
try:
    runpy.run_module("draftgraph.runtime.engine.cli", run_name="__main__")
except SystemExit:
    pass
"""


def _stderr(argv0: str) -> str:
    p = subprocess.run([sys.executable, "-c", _RUN.format(argv0=argv0)], capture_output=True, text=True,
                       timeout=300)
    return p.stderr


def test_the_command_drops_torchs_numpy_notice_other_programs_keep_it():
    other = _stderr("some-program")
    assert "Failed to initialize NumPy" in other  # the notice exists here: the check can fail
    assert "Failed to initialize NumPy" not in _stderr("-m")  # python -m draftgraph.runtime.engine.cli


def test_waiting_for_graphs_shows_units_done_of_all_on_stderr(capsys):
    from draftgraph.runtime import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
    from draftgraph.runtime.engine import SpecDecodeEngine
    from draftgraph.runtime.engine.simulate import wait_with_progress
    from draftgraph.runtime.models import default_models

    target, head = default_models(seed=0)
    args = RuntimeArgs(SpeculativeConfig(2, 1), CudaGraphConfig(PhaseGraphConfig(bs=(1, 2))), max_running_requests=2)
    engine = SpecDecodeEngine(args, target, head, backend="trace", capture="background")
    try:
        wait_with_progress(engine)
        assert engine.worker.graphs_ready()
    finally:
        engine.close()
    err = capsys.readouterr().err
    assert "draftgraph graphs" in err and "2/2" in err
