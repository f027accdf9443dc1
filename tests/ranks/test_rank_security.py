"""The ranks' store is not trusted: it listens on loopback only, and nothing read from it runs.

A hostile entry (a pickle whose loading would create a marker file) is written into the proposal
and vote slots of a live store by a second process (as uid 65534 where this machine allows it):
nothing runs, and the round that reads it fails with an error naming the key.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from datetime import timedelta

import psutil
import pytest

from draftgraph.runtime import RuntimeArgs, SpeculativeConfig, spawn_ranks
from draftgraph.runtime.ranks.launch import loopback_store
from draftgraph.runtime.ranks.protocol import ProtocolError, RankProtocol
from draftgraph.runtime.ranks.two_phase import abort_reason

pytestmark = pytest.mark.slow  # the slow tier (make test-all, CI): rank processes and a hostile writer

NOBODY = 65534


def _listening(pid: int, port: int | None = None) -> set[str]:
    conns = psutil.Process(pid).net_connections("inet")
    return {c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN and (port is None or c.laddr.port == port)}


def test_loopback_store_listens_on_127_0_0_1_only():
    store = loopback_store(timedelta(seconds=10))
    assert _listening(os.getpid(), store.port) == {"127.0.0.1"}  # a plain TCPStore server: {"::"}
    store.set("k", b"v")
    assert store.get("k") == b"v"


def _launcher_listens(rank: int, world: int) -> set[str]:
    """Addresses the launcher (it hosts the group's store) listens on at the ports this rank is
    connected to: the store's. Other sockets of the launcher (a test process's own) are left out."""
    mine = {c.raddr.port for c in psutil.Process().net_connections("inet")
            if c.raddr and c.status == psutil.CONN_ESTABLISHED}
    return {ip for port in mine for ip in _listening(os.getppid(), port)}


def test_spawn_ranks_store_listens_on_loopback_only():
    (addresses,) = spawn_ranks(1, _launcher_listens, timeout_s=120.0)
    assert addresses == {"127.0.0.1"}


class _Marker:
    """Unpickling this creates the marker file: it must never happen."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


_ATTACKER = textwrap.dedent("""
    import sys
    from datetime import timedelta
    import torch.distributed as dist
    port, payload = int(sys.argv[1]), bytes.fromhex(sys.argv[2])
    client = dist.TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=10))
    store = dist.PrefixStore("t/", client)
    store.compare_set("proposal", b"-", payload)
    store.set("vote/1/1", payload)
    store.set("reload/1", payload)
    print("written")
""")


def _nobody_python() -> tuple[list[str], dict[str, str]] | str:
    """An interpreter uid 65534 can run with torch, and its environment; or why there is none.

    This interpreter first; when it lives where uid 65534 may not go (a venv built on an
    interpreter under /root, mode 700), a system Python of the same version with this one's
    site-packages on PYTHONPATH (the attacker script needs torch.distributed only)."""
    if os.geteuid() != 0:
        return "not root: cannot start a process as uid 65534"
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site_dirs = os.pathsep.join(p for p in sys.path if p.endswith("site-packages"))
    env = {**os.environ, "HOME": "/tmp"}
    tried = []
    for exe, extra in ((sys.executable, {}), (f"/usr/bin/{version}", {"PYTHONPATH": site_dirs})):
        try:
            probe = subprocess.run([exe, "-c", "import torch.distributed"], user=NOBODY, group=NOBODY,
                                   capture_output=True, timeout=120, env={**env, **extra})
        except (OSError, subprocess.SubprocessError) as exc:
            tried.append(f"{exe}: {exc}")
            continue
        if probe.returncode == 0:
            return [exe], {**env, **extra}
        tried.append(f"{exe}: {probe.stderr.decode()[-200:]}")
    return "uid 65534 cannot run a Python with torch here: " + "; ".join(tried)


@pytest.mark.parametrize("as_nobody", [False, True], ids=["same-user", "uid-65534"])
def test_hostile_pickle_in_the_store_never_runs_and_fails_the_round(tmp_path, as_nobody):
    python, extra = [sys.executable], {}
    if as_nobody:
        found = _nobody_python()
        if isinstance(found, str):
            pytest.skip(found)
        python, env = found
        extra = {"user": NOBODY, "group": NOBODY, "env": env}
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Marker(str(marker)))
    server = loopback_store(timedelta(seconds=10))
    leader, follower = (RankProtocol(server, "t/", r, 2, 0.5) for r in range(2))
    out = subprocess.run([*python, "-c", _ATTACKER, str(server.port), payload.hex()],
                         capture_output=True, timeout=120, **extra)
    assert out.returncode == 0 and b"written" in out.stdout, out.stderr.decode()[-2000:]

    # the hostile entry in the slot carries no rank's signature: refused unread (the slot freed)...
    assert leader.take() is None
    with pytest.raises(ProtocolError, match=r"store key 'proposal': not a reload proposal \(JSON expected"):
        leader.check_proposal(payload)  # ...and even as data it is no proposal
    with pytest.raises(ProtocolError, match=r"store key 'reload/1'"):
        follower.read_reload(1)
    leader.vote(1, None)
    votes, missing = leader.collect_votes(1)
    assert missing == () and votes[0] is None and votes[1].startswith("malformed vote: store key 'vote/1/1'")
    reason = abort_reason(votes, missing, 0.5, 1)
    assert reason is not None and "rank 1 failed: malformed vote" in reason  # the round aborts
    # a rank's proposal takes over a slot held by junk; a real proposal is read back as data
    args = RuntimeArgs(SpeculativeConfig(2, 1))
    assert follower.offer((1, args, "swap")) is None
    assert leader.check_proposal(leader.take()) == (1, args, "swap")
    assert not marker.exists()  # nothing ran, in this process or any other
