"""Several ranks (tensor parallel): reloads and adaptive switches that every rank takes at the same step.

Each rank runs its own draft worker and graphs, and the draft step holds collectives, so every
rank must replay the same state at every step. A `RankCoordinator` wraps one rank's worker:

- `propose_reload` may be called on any rank (also from a signal handler: it only records);
- `step()` is called by every rank's serving loop at each step boundary and returns the
  generation now serving. Every ``poll_every`` steps it polls: rank 0 (the leader) publishes
  its word for the round (its adaptive choice, and a reload when a proposal is pending); the
  others read it. Between polls no communication happens at all.
- A reload is two-phase (`two_phase`): every rank validates, builds and captures the new state aside
  (`worker.reloads.prepare`) and votes; the leader decides (all ready: commit; else abort naming the
  failing or missing ranks) and every rank follows that one decision in the same `step()`
  call: all swap, or all keep the old state and log why. No rank serves a generation the
  others do not.
- Every poll word carries a fingerprint of what the leader serves (generation, S, k, N, tree);
  each other rank compares it with its own at the same step and, when they differ, raises
  `RankDivergenceError` naming both: ranks never diverge silently.
- Messages prove their sender: with a secret (``secret=``, or the one `spawn_ranks` hands its
  ranks privately) every store value carries a MAC, and one that fails it is refused, counted
  (``stats.forged``) and logged with its key (see `auth`). Without one the ranks warn once.
- Zero-collective mode for engines that already broadcast per-step metadata: the leader calls
  `stamp()` and sends the three ints with its own broadcast; every rank (the leader too) then
  calls `apply(stamp)` instead of `step()`.

Everything travels through the process group's c10d store (see `protocol` for why not
collectives); every wait is bounded by ``timeout_s`` and a timeout names the missing rank.
Serving loop, on every rank::

    coordinator = RankCoordinator(worker)            # start-up agreement, raises on mismatch
    while serving:
        generation = coordinator.step()              # the generation this step serves
        s = controller.step(accepted)                # optional: AdaptiveStepController(coordinator=...)
        out = worker.draft_forward(batch)
"""

from __future__ import annotations

import dataclasses
import logging
import time
import zlib
from collections import deque
from typing import Any

import torch
import torch.distributed as dist

from draftgraph.runtime.worker import RELOAD_POLICIES, DraftWorker

from ..config import RuntimeArgs
from ..validation import ConfigTypeError, require_positive_int
from .auth import next_instance, process_secret, run_id, warn_unauthenticated
from .protocol import STORE_ERRORS, ProtocolError, RankProtocol, RankTimeout
from .record import CoordinatorRecord, CoordinatorStats
from .two_phase import ReloadOutcome, run_reload

__all__ = ["RankCoordinator", "CoordinatorStats", "ProposalRejected", "RankDivergenceError", "RankMismatchError",
           "RankTimeout", "startup_fingerprint", "state_fingerprint"]

logger = logging.getLogger(__name__)

_POLL_ERRORS = (*STORE_ERRORS, ProtocolError)  # a dead store, or a store entry that breaks the schema


class ProposalRejected(ValueError):
    """A reload proposal was refused: another one is waiting or in flight."""


class RankMismatchError(ValueError):
    """Ranks disagree at start-up (spec, topology, capture sizes, backend ...)."""


class RankDivergenceError(RuntimeError):
    """This rank serves another generation or state than the leader at the same step: the
    ranks would run different collectives (a hang) or different drafts, so the rank stops."""


