"""`EngineBridge`: one engine, one stepping thread, and the streams HTTP handlers read.

The stepping thread is the only caller of ``engine.step()``. Handlers (on the event loop) call
`submit` and `abort`, which use the engine's thread-safe ``add_request`` / ``abort_request``: they
post messages the stepping thread applies at its next step boundary (the request table has one
owner), so a request joins the running batch there (continuous batching) and an abort applies once. After each
step the thread publishes each live request's committed tokens into its `Stream` (a new list
reference, never a queue that can grow) and wakes the readers with one
``call_soon_threadsafe`` per event loop: a step never waits on a client, and a slow client only
reads a longer list later. A stream's tokens are bounded by its ``max_tokens``.

A step that raises fails the requests of its batch (their streams end with the error, the
requests are aborted at the next boundary) and the thread serves on. `begin_drain` only writes
attributes (safe in a signal handler): the thread then lets live requests run for ``drain_s``,
aborts what is left and calls ``on_drained``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from draftgraph.runtime.engine.request_table import InboxFull
from draftgraph.runtime.engine.requests import RequestFailed

__all__ = ["EngineBridge", "QueueFull", "Stream"]

logger = logging.getLogger(__name__)

IDLE_WAIT_S = 0.05  # the stepping thread re-checks drains and boundary jobs this often when idle


class QueueFull(RuntimeError):
    """More requests wait than ``max_waiting`` allows (HTTP 429)."""


class Stream:
    """One request's committed tokens, as the stepping thread last published them.

    Written by the stepping thread (``tokens`` first, then ``error`` / ``done``); read on the
    event loop: read ``done`` and ``error`` before ``tokens`` and the tokens are final when done."""

    def __init__(self, rid: int, prompt_len: int, loop: asyncio.AbstractEventLoop) -> None:
        self.rid = rid
        self.prompt_len = prompt_len
        self.loop = loop
        self.tokens: list[int] = []
        self.error: str | None = None
        self.done = False
        self._news = False  # set on ``loop`` when something changed since the last `changed`
        self._waiter: asyncio.Future[None] | None = None

    def wake(self) -> None:
        """Something changed (called on ``loop``)."""
        self._news = True
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def changed(self, timeout_s: float) -> None:
        """Wait until the stepping thread published something new (or ``timeout_s`` passed):
        one future and one timer per wait, no task."""
        if not self._news:
            waiter = self._waiter = self.loop.create_future()
            timer = self.loop.call_later(timeout_s, _expire, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
        self._news = False


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class EngineBridge:
    """Drives ``engine`` from one thread (see the module docstring). ``max_waiting``: live
    requests beyond the engine's slots (``max_slots``) before `submit` raises `QueueFull`."""

    def __init__(self, engine: Any, max_waiting: int, on_drained: Callable[[], None] | None = None) -> None:
        self.engine = engine
        self.max_waiting = max_waiting
        self.on_drained = on_drained
        self._live: dict[int, Stream] = {}
        self._failed: set[int] = set()  # ended by a failed step: popped quietly when they end
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._jobs: list[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = []
        self._stop = False
        self._drain_s: float | None = None  # set by begin_drain (signal context: a plain write)
        self._drain_deadline: float | None = None
        self._drained = False
        self.running = 0  # the running batch after the last step
        self.steps = 0
        self.step_failures = 0
        self._thread = threading.Thread(target=self._run, name="draftgraph-serve-step", daemon=True)

    # ---- the event loop's side -----------------------------------------------------------------
    def start(self) -> EngineBridge:
        self._thread.start()
        return self

    @property
    def draining(self) -> bool:
        return self._drain_s is not None

    def counts(self) -> dict[str, int]:
        """Live requests, the running batch and the waiting ones (as of the last step)."""
        live = len(self._live)
        running = min(self.running, live)
        return {"live": live, "running": running, "waiting": live - running}

    def submit(self, prompt_ids: Sequence[int], max_tokens: int, sampling: Any = None) -> Stream:
        """Queue a request drawing with ``sampling`` (a `SamplingParams`; None: greedy); it joins
        the batch at the next step boundary; `QueueFull` past ``max_waiting``, the engine's
        ValueError for a request it cannot serve."""
        loop = asyncio.get_running_loop()
        with self._wake:
            waiting = len(self._live) - self.engine.max_slots  # those the next admission leaves waiting
            if waiting >= self.max_waiting:
                raise QueueFull(f"{waiting} requests wait already (--max-waiting={self.max_waiting})")
            try:
                rid = self.engine.add_request(list(prompt_ids), max_tokens, sampling)
            except InboxFull as exc:
                raise QueueFull(str(exc)) from None
            stream = Stream(rid, len(prompt_ids), loop)
            self._live[rid] = stream
            self._wake.notify()
        return stream

    def abort(self, stream: Stream) -> None:
        """Stop ``stream``'s request at the next step boundary (its slot is freed there)."""
        if stream.done:
            return
        try:
            self.engine.abort_request(stream.rid)
        except KeyError:  # ended and taken meanwhile
            return
        with self._wake:
            self._wake.notify()

    def call_at_boundary(self, fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        """Run ``fn`` on the stepping thread between two steps; its result in the future."""
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._wake:
            self._jobs.append((fn, fut))
            self._wake.notify()
        return fut

    def begin_drain(self, drain_s: float) -> None:
        """Stop taking requests (the routes check `draining`) and let the live ones finish
        within ``drain_s``; safe in a signal handler (one attribute write)."""
        if self._drain_s is None:
            self._drain_s = float(drain_s)

    def stop(self, timeout_s: float = 30.0) -> bool:
        """End the stepping thread (after the step in progress); False when it did not end."""
        with self._wake:
            self._stop = True
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    # ---- the stepping thread -------------------------------------------------------------------
    def _run(self) -> None:
        engine = self.engine
        while True:
            with self._wake:
                if not self._stop and not self._jobs and not engine.has_work():
                    self._wake.wait(IDLE_WAIT_S)
                if self._stop:
                    break
                jobs, self._jobs = self._jobs, []
            for fn, fut in jobs:
                _run_job(fn, fut)
            self._check_drain()
            if not engine.has_work():
                continue
            try:
                ended = engine.step()
            except Exception as exc:  # the step's batch fails; the server serves on
                self._fail_batch(exc)
                time.sleep(IDLE_WAIT_S)  # a fault that repeats is not retried in a hot loop
                continue
            self.steps += 1
            self.running = len(engine.running)
            self._publish(set(ended))

    def _publish(self, ended: set[int]) -> None:
        engine = self.engine
        changed: dict[asyncio.AbstractEventLoop, list[Stream]] = {}
        for rid, stream in list(self._live.items()):
            if rid in ended:
                try:
                    tokens = engine.pop_result(rid)
                except RequestFailed as exc:
                    tokens, stream.error = [], str(exc)
                with self._wake:
                    self._live.pop(rid, None)
                if rid in self._failed:
                    self._failed.discard(rid)
                    continue
                stream.tokens = list(tokens)
                stream.done = True
            elif rid in self._failed:
                continue
            else:
                new = engine.result(rid, len(stream.tokens))  # only the new ones: no copy of the whole list
                if not new:
                    continue
                stream.tokens.extend(new)
            changed.setdefault(stream.loop, []).append(stream)
        _notify(changed)

    def _fail_batch(self, exc: Exception) -> None:
        """The step raised: its batch's requests end with the error (aborted at the next
        boundary), every other request goes on."""
        self.step_failures += 1
        rids = [r.rid for r in self.engine.running]
        logger.error("an engine step failed; its %d requests %s fail, the server serves on", len(rids), rids,
                     exc_info=exc)
        changed: dict[asyncio.AbstractEventLoop, list[Stream]] = {}
        for rid in rids:
            stream = self._live.get(rid)
            if stream is None:
                continue
            self._failed.add(rid)
            stream.error = f"engine step failed: {type(exc).__name__}: {exc}"
            stream.done = True
            changed.setdefault(stream.loop, []).append(stream)
            try:
                self.engine.abort_request(rid)
            except KeyError:
                pass
        _notify(changed)

    def _check_drain(self) -> None:
        if self._drain_s is None or self._drained:
            return
        now = time.monotonic()
        if self._drain_deadline is None:
            self._drain_deadline = now + self._drain_s
            logger.warning("draining: %d requests in flight, %.0f s to finish", len(self._live), self._drain_s)
        live = [s for rid, s in self._live.items() if rid not in self._failed]
        if live and now < self._drain_deadline:
            return
        if live:
            logger.warning("drain time over: %d requests aborted", len(live))
            changed: dict[asyncio.AbstractEventLoop, list[Stream]] = {}
            for stream in live:
                stream.error = "server shutting down: the drain time ran out"
                stream.done = True
                self._failed.add(stream.rid)
                changed.setdefault(stream.loop, []).append(stream)
                try:
                    self.engine.abort_request(stream.rid)
                except KeyError:
                    pass
            _notify(changed)
        self._drained = True
        if self.on_drained is not None:
            self.on_drained()


def _run_job(fn: Callable[[], Any], fut: concurrent.futures.Future[Any]) -> None:
    if not fut.set_running_or_notify_cancel():
        return
    try:
        fut.set_result(fn())
    except Exception as exc:
        fut.set_exception(exc)


def _set_all(streams: list[Stream]) -> None:
    for s in streams:
        s.wake()


def _notify(changed: dict[asyncio.AbstractEventLoop, list[Stream]]) -> None:
    """Wake the readers: one call per event loop (a closed loop has no reader left)."""
    for loop, streams in changed.items():
        try:
            loop.call_soon_threadsafe(_set_all, streams)
        except RuntimeError:
            pass
