"""Run a function on N CPU ranks: fresh processes joined by a gloo process group on loopback.

For tests, benchmarks and ``draftgraph simulate --world-size N``. The launching process hosts
the group's TCPStore (so the store outlives any rank) on a socket it binds to 127.0.0.1 itself
(a TCPStore server given only a host listens on every interface), the ranks' gloo pairs use
the loopback interface, and every wait is bounded: a rank that raises, dies or overruns is
reported by rank, never a hang. Results come back over a pipe private to the launcher and its
ranks (a multiprocessing queue), never through the store, which any local user can reach.

Each run makes a secret (`auth.new_secret`, never logged) and hands it to every rank with the
rank's arguments, through the spawn pipe (private to the launcher and that process: not on a
command line, not in the environment); the rank installs it (`auth.set_process_secret`) before
``fn`` runs, so its coordinators sign and check every store value.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import pickle
import queue as queue_mod
import socket
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .auth import new_secret, set_process_secret

__all__ = ["spawn_ranks", "RankLaunchError", "loopback_store"]

logger = logging.getLogger(__name__)

_HOST = "127.0.0.1"


class RankLaunchError(RuntimeError):
    """Some ranks failed: ``failures`` maps rank -> what happened (traceback, exit code, timeout);
    ``results`` holds the ranks that did return."""

    def __init__(self, message: str, failures: dict[int, str], results: dict[int, Any]) -> None:
        super().__init__(message)
        self.failures = failures
        self.results = results


def spawn_ranks(world_size: int, fn: Callable[..., Any], args: Sequence[Any] = (), timeout_s: float = 120.0,
                *, threads: int = 1, grace_s: float = 5.0, pg_timeout_s: float | None = None) -> list[Any]:
    """``[fn(rank, world_size, *args) for every rank]``, each run in its own spawned process.

    ``fn`` and ``args`` must be picklable (``fn`` a module-level function); ``fn`` runs after
    ``init_process_group("gloo")`` (world = ``world_size``, default group), with
    ``torch.set_num_threads(threads)``, and returns a picklable result. Raises RankLaunchError
    naming every rank that raised (with its traceback), exited without a result or was still
    running at ``timeout_s``; once one rank has failed the others get ``grace_s`` to finish.
    ``pg_timeout_s`` bounds the group's own collectives (default: ``timeout_s``).
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r}: must be an int >= 1")
    if not callable(fn):
        raise TypeError(f"fn={fn!r}: must be a picklable module-level function")
    ctx = mp.get_context("spawn")
    store = loopback_store(timedelta(seconds=timeout_s))
    results_q = ctx.Queue()
    pg_timeout = float(pg_timeout_s if pg_timeout_s is not None else timeout_s)
    secret = new_secret()  # this run's: every rank gets it through its spawn pipe
    procs = [ctx.Process(target=_rank_main, name=f"draftgraph-rank{rank}", daemon=True,
                         args=(rank, world_size, store.port, fn, tuple(args), results_q, threads, pg_timeout,
                               secret))
             for rank in range(world_size)]
    for p in procs:
        p.start()
    try:
        results, failures = _collect(procs, results_q, timeout_s, grace_s)
    finally:
        _stop(procs)
    if failures:
        text = "\n".join(f"rank {r}: {why}" for r, why in sorted(failures.items()))
        raise RankLaunchError(f"{len(failures)} of {world_size} ranks failed:\n{text}", failures, results)
    return [results[r] for r in range(world_size)]


def loopback_store(timeout: timedelta) -> dist.TCPStore:
    """A TCPStore server listening on 127.0.0.1 only, on a port the OS picks.

    ``TCPStore(host, ...)`` as a server listens on ``[::]`` whatever ``host`` says; so the
    socket is bound and listening here and handed over (``master_listen_fd``; the store owns it
    from then on). torch 2.14's libuv backend serves on it (checked by a test)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((_HOST, 0))
        sock.listen(socket.SOMAXCONN)
        port = sock.getsockname()[1]
    except OSError:
        sock.close()
        raise
    fd = sock.detach()
    try:
        return dist.TCPStore(_HOST, port, None, True, timeout=timeout, wait_for_workers=False,
                             master_listen_fd=fd, use_libuv=True)
    except BaseException:
        os.close(fd)
        raise


def _collect(procs: list[Any], results_q: Any, timeout_s: float, grace_s: float
             ) -> tuple[dict[int, Any], dict[int, str]]:
    """Results and failures by rank, waiting at most ``timeout_s`` (less once a rank failed)."""
    results: dict[int, Any] = {}
    failures: dict[int, str] = {}
    deadline = time.monotonic() + timeout_s
    dead_since: dict[int, float] = {}
    while len(results) + len(failures) < len(procs):
        now = time.monotonic()
        if now >= deadline:
            break
        try:
            rank, ok, payload = results_q.get(timeout=min(0.2, deadline - now))
        except queue_mod.Empty:
            for rank, p in enumerate(procs):
                if rank in results or rank in failures or p.exitcode is None:
                    continue
                first = dead_since.setdefault(rank, now)
                if now - first > 1.0:  # its result would have arrived by now
                    failures[rank] = f"exited with code {p.exitcode} without a result"
                    deadline = min(deadline, now + grace_s)
            continue
        if ok:
            results[rank] = pickle.loads(payload)
        else:
            failures[rank] = f"raised:\n{payload}"
            deadline = min(deadline, time.monotonic() + grace_s)
    for rank, p in enumerate(procs):
        if rank not in results and rank not in failures:
            state = "still running" if p.exitcode is None else f"exited with code {p.exitcode}"
            failures[rank] = f"no result within the time limit ({state}; stopped)"
    return results, failures


def _stop(procs: list[Any]) -> None:
    """Join every rank briefly; terminate, then kill, the ones still alive (only ours)."""
    for p in procs:
        p.join(timeout=2.0)
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(timeout=2.0)
        if p.is_alive():
            p.kill()
            p.join(timeout=2.0)


def _rank_main(rank: int, world_size: int, port: int, fn: Callable[..., Any], args: tuple[Any, ...],
               results_q: Any, threads: int, pg_timeout_s: float, secret: bytes | None = None) -> None:
    """Body of one rank's process: take the run's secret, join the group, run ``fn``, send back its
    result or traceback."""
    if sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback only
    set_process_secret(secret)
    torch.set_num_threads(threads)
    try:
        timeout = timedelta(seconds=pg_timeout_s)
        store = dist.TCPStore(_HOST, port, None, False, timeout=timeout)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timeout)
        try:
            payload = pickle.dumps(fn(rank, world_size, *args))
        finally:
            dist.destroy_process_group()
        results_q.put((rank, True, payload))
    except BaseException:  # report everything, including KeyboardInterrupt and SystemExit
        results_q.put((rank, False, traceback.format_exc()))
