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
    runpy.run_module({module!r}, run_name="__main__", alter_sys=True)
except SystemExit:
    pass
"""


def _stderr(argv0: str, module: str) -> str:
    p = subprocess.run([sys.executable, "-c", _RUN.format(argv0=argv0, module=module)], capture_output=True,
                       text=True, timeout=300)
    return p.stderr


def test_the_command_drops_torchs_numpy_notice_other_programs_keep_it():
    # a program that imports the library and the command's module, whatever its name, keeps it
    other = _stderr("draftgraph", "draftgraph.runtime.commands.cli")
    assert "Failed to initialize NumPy" in other  # the notice exists here: the check can fail
    assert "Failed to initialize NumPy" not in _stderr("-m", "draftgraph.runtime")  # python -m draftgraph.runtime


def test_the_library_loads_its_names_lazily():
    code = ("import sys; import draftgraph.runtime as r; import draftgraph.runtime.console; "
            "before = 'torch' in sys.modules; r.build_tree; print(before, 'torch' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.stdout.split() == ["False", "True"], p.stderr[-2000:]


def test_the_entry_loads_no_torch_before_its_set_up():
    """The entry lives in commands/, whose face loads `cli` (and torch) only on first use, so the
    console's set-up still runs before torch loads; ``commands.main`` then loads it."""
    code = ("import sys; import draftgraph.runtime.commands.entry, draftgraph.runtime.commands as c; "
            "before = 'torch' in sys.modules; c.main; print(before, 'torch' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.stdout.split() == ["False", "True"], p.stderr[-2000:]


def test_waiting_for_graphs_shows_units_done_of_all_on_stderr(capsys):
    from draftgraph.runtime import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
    from draftgraph.runtime.commands.simulate import wait_with_progress
    from draftgraph.runtime.engine import SpecDecodeEngine
    from draftgraph.runtime.models import default_models

    target, head = default_models(seed=0)
    args = RuntimeArgs(SpeculativeConfig(2, 1), CudaGraphConfig(PhaseGraphConfig(bs=(1, 2))), max_running_requests=2)
    engine = SpecDecodeEngine(args, target, head, backend="trace", capture="background")
    try:
        wait_with_progress(engine)
        assert engine.worker.capture.ready()
    finally:
        engine.close()
    err = capsys.readouterr().err
    assert "draftgraph graphs" in err and "2/2" in err