def startup_fingerprint(worker: DraftWorker, poll_every: int) -> dict[str, str]:
    """What must be equal on every rank: worker type, args (device index aside), active spec,
    capture sizes, graph backend, row layout (hidden size), generation and the poll period."""
    args = worker.args
    out = {"worker": type(worker).__name__, "poll_every": str(poll_every)}
    for f in dataclasses.fields(args):
        value = getattr(args, f.name)
        out[f"args.{f.name}"] = torch.device(value).type if f.name == "device" else repr(value)
    state = worker.state
    out["spec"] = repr(state.spec)
    out["capture_sizes"] = repr(tuple(state.capture_sizes))
    out["backend"] = state.graphs.backend_name if state.graphs is not None else "none"
    drafting = getattr(worker, "drafting", None)  # an EAGLE worker: its draft model's row layout
    rows = getattr(drafting, "row_layout", None)  # the draft state's row layout (hidden size, or named leaves)
    out["rows"] = rows.describe() if rows is not None else "none"
    out["generation"] = str(state.generation)
    return out


def state_fingerprint(worker: DraftWorker) -> int:
    """A 31-bit fingerprint of what ``worker`` serves now: generation, S, k, N and tree."""
    state = worker.state
    spec = state.spec
    text = (f"{state.generation}|{int(getattr(state, 'target_only', False))}|{spec.num_steps}|{spec.topk}|"
            f"{spec.num_draft_tokens}|{spec.tree_choices}")
    return zlib.crc32(text.encode()) & 0x7FFFFFFF


def _mismatches(prints: list[dict[str, str]]) -> list[str]:
    """One line per differing field: which ranks hold which value."""
    lines = []
    for key in sorted({k for p in prints for k in p}):
        by_value: dict[str, list[int]] = {}
        for rank, p in enumerate(prints):
            by_value.setdefault(p.get(key, "<missing>"), []).append(rank)
        if len(by_value) > 1:
            parts = "; ".join(f"rank {', '.join(map(str, ranks))} = {value}"
                              for value, ranks in by_value.items())
            lines.append(f"{key}: {parts}")
    return lines


