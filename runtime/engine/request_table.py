"""The engine's request table: slots, the waiting queue, the running batch, results and aborts.

A request is waiting (no slot), running (a slot: its row in the per-slot device state and the
K/V caches) or ended (finished, aborted or failed; its tokens kept until `pop_result` takes
them). One owner: only the stepping thread changes the waiting queue and the running batch.
Another thread may call `add`, `result`, `pop_result` and `abort`: `add` and `abort` post
messages (a bounded inbox of adds, a set of aborts) that `begin_step` applies at the step
boundary, so no removal can race an append, and an abort applies exactly once wherever the
request is (not yet applied, waiting, running; an ended one needs none). The few dict
operations that move a request between live and ended are done under one lock, so a reader
sees a request live or ended, never neither.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterator, Sequence

from draftgraph.runtime.sampling import GREEDY, SamplingParams

from .admission import AdmissionRules
from .requests import Request, RequestFailed
from .stats import EngineStats

__all__ = ["RequestTable", "InboxFull", "MAX_INBOX"]

logger = logging.getLogger(__name__)

MAX_INBOX = 65536  # adds posted and not yet applied at a step boundary


class InboxFull(RuntimeError):
    """More adds are posted than ``max_inbox`` before a step boundary applied them."""


class RequestTable:
    """Requests of one engine with ``max_slots`` slots (numbered 1..max_slots; slot 0 is the
    dummy slot pad rows write to). ``vocab_size`` / ``max_len`` bound what `add` accepts (`rules`);
    ``reserve`` positions of ``max_len`` stay free for the widest verify tree; ``max_inbox``
    adds may wait for the next step boundary (`InboxFull` past it)."""

    def __init__(self, max_slots: int, vocab_size: int, max_len: int, reserve: int, stats: EngineStats,
                 max_inbox: int = MAX_INBOX) -> None:
        self.max_slots = max_slots
        self.vocab_size, self.max_len, self.reserve = vocab_size, max_len, reserve
        self.rules = AdmissionRules(vocab_size, max_len, reserve)  # the routes ask the same object
        self.stats = stats
        self.running: list[Request] = []
        self._next_id = 0
        self.max_inbox = max_inbox
        self._waiting: deque[Request] = deque()  # the stepping thread's alone
        self._inbox: list[Request] = []  # posted adds (under the lock), moved to _waiting at the boundary
        self._live: dict[int, Request] = {}  # waiting or running, by id
        self._finished: dict[int, Request] = {}  # ended, not yet taken by pop_result
        self._just_finished: list[int] = []  # ids that ended in the current step
        self._aborts: set[int] = set()  # applied at the next step boundary
        self._lock = threading.Lock()
        self._free = list(range(max_slots, 0, -1))

    # ---- any thread ----------------------------------------------------------------------------
    def add(self, prompt_ids: Sequence[int], max_new_tokens: int, sampling: SamplingParams = GREEDY) -> int:
        """Queue a request drawing with ``sampling`` (its seed resolved); returns its id.
        ValueError naming the field for ids outside [0, vocab), an empty prompt, a bad
        ``max_new_tokens`` or a request too long to serve."""
        if not isinstance(sampling, SamplingParams):
            raise TypeError(f"sampling={sampling!r}: must be a SamplingParams or None")
        if not sampling.greedy and sampling.seed is None:
            raise ValueError(f"sampling={sampling!r}: seed=None, a sampled request's seed must be resolved")
        ids = self.rules.check(prompt_ids, max_new_tokens)
        with self._lock:
            if len(self._inbox) >= self.max_inbox:
                raise InboxFull(f"{len(self._inbox)} adds wait in the inbox for a step boundary "
                                f"(max_inbox={self.max_inbox})")
            rid = self._next_id
            self._next_id += 1
            req = Request(rid, ids, max_new_tokens, sampling)
            self._live[rid] = req
            self._inbox.append(req)
        return rid

    def result(self, rid: int, start: int = 0) -> list[int]:
        """Tokens generated so far for ``rid`` from index ``start`` on (a reader that has the
        first ``start`` copies only the new ones); RequestFailed for a failed request, KeyError
        for an unknown or taken id; ValueError for a ``start`` that is not an int >= 0."""
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise ValueError(f"start={start!r}: must be an int >= 0 (tokens already read)")
        with self._lock:
            req = self._finished.get(rid) or self._live.get(rid)
            if req is None:
                raise KeyError(f"request id {rid!r}: unknown (never added, or taken by pop_result)")
        _raise_failed(req)
        return req.output[start:]

    def pop_result(self, rid: int) -> list[int] | None:
        """Take the tokens of ended request ``rid`` (then forgotten); None while it is live."""
        with self._lock:
            req = self._finished.pop(rid, None)
            if req is None:
                if rid in self._live:
                    return None
                raise KeyError(f"request id {rid!r}: unknown (never added, or taken by pop_result)")
        _raise_failed(req)
        return req.output

    def abort(self, rid: int) -> bool:
        """Ask to stop ``rid`` at the next step boundary: True when it was live, False when it
        had already ended; KeyError for an unknown or taken id."""
        with self._lock:
            if rid in self._finished:
                return False
            if rid not in self._live:
                raise KeyError(f"request id {rid!r}: unknown (never added, or taken by pop_result)")
            self._aborts.add(rid)
        return True

    def has_work(self) -> bool:
        return bool(self._waiting or self.running or self._inbox)

    def next_batch_size(self) -> int:
        """Running requests plus the waiting ones admission has free slots for."""
        return len(self.running) + min(len(self._waiting) + len(self._inbox), len(self._free))

    def counts(self) -> dict[str, int]:
        """Requests not yet applied (inbox), waiting and running, as of now (any thread)."""
        return {"inbox": len(self._inbox), "waiting": len(self._waiting), "running": len(self.running)}

    # ---- the serving thread, at step boundaries ------------------------------------------------
    def begin_step(self) -> None:
        """Start the list of requests ending in this step; apply the posted adds, then the
        posted aborts (each once: a request already ended needs none)."""
        self._just_finished = []
        if not self._inbox and not self._aborts:
            return
        with self._lock:
            adds, self._inbox = self._inbox, []
            aborts, self._aborts = self._aborts, set()
        self._waiting.extend(adds)
        if not aborts:
            return
        ended = [self._live[rid] for rid in sorted(aborts) if rid in self._live]
        if not ended:
            return
        gone = {req.rid for req in ended}
        if any(req.slot < 0 for req in ended):
            self._waiting = deque(r for r in self._waiting if r.rid not in gone)
        if any(req.slot >= 0 for req in ended):
            self.running = [r for r in self.running if r.rid not in gone]
        for req in ended:
            req.aborted = req.done = True
            self.stats.add("requests_aborted")
            self._end(req)

    def ended(self) -> list[int]:
        """Ids of the requests that ended in this step, ascending."""
        return sorted(self._just_finished)

    def admissions(self) -> Iterator[Request]:
        """Waiting requests, each given a free slot, in arrival order, while slots are free. The
        caller prefills each, then calls `admitted`, `fail` or `requeue` for it."""
        while self._waiting and self._free:
            req = self._waiting.popleft()
            req.slot = self._free.pop()
            yield req

    def admitted(self, req: Request) -> None:
        """``req`` was prefilled: running, or finished already (its first token ended it)."""
        self.stats.add("tokens_generated", len(req.output))
        if req.done:
            self.finish(req)
        else:
            self.running.append(req)

    def requeue(self, req: Request) -> None:
        """Admission of ``req`` was interrupted: its slot freed, back at the head of the queue."""
        self._undo(req)
        self._waiting.appendleft(req)

    def fail(self, req: Request, exc: Exception) -> None:
        """``req`` failed while admitted: logged with its traceback, then kept without it."""
        self._undo(req)
        logger.error("request %d failed while admitting it; the engine serves the others",
                     req.rid, exc_info=exc)
        cause: BaseException | None = exc
        while cause is not None:  # the tracebacks hold the failing frames and their tensors
            cause.__traceback__ = None
            cause = cause.__cause__ or cause.__context__
        req.error = exc
        req.done = True
        self.stats.add("requests_failed")
        self._end(req)

    def retire_done(self) -> None:
        """End every running request that is done (after a step committed its tokens)."""
        if any(r.done for r in self.running):
            for r in self.running:
                if r.done:
                    self.finish(r)
            self.running = [r for r in self.running if not r.done]

    def finish(self, req: Request) -> None:
        self.stats.add("requests_finished")
        self._end(req)

    def _undo(self, req: Request) -> None:
        self._free.append(req.slot)
        req.slot, req.seq_len, req.done = -1, 0, False
        req.output.clear()

    def _end(self, req: Request) -> None:
        """Move an ended request from live to finished, its slot freed."""
        if req.slot >= 0:
            self._free.append(req.slot)
        req.slot = -1
        with self._lock:  # one move: another thread sees it live or finished, never neither
            self._finished[req.rid] = req
            self._live.pop(req.rid, None)
        self._just_finished.append(req.rid)


def _raise_failed(req: Request) -> None:
    if req.error is not None:
        err = req.error
        raise RequestFailed(req.rid, f"request id {req.rid}: failed while admitting it "
                                     f"({type(err).__name__}: {err})") from err
