"""`draftgraph serve` takes SIGHUP from its first import to its exit, as simulate and generate do
(issue 50: `console.SERVING_COMMANDS` left it out, so a SIGHUP while serve imported torch killed it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from serve_support import ServerProcess
from signal_support import sighup_at_start

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="needs SIGHUP (POSIX)")


def test_the_console_holds_sighup_for_serve():
    """The entry's set-up, torch-free, holds the signal for serve as for simulate; not for info."""
    code = ("import signal, sys\n"
            "from draftgraph.runtime.console import prepare_console\n"
            "prepare_console([sys.argv[1], '--port', '0'])\n"
            "print(type(signal.getsignal(signal.SIGHUP)).__name__)\n")
    shown = {}
    for command in ("serve", "simulate", "info"):
        done = subprocess.run([sys.executable, "-c", code, command], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        shown[command] = done.stdout.strip().splitlines()[-1]
    assert shown == {"serve": "HeldSighup", "simulate": "HeldSighup", "info": "Handlers"}


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc (Linux)")
def test_serve_survives_a_sighup_during_start_up(tmp_path):
    """The signal is sent at the first moment the process could take it (or once torch starts
    loading, which without the hold is the default action: the process ends); it must go on to
    serve and report the signal as an early one it ignored (no --reload-config)."""
    srv = ServerProcess("--backend", "eager", log_dir=str(tmp_path))
    try:
        torch_loading = sighup_at_start(srv.proc)
        srv.wait_serving()
        assert srv.proc.poll() is None
    finally:
        rc = srv.stop()
    assert not torch_loading  # the signal came before torch was imported
    assert rc == 0, srv.log()
    assert "SIGHUP ignored" in srv.log(), srv.log()