class RankCoordinator:
    """Keeps one rank's worker in step with the other ranks of ``group`` (default: the world).

    ``poll_every``: steps between polls (must match on every rank); ``timeout_s``: the longest
    any rank waits for another (a reload's build and capture must fit in it). ``store``: the
    c10d store to talk through (default: the default process group's); ``name`` separates
    several coordinators of one group. Construction is collective: every rank of the group must
    build its coordinator, in the same order; ranks that disagree raise RankMismatchError on
    every rank, a rank that does not arrive raises RankTimeout naming it.

    One job, agreement between the ranks: proposals, the poll or stamp of each step and the
    two-phase reload share the store protocol, the proposal slot and the leader's word, so they
    stay one class; what it did is `record` (`CoordinatorRecord`: ``stats``, ``history``,
    ``last_error``), the reload's phases are `two_phase`'s.
    """

    def __init__(self, worker: DraftWorker, group: Any = None, poll_every: int = 8, timeout_s: float = 30.0,
                 *, store: Any = None, name: str = "draft", secret: bytes | None = None) -> None:
        self.poll_every = require_positive_int("poll_every", poll_every)
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s!r}: must be a number > 0 (seconds)")
        for method in ("prepare", "commit", "discard"):
            if not callable(getattr(getattr(worker, "reloads", None), method, None)):
                raise ConfigTypeError(f"worker={type(worker).__name__}: needs reloads.{method} (a draft worker)")
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialized: call init_process_group first "
                               "(draftgraph.runtime.spawn_ranks does it for CPU processes)")
        self.worker = worker
        self.timeout_s = float(timeout_s)
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        if self.rank < 0:
            raise ValueError(f"group={group!r}: this process (global rank {dist.get_rank()}) is not in it")
        base = store if store is not None else dist.distributed_c10d._get_default_store()  # noqa: SLF001  # no public getter
        tag = "world" if group is None else "-".join(map(str, dist.get_process_group_ranks(group)))
        secret = secret if secret is not None else process_secret()
        if secret is None:
            warn_unauthenticated()
        # the instance is counted in this process (construction is collective, in the same order
        # on every rank), never read from the store, whose counters any local process may bump
        instance = next_instance(f"{name}/{tag}")
        self._proto = RankProtocol(base, f"draftgraph/{name}/{tag}/{run_id(secret)}/{instance}/", self.rank,
                                   self.world_size, self.timeout_s, secret=secret)
        self.record = CoordinatorRecord()  # counters, the latest 64 events, the latest error
        self.stats, self.history = self.record.stats, self.record.history
        self._local: deque[tuple[RuntimeArgs, str]] = deque()  # appended by propose_reload
        self._mode: str | None = None
        self._choice: int | None = None  # the agreed adaptive choice
        self._leader_choice = 0  # leader: the choice it will publish at the next poll
        self._announced = 0  # leader: reload number announced by stamp(), not yet applied
        self._reload_n = 0  # leader: reloads announced so far
        self._own_pending = False  # leader: its own proposal holds the slot (poll mode)
        self._diverged_from = -1  # the leader generation last reported as diverged
        self._agree_at_startup()

    @property
    def last_error(self) -> str | None:
        """The latest error on this rank (a rejected proposal, an aborted reload, a fault)."""
        return self.record.last_error

    @property
    def is_leader(self) -> bool:
        """True on group rank 0, whose word every rank follows."""
        return self.rank == 0

    @property
    def store_namespace(self) -> str:
        """The store prefix this coordinator's keys live under (run id and instance included)."""
        return self._proto.namespace

    @property
    def generation(self) -> int:
        """The generation the worker serves (equal on every rank at equal step counts)."""
        return self.worker.state.generation

    def _agree_at_startup(self) -> None:
        prints = self._proto.exchange("hello", startup_fingerprint(self.worker, self.poll_every))
        lines = _mismatches(prints)
        if lines:
            raise RankMismatchError("ranks disagree at start-up (fix the configuration of the ranks "
                                    "named):\n  " + "\n  ".join(lines))

    # ---- proposals ---------------------------------------------------------------------------
    def propose_reload(self, new_args: RuntimeArgs, policy: str = "swap") -> None:
        """Ask every rank to reload to ``new_args`` at the next poll (safe in a signal handler).

        Raises ProposalRejected when this rank's previous proposal has not been published yet;
        a proposal that collides with another rank's at the poll is rejected there: logged, in
        ``history`` and ``last_error`` on its proposer. The outcome is in ``history``."""
        if not isinstance(new_args, RuntimeArgs):
            raise ConfigTypeError(f"new_args={type(new_args).__name__}: must be a RuntimeArgs")
        if policy not in RELOAD_POLICIES:
            raise ValueError(f"policy={policy!r}: must be one of {list(RELOAD_POLICIES)}")
        if self._local:
            raise ProposalRejected(f"rank {self.rank}: a proposal ({self._local[0][0].speculative}) is "
                                   f"already waiting for the next poll; one proposal at a time")
        self._local.append((new_args, policy))

    def _publish_local(self, mark_from: int | None = None) -> None:
        """Put this rank's waiting proposal into the shared slot, or reject it if the slot is held.

        Poll mode: the leader learns of it at the round marked from ``mark_from`` on (its own
        proposal: at its next poll); stamp mode: at its next look at the slot."""
        if not self._local:
            return
        args, policy = self._local.popleft()
        try:
            holder = self._proto.offer((self.rank, args, policy))
            if holder is None and mark_from is not None:
                if self.is_leader:
                    self._own_pending = True
                else:
                    self._proto.mark_round(mark_from)
        except _POLL_ERRORS as exc:
            self._fault(f"could not publish the reload proposal to {args.speculative}: {exc}")
            return
        if holder is not None:
            msg = (f"reload proposal from rank {self.rank} ({args.speculative}, {policy}) rejected: "
                   f"rank {holder[0]}'s proposal ({holder[1].speculative}) is in flight; propose "
                   f"again after it completes")
            logger.error(msg)
            self.record.rejected(msg, self.rank, str(args.speculative))

    def _count_refused(self) -> None:
        self.stats.forged, self.stats.stale = self._proto.forged, self._proto.stale

    def _leader_take(self, marked: bool = False) -> int:
        """Leader: a pending proposal becomes reload n (returned), else 0 (`RankProtocol.take`)."""
        self._own_pending = False
        payload = self._proto.take(marked)
        if payload is None:
            return 0
        try:
            self._proto.check_proposal(payload)
        except ProtocolError as exc:  # written by no rank of ours: refused here, nothing runs
            self._proto.release()
            msg = f"reload proposal refused: {exc}"
            logger.error("rank %d: %s; generation %d keeps serving", self.rank, msg, self.generation)
            self.record.rejected(msg, -1, None)
            return 0
        self._reload_n += 1
        self._proto.post_reload(self._reload_n, payload)
        return self._reload_n

    # ---- poll mode -----------------------------------------------------------------------------
    def step(self) -> int:
        """Call at every step boundary on every rank; returns the generation this step serves.

        Every ``poll_every``-th call (the first included) polls; a reload agreed there is built,
        voted and swapped inside this call, on every rank. A proposal made on this rank is
        published at its next call; with ranks in lockstep (the draft step's collectives) a
        proposal made before step t takes effect at the first poll after t."""
        if self._mode != "poll":
            self._enter("poll")
        t = self.stats.steps
        self.stats.steps = t + 1
        if self._local:  # publish at once and mark this rank's next poll round for the leader
            self._publish_local(mark_from=-(-t // self.poll_every))
        if t % self.poll_every:
            return self.worker.state.generation
        start = time.perf_counter()
        mine = state_fingerprint(self.worker)  # what this rank served up to this step
        try:
            if self.is_leader:
                r = t // self.poll_every
                word = self._word(self._leader_take() if self._own_pending else 0)
                if self._proto.open_round(r, (*word, mine, self._proto.epoch)):  # a proposer marked it
                    word = self._word(self._leader_take(marked=True))
                    self._proto.close_round(r, (*word, mine, self._proto.epoch))
            else:
                word = self._proto.read_round(t // self.poll_every)
        except _POLL_ERRORS as exc:
            self._count_refused()
            self._fault(f"poll at step {t} failed: {exc}")
            return self.worker.state.generation
        self._count_refused()
        self.stats.polls += 1
        self.stats.poll_s += time.perf_counter() - start
        if not self.is_leader and len(word) >= 4 and word[3] != mine:
            self._diverged(t, word)
        if not self.is_leader and len(word) >= 5:
            self._proto.epoch = max(self._proto.epoch, word[4])  # the slot's epoch, as the leader knows it
        self._follow(word[:3])
        return self.worker.state.generation

    def _diverged(self, t: int, word: tuple[int, ...]) -> None:
        """Stop loudly: this rank does not serve what the leader serves (see `RankDivergenceError`)."""
        state = self.worker.state
        msg = (f"rank {self.rank} diverged from the leader at step {t}: it serves generation {state.generation} "
               f"({state.spec}, fingerprint {state_fingerprint(self.worker)}), the leader generation {word[2]} "
               f"(fingerprint {word[3]}); stopping: ranks must serve the same state at every step")
        self.record.fault(msg)
        logger.critical(msg)
        raise RankDivergenceError(msg)

    def _enter(self, mode: str) -> None:
        if self._mode is not None:
            other = "step()" if self._mode == "poll" else "stamp()/apply()"
            raise RuntimeError(f"coordinator of rank {self.rank} runs in {self._mode} mode ({other}); "
                               f"do not mix step() with stamp()/apply()")
        self._mode = mode

    def _word(self, reload_n: int) -> tuple[int, int, int]:
        """Leader: (adaptive choice or 0, reload number or 0, generation served)."""
        return (self._leader_choice, reload_n, self.worker.state.generation)

    def _follow(self, word: tuple[int, ...]) -> None:
        """Take the leader's word: its adaptive choice, and its reload if any; a generation that
        differs from the leader's (a reload outside the coordinator) is reported, once."""
        choice, reload_n, generation = word
        if generation != self.worker.state.generation and generation != self._diverged_from:
            self._diverged_from = generation
            self._fault(f"serves generation {self.worker.state.generation}, the leader serves "
                        f"{generation}: the ranks diverged (a reload outside the coordinator?)")
        if choice > 0:
            self._choice = choice
        if reload_n:
            self._run_reload(reload_n)

    # ---- zero-collective mode ----------------------------------------------------------------
    def stamp(self) -> tuple[int, int, int]:
        """Leader, once per step: (adaptive choice or 0, reload number or 0, generation) to send
        to every rank with the engine's own per-step broadcast; then every rank calls `apply`.

        Costs no communication, except one store read every ``poll_every`` steps (a look at the
        proposal slot) and the reload itself when there is one."""
        if not self.is_leader:
            raise RuntimeError(f"stamp() on rank {self.rank}: only rank 0 (the leader) stamps")
        if self._mode != "stamp":
            self._enter("stamp")
        t = self.stats.steps
        if self._local:
            self._publish_local()
        if t % self.poll_every == 0 and not self._announced:
            start = time.perf_counter()
            try:
                self._announced = self._leader_take()
            except STORE_ERRORS as exc:
                self._fault(f"proposal check at step {t} failed: {exc}")
            self.stats.polls += 1
            self.stats.poll_s += time.perf_counter() - start
        return self._word(self._announced)

    def apply(self, stamp: tuple[int, int, int]) -> int:
        """Every rank (the leader too), once per step: follow the leader's stamp; returns the
        generation this step serves."""
        if self._mode != "stamp":
            self._enter("stamp")
        if (not isinstance(stamp, (tuple, list)) or len(stamp) != 3
                or not all(isinstance(v, int) and v >= 0 for v in stamp)):
            raise ValueError(f"stamp={stamp!r}: must be the (choice, reload, generation) ints >= 0 "
                             f"that the leader's stamp() returned")
        self.stats.steps += 1
        if self._local and not self.is_leader:
            self._publish_local()  # the leader finds it at its next proposal check
        if self.is_leader:
            self._announced = 0
        self._follow(tuple(int(v) for v in stamp))
        return self.worker.state.generation

    # ---- adaptive switching --------------------------------------------------------------------
    def shared_choice(self, local: int, initial: int) -> int:
        """The adaptive choice every rank serves: the leader's, as of the latest poll.

        ``local`` is this rank's own pick (only the leader's is used, published at the next
        poll); ``initial`` is served until the leader's first word (equal on every rank)."""
        if self._choice is None:
            self._choice = initial
        if self.is_leader:
            self._leader_choice = local
        return self._choice

    # ---- the two-phase reload ------------------------------------------------------------------
    def _run_reload(self, n: int) -> None:
        """Run reload ``n`` (`two_phase.run_reload`: every rank swaps or every rank keeps the old
        state) and keep its record: counters, the agreed choice, the log and ``history``."""
        start = time.perf_counter()
        out: ReloadOutcome = run_reload(self._proto, self.worker, n, self.timeout_s, self._fault)
        seconds = time.perf_counter() - start
        self.record.reload(n, out, seconds, self.generation)
        if out.reason is None:
            # an adaptive choice names a state of the old args (a schedule's band and S): every
            # rank serves the new args' initial choice until the leader's next word
            self._choice, self._leader_choice = None, 0
            logger.info("reload %d (proposed by rank %d) to %s committed on every rank; generation %d",
                        n, out.proposer, out.spec, self.generation)
        else:
            logger.error("%s; generation %d keeps serving on every rank", self.last_error, self.generation)
        self._count_refused()

    def _fault(self, message: str) -> None:
        """A peer or the store did not answer: log, count, keep serving the current state."""
        self.record.fault(message)
        logger.error("rank %d: %s; generation %d keeps serving", self.rank, message, self.generation)

