"""Several compile processes when nothing else needs the cores: a cold fill before serving.

One `CompileWorker` beside serving is the right number: a second one takes the core serving
runs on. Before serving starts (a fill: `draftgraph simulate` on a 2-core machine) nothing
competes, and the units of different runtime states compile independently, so one process per
usable core finishes the fill in about half the time (measured on 2 cores: the default demo's
five symbolic compiles took 53 s one after another in one process). `CompilePool` has the
`CompileWorker` interface (``compile``, ``pid``, ``closed``, ``close``, ``as_dict``, the
counts) and hands each call a free process, starting one while fewer than ``size`` run;
`set_size` shrinks it back (idle extra processes end at once, busy ones when their compile
returns).
"""

from __future__ import annotations

import threading
from typing import Any

from torch import Tensor, fx

from .worker import CompileWorker, CompileWorkerDied

__all__ = ["CompilePool"]


class CompilePool:
    """Up to ``size`` compile processes at once (each a `CompileWorker` on ``cache_dir``).
    Thread-safe: a call waits for a free process when ``size`` of them are busy."""

    def __init__(self, cache_dir: str | None = None, size: int = 1) -> None:
        self._cache_dir = cache_dir
        self._cond = threading.Condition()
        self._idle: list[CompileWorker] = []
        self._all: list[CompileWorker] = []
        self._retired: list[CompileWorker] = []  # ended workers: their counts stay in `as_dict`
        self._busy = 0
        self._closing = False
        self.size = 1
        self.most_at_once = 0  # the most compiles that ran at the same time
        self.set_size(size)

    def set_size(self, size: int) -> None:
        """Use up to ``size`` processes from now on (an int >= 1); idle ones above it end."""
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size={size!r}: must be an int >= 1 (compile processes)")
        with self._cond:
            self.size = size
            extra = self._idle[size:] if len(self._all) > size else []
            for worker in extra:
                self._retire(worker)
            self._cond.notify_all()
        for worker in extra:
            worker.close()

    def _retire(self, worker: CompileWorker) -> None:
        """Forget an idle ``worker`` (the caller holds the lock and closes it after)."""
        self._idle.remove(worker)
        self._all.remove(worker)
        self._retired.append(worker)

    def _take(self) -> CompileWorker:
        with self._cond:
            while True:
                if self._closing:
                    raise CompileWorkerDied("the compile process was closed")
                if self._idle:
                    worker = self._idle.pop()
                    break
                if len(self._all) < self.size:
                    worker = CompileWorker(self._cache_dir)
                    self._all.append(worker)
                    break
                self._cond.wait(0.1)
            self._busy += 1
            self.most_at_once = max(self.most_at_once, self._busy)
            return worker

    def _give_back(self, worker: CompileWorker) -> None:
        close = False
        with self._cond:
            self._busy -= 1
            if worker in self._all:
                if len(self._all) > self.size or self._closing:
                    self._all.remove(worker)
                    self._retired.append(worker)
                    close = True
                else:
                    self._idle.append(worker)
            self._cond.notify_all()
        if close:
            worker.close()

    def compile(self, gm: fx.GraphModule, inputs: tuple[Tensor, ...] | list[Tensor], dynamic: int = 0) -> bytes:
        """`CompileWorker.compile` in a free process of the pool."""
        worker = self._take()
        try:
            return worker.compile(gm, inputs, dynamic)
        finally:
            self._give_back(worker)

    def pid(self) -> int | None:
        """A live compile process's id (None when none runs)."""
        with self._cond:
            workers = list(self._all)
        for worker in workers:
            pid = worker.pid()
            if pid is not None:
                return pid
        return None

    @property
    def closed(self) -> bool:
        """True once `close` was called: a compile then fails because of the close."""
        return self._closing

    def close(self) -> None:
        """End every process for good (`CompileWorker.close`): compiles in progress raise
        `CompileWorkerDied` at once, and so does every later call."""
        with self._cond:
            self._closing = True
            workers = list(self._all)
            self._cond.notify_all()
        for worker in workers:
            worker.close()

    def _workers(self) -> list[CompileWorker]:
        with self._cond:
            return [*self._all, *self._retired]

    @property
    def compiles(self) -> int:
        return sum(w.compiles for w in self._workers())

    @property
    def deaths(self) -> int:
        return sum(w.deaths for w in self._workers())

    @property
    def compile_s(self) -> float:
        return sum(w.compile_s for w in self._workers())

    def as_dict(self) -> dict[str, Any]:
        """Counts and seconds over every process (JSON-ready), and the most run at once."""
        return {"compiles": self.compiles, "deaths": self.deaths, "compile_s": self.compile_s,
                "processes_at_once": self.most_at_once}
