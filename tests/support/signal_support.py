"""A SIGHUP sent to a starting command at the first moment it could take it (Linux /proc)."""

from __future__ import annotations

import signal
import subprocess
import time


def sighup_caught(pid: int) -> bool:
    """The process has a handler of its own for SIGHUP (its SigCgt mask)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) & (1 << (signal.SIGHUP - 1)))
    return False


def torch_loaded(pid: int) -> bool:
    """libtorch is mapped: torch has started loading."""
    with open(f"/proc/{pid}/maps") as f:
        return "libtorch" in f.read()


def sighup_at_start(proc: subprocess.Popen, timeout_s: float = 60.0) -> bool:
    """Send SIGHUP once ``proc`` catches it or torch starts loading (bounded); returns whether
    torch was loading when it was sent (False: the signal came before torch's import)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if sighup_caught(proc.pid) or torch_loaded(proc.pid):
            break  # the first moment it could take the signal, or torch started loading
        time.sleep(0.005)
    loading = torch_loaded(proc.pid)
    proc.send_signal(signal.SIGHUP)
    return loading
