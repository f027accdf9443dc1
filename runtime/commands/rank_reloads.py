"""SIGHUP reloads of ``simulate --world-size N``: from the launcher, where the signal lands, to rank 0.

The operator signals the launcher (the process they started), which serves nothing: its ranks
are separate processes. So the launcher's `ProcessReloadSignal` is attached to a
`LauncherReloads`, which reads nothing itself but puts each checked request (args as plain data)
on a queue private to the launcher and its ranks; rank 0 runs a `RankReloads` that proposes it
through its engine, i.e. to every rank through the coordinator (all ranks reload at one step).
A request made before the ranks serve waits in the queue until rank 0's engine is attached.
"""

from __future__ import annotations

import logging
import queue as queue_mod
import threading
from typing import Any

from draftgraph.runtime import RuntimeArgs
from draftgraph.runtime.args_file import runtime_args_from_dict, runtime_args_to_dict

__all__ = ["LauncherReloads", "RankReloads"]

logger = logging.getLogger(__name__)


class LauncherReloads:
    """What the launcher's `ProcessReloadSignal` attaches to: `request_reload` queues the request
    for rank 0 (safe in a signal handler: one put on a multiprocessing queue)."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel

    def request_reload(self, new_args: RuntimeArgs, policy: str = "swap") -> None:
        """Send ``new_args`` to rank 0, which proposes it to every rank."""
        self.channel.put({"args": runtime_args_to_dict(new_args), "policy": policy})


class RankReloads:
    """Rank 0's side: from `attach` to `detach` a thread takes the launcher's requests and passes
    them to ``engine.request_reload`` (a refused one is logged; serving goes on)."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.received = self.requested = self.rejected = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def attach(self, engine: Any) -> None:
        """Start taking requests for ``engine``."""
        self._thread = threading.Thread(target=self._run, args=(engine,), daemon=True,
                                        name="draftgraph-rank-reloads")
        self._thread.start()

    def detach(self) -> None:
        """Stop taking requests (waits at most a second for the thread)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)

    def _run(self, engine: Any) -> None:
        while not self._stop.is_set():
            try:
                item = self.channel.get(timeout=0.1)
            except queue_mod.Empty:
                continue
            except (EOFError, OSError):  # the launcher went away
                return
            self.received += 1
            try:
                engine.request_reload(runtime_args_from_dict(item["args"]), item["policy"])
            except Exception as exc:  # a refused reload: report, serve on
                self.rejected += 1
                logger.error("reload from the launcher rejected, still serving the previous state: %s", exc)
            else:
                self.requested += 1
                logger.info("reload from the launcher (SIGHUP) proposed to every rank")

    def as_dict(self) -> dict[str, int]:
        """Requests received from the launcher, proposed, rejected."""
        return {"received": self.received, "requested": self.requested, "rejected": self.rejected}
