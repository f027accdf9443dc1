"""`simulate --world-size 2`: SIGHUP to the launcher (the process the operator started) reloads
every rank at one step. It was logged as "applied at its first step" and never applied: the
launcher's handler had no engine and the ranks had no handler."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.slow,  # the slow tier (make test-all, CI): rank processes under the CLI
              pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="needs SIGHUP (POSIX)"),
              pytest.mark.usefixtures("trained_models")]  # subprocesses load the cached models

# SIGHUP to the launcher itself while its ranks start (the models load in them meanwhile)
DRIVER = textwrap.dedent("""
    import os, signal, sys
    import draftgraph.runtime as rt
    from draftgraph.runtime.commands.cli import main

    real = rt.spawn_ranks
    def spawn_ranks(*a, **k):
        os.kill(os.getpid(), signal.SIGHUP)
        return real(*a, **k)
    rt.spawn_ranks = spawn_ranks
    sys.exit(main(sys.argv[1:]))
""")


def test_sighup_to_the_launcher_reloads_every_rank(tmp_path):
    path = tmp_path / "reload.json"
    path.write_text(json.dumps({"speculative": {"num_steps": 2, "topk": 1}}))
    out = subprocess.run([sys.executable, "-c", DRIVER, "simulate", "--world-size", "2", "--requests", "4",
                          "--backend", "eager", "--reload-config", str(path), "--json", "--no-greedy"],
                         capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["generations_identical"]
    for r in report["ranks"]:
        # requested while the ranks started: applied at the first poll, on every rank
        assert r["generations"][-1] == 1 and r["reloads"]["applied"] == 1, r
        assert r["coordinator"]["reloads"] == 1
    assert report["rank0"]["sighup"]["requested"] == 1
