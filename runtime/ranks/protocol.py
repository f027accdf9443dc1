"""Agreement among ranks over a c10d Store: rounds, one proposal slot, votes and one decision.

Why a store and not collectives (measured with torch 2.14.1 gloo on this machine): a gloo
collective that times out closes its connections ("Application timeout caused pair closure"),
so the group is unusable afterwards, and the error does not say which rank is missing. A store
operation that times out leaves the connection usable, the missing keys name the missing ranks,
and ``compare_set`` gives a decision that every rank, even a late one, reads the same. The
engine's process group never carries coordinator traffic, whatever its backend (NCCL or gloo).

Keys (under one namespace per coordinator): ``round/<r>`` the leader's word for poll round r
(one compare_set by the leader, one get by each other rank), or ``P`` when a proposer marked
the round, and then ``round/<r>/final`` holds the word; ``proposal`` the single proposal slot
(``-`` when free); ``reload/<n>`` the n-th reload's
(proposer, args, policy); ``vote/<n>/<rank>``; ``decision/<n>``; ``hello/<rank>`` at start-up.
Every value is plain data (`wire`: JSON with a schema check on every read; round words are
ints), never a pickle: the store has no authentication, so what it holds is not trusted. With a
``secret`` every value also carries a MAC (`auth.SignedStore`): a value that fails it is refused
(`ForgedValue`, counted in ``forged``, logged with its key), never obeyed; where the leader finds
a forgery in a key it writes (a round word, the proposal slot, a decision) it writes its own
value over it, and readers wait (bounded by the timeout) for a value that checks.
``reload/<n>`` and ``decision/<n>`` are deleted once every rank has read them (each rank, after
the decision, writes its signed ``done/<n>/<rank>``; the rank that finds every rank's there
deletes them), so the store stays bounded.

Bound to their moment: a signed value's MAC covers the run (the namespace: a run id derived
from the secret, and the coordinator's instance, counted in each process, not in the store), its
key (the round r, the reload n, the rank) and its payload. The proposal slot is the one key that
is written again and again, so its values carry the slot's epoch (the leader's count of
releases): a free slot is ``-<epoch>``, a proposal names the epoch of the free slot it took. The
leader refuses a proposal or a free value of another epoch, and a marked round whose slot is
free (a proposal dropped by a replayed free value): each counted in ``stale`` and logged, never
obeyed. Proposers learn the epoch from the free slot and from every poll word, so an old
proposal parked in the slot is replaced, not waited behind.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from ..config import RuntimeArgs
from . import wire
from .auth import ForgedValue, SignedStore
from .wire import ProtocolError

__all__ = ["RankProtocol", "RankTimeout", "ProtocolError", "open_store", "FREE", "STORE_ERRORS"]

logger = logging.getLogger(__name__)

FREE = b"-"  # the proposal slot holds no proposal (epoch 0; later epochs: wire.free_slot)
_MARK = b"P"  # a proposer's mark on a round: the leader must look at the proposal slot
_ABSENT = b"\x00absent"  # expected value of `peek`: no rank writes it (every value is ASCII)
_ROUND_WINDOW = 1024  # rounds a lagging rank may fall behind the leader before keys are dropped
_GC_BATCH = 256  # rounds deleted per background batch
STORE_ERRORS = (RuntimeError, dist.DistError)  # DistStoreError and socket errors of a dead store


def _encode(word: tuple[int, ...]) -> bytes:
    return ",".join(str(int(v)) for v in word).encode()


class RankTimeout(RuntimeError):
    """Some ranks did not arrive within the timeout; ``missing`` lists them (group ranks)."""

    def __init__(self, message: str, missing: Sequence[int]) -> None:
        super().__init__(message)
        self.missing = tuple(missing)


def _delete_rounds(base: Any, namespace: str, timeout_s: float, lo: int, hi: int) -> None:
    """Background: delete round keys [lo, hi) through a separate client (errors only logged)."""
    try:
        store, _ = open_store(base, namespace, timeout_s)
        for r in range(lo, hi):
            store.delete_key(f"round/{r}")
            store.delete_key(f"round/{r}/final")
    except (RuntimeError, dist.DistError) as exc:
        logger.warning("could not delete old poll rounds %d..%d: %s", lo, hi - 1, exc)


def open_store(store: Any, namespace: str, timeout_s: float) -> tuple[Any, bool]:
    """(PrefixStore under ``namespace``, dedicated): blocking reads time out after ``timeout_s``.

    For a TCPStore (the default of ``init_process_group``) this opens a dedicated client
    connection with that timeout, so a read is one round trip and the process group's own store
    keeps its settings; other stores are wrapped as they are (reads then wait explicitly).
    """
    tcp = store
    while isinstance(tcp, dist.PrefixStore):
        tcp = tcp.underlying_store
    if isinstance(tcp, dist.TCPStore):
        client = dist.TCPStore(tcp.host, tcp.port, None, False, timeout=timedelta(seconds=timeout_s),
                               wait_for_workers=False)
        return dist.PrefixStore(namespace, client), True
    return dist.PrefixStore(namespace, store), False


class RankProtocol:
    """The store side of `RankCoordinator`: rank 0 of the group is the leader.

    Every blocking read is bounded by ``timeout_s`` and raises RankTimeout naming the ranks whose
    keys are missing; nothing here ever waits without a bound.
    """

    def __init__(self, store: Any, namespace: str, rank: int, world_size: int, timeout_s: float,
                 secret: bytes | None = None) -> None:
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = timeout_s
        self._base, self._namespace = store, namespace
        self.namespace = namespace  # the run's keys live under it (the forger tests write there)
        raw, self._dedicated = open_store(store, namespace, timeout_s)
        self._signed = SignedStore(raw, namespace, secret, raw_values=(_ABSENT,)) if secret is not None else None
        self._store: Any = self._signed if self._signed is not None else raw
        self._gc: threading.Thread | None = None
        self._gc_next = 0  # rounds before it are deleted (or being deleted)
        self.epoch = 0  # leader: the slot's epoch (releases so far); others: the latest word's
        self.stale = 0  # values of another moment refused (an old proposal, a replayed free slot)
        if rank == 0:
            self._store.set("proposal", wire.free_slot(0))

    @property
    def is_leader(self) -> bool:
        """True on group rank 0, which decides."""
        return self.rank == 0

    @property
    def authenticated(self) -> bool:
        """True when every value is signed and checked (a secret was given)."""
        return self._signed is not None

    @property
    def forged(self) -> int:
        """Values refused for a MAC that does not check."""
        return self._signed.forged if self._signed is not None else 0

    # ---- bounded reads -----------------------------------------------------------------------
    def _wait(self, keys: dict[int, str], what: str) -> None:
        """Wait for every key ({rank: key}); RankTimeout names the ranks whose key is missing."""
        try:
            self._store.wait(list(keys.values()), timedelta(seconds=self.timeout_s))
        except (RuntimeError, dist.DistError) as exc:
            missing = [r for r, k in keys.items() if not self._store.check([k])]
            if not missing:  # arrived just after the deadline
                return
            names = ", ".join(str(r) for r in missing)
            raise RankTimeout(f"rank {names} did not {what} within {self.timeout_s:g} s", missing) from exc

    def _get(self, key: str, owner: int, what: str) -> bytes:
        """The value of ``key`` written by rank ``owner``, waiting at most timeout_s (a forged
        value is refused and read again until the owner's own value is there)."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            if not self._dedicated:
                self._wait({owner: key}, what)
            try:
                return self._store.get(key)
            except ForgedValue:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)
            except (RuntimeError, dist.DistError) as exc:
                raise RankTimeout(f"rank {owner} did not {what} within {self.timeout_s:g} s", [owner]) from exc

    def peek(self, key: str) -> bytes | None:
        """The value of ``key`` now, or None when it is absent; never blocks.

        One atomic ``compare_set`` with an expected value no rank writes: c10d stores return the
        current value when the key exists and the expected value (without writing) when not."""
        raw = self._store.compare_set(key, _ABSENT, _ABSENT)
        return None if raw == _ABSENT else raw

    # ---- rounds (poll mode) ------------------------------------------------------------------
    def open_round(self, r: int, word: tuple[int, ...]) -> bool:
        """Leader: publish round r's word (ints; one round trip) unless a proposer marked the
        round first; returns True when marked (then `close_round` publishes the word)."""
        try:
            now = self._store.compare_set(f"round/{r}", b"", _encode(word))
        except ForgedValue:  # written ahead of us by no rank: our word replaces it
            self._store.set(f"round/{r}", _encode(word))
            now = _encode(word)
        if r > _ROUND_WINDOW and r % _GC_BATCH == 0:
            self._collect_rounds(r - _ROUND_WINDOW)
        return now == _MARK

    def close_round(self, r: int, word: tuple[int, ...]) -> None:
        """Leader: the word of a marked round."""
        self._store.set(f"round/{r}/final", _encode(word))

    def mark_round(self, first: int) -> int:
        """Proposer: mark the first round from ``first`` on that the leader has not published,
        so the leader looks at the proposal slot there; returns that round."""
        r = first
        while True:
            try:
                if self._store.compare_set(f"round/{r}", b"", _MARK) == _MARK:
                    return r
            except ForgedValue:  # a forgery holds that round: the leader replaces it; mark the next
                pass
            r += 1

    def read_round(self, r: int) -> tuple[int, ...]:
        """Non-leader: the leader's word for round r."""
        raw = self._get(f"round/{r}", 0, f"publish poll round {r}")
        if raw == _MARK:
            raw = self._get(f"round/{r}/final", 0, f"publish poll round {r}")
        try:
            return tuple(int(v) for v in raw.split(b","))
        except ValueError:
            raise ProtocolError(f"store key 'round/{r}': not a poll word (ints): {raw[:wire.QUOTE]!r}") from None

    def _collect_rounds(self, hi: int) -> None:
        """Delete the keys of the rounds before ``hi`` not deleted yet, off the serving thread
        (on their own connection)."""
        if not self._dedicated:
            return  # a FileStore or HashStore: few deployments; keys stay
        if self._gc is not None and self._gc.is_alive():
            return  # the previous batch is still running; the next batch covers these rounds too
        args = self._base, self._namespace, self.timeout_s, self._gc_next, hi
        self._gc_next = hi
        self._gc = threading.Thread(target=_delete_rounds, args=args, daemon=True, name="draftgraph-round-gc")
        self._gc.start()

    # ---- the proposal slot ---------------------------------------------------------------------
    def offer(self, proposal: tuple[int, RuntimeArgs, str]) -> tuple[int, RuntimeArgs, str] | None:
        """Put (rank, args, policy) into the free slot; returns None, or the proposal holding it.

        A slot held by something that is not a proposal of this moment (written by no rank of
        ours, or a proposal of an older epoch) is taken over, logged: it would otherwise refuse
        every proposal until the leader looked."""
        try:
            now = self.peek("proposal")
        except ForgedValue:  # the slot holds a forgery: ours replaces it
            logger.warning("rank %d: replacing a forged value in the proposal slot", self.rank)
            self._store.set("proposal", wire.encode_proposal(*proposal, self.epoch))
            return None
        epoch = wire.free_epoch(now) if now is not None else self.epoch
        if epoch is not None:
            return self._offer_over(now if now is not None else b"", wire.encode_proposal(*proposal, epoch))
        try:
            holder = wire.decode_proposal("proposal", now, self.world_size)
            held_epoch = wire.proposal_epoch("proposal", now)
        except ProtocolError as exc:
            logger.warning("rank %d: replacing what holds the proposal slot: %s", self.rank, exc)
            return self._offer_over(now, wire.encode_proposal(*proposal, self.epoch))
        if held_epoch < self.epoch:  # made before the leader's latest release: replayed, stale
            self.stale += 1
            logger.error("rank %d: the proposal slot holds a proposal of epoch %d (now %d): a replayed "
                         "message, refused and replaced", self.rank, held_epoch, self.epoch)
            return self._offer_over(now, wire.encode_proposal(*proposal, self.epoch))
        return holder

    def _offer_over(self, expected: bytes, payload: bytes) -> tuple[int, RuntimeArgs, str] | None:
        """compare_set ``payload`` over ``expected``; None when it is in, else the holder."""
        try:
            now = self._store.compare_set("proposal", expected, payload)
        except ForgedValue:  # a forgery came meanwhile: ours replaces it
            self._store.set("proposal", payload)
            return None
        if now == payload:
            return None
        if wire.free_epoch(now) is not None:  # freed meanwhile, in a new epoch: offer there
            return self.offer(wire.decode_proposal("proposal", payload, self.world_size))
        return wire.decode_proposal("proposal", now, self.world_size)

    def take(self, marked: bool = False) -> bytes | None:
        """Leader: the pending proposal's payload, or None (the slot stays held until `release`).
        ``marked``: a proposer marked this round, so a free slot means a proposal was dropped.
        A value of another epoch is refused (counted in ``stale``, logged) and the slot freed."""
        try:
            raw = self._store.get("proposal")
        except ForgedValue:  # refused, logged with its key; the slot is freed (in this epoch)
            self._store.set("proposal", wire.free_slot(self.epoch))
            return None
        free = wire.free_epoch(raw)
        try:
            held = free if free is not None else wire.proposal_epoch("proposal", raw)
        except ProtocolError:
            return raw  # check_proposal refuses it, naming the rule
        if held == self.epoch and not (free is not None and marked):
            return None if free is not None else raw
        self.stale += 1
        what = "a free value" if free is not None else "a proposal"
        logger.error("rank %d: the proposal slot holds %s of epoch %d (now %d%s): a replayed message, refused, "
                     "never obeyed", self.rank, what, held, self.epoch, ", in a marked round" if marked else "")
        self._store.set("proposal", wire.free_slot(self.epoch))
        return None

    def check_proposal(self, payload: bytes) -> tuple[int, RuntimeArgs, str]:
        """Leader: the proposal in ``payload`` (from `take`), or ProtocolError."""
        return wire.decode_proposal("proposal", payload, self.world_size)

    def release(self) -> None:
        """Leader: free the proposal slot after a decision, in the next epoch."""
        self.epoch += 1
        self._store.set("proposal", wire.free_slot(self.epoch))

    def post_reload(self, n: int, payload: bytes) -> None:
        """Leader: make the proposal reload number n."""
        self._store.set(f"reload/{n}", payload)

    def read_reload(self, n: int) -> tuple[int, RuntimeArgs, str]:
        """(proposer rank, args, policy) of reload n; ProtocolError when the entry is not one."""
        return wire.decode_proposal(f"reload/{n}", self._get(f"reload/{n}", 0, f"post reload {n}"),
                                    self.world_size)

    # ---- votes and the decision ----------------------------------------------------------------
    def vote(self, n: int, error: str | None) -> None:
        """This rank's vote on reload n: None = ready to swap, else why not."""
        self._store.set(f"vote/{n}/{self.rank}", wire.encode_vote(error))

    def collect_votes(self, n: int) -> tuple[dict[int, str | None], tuple[int, ...]]:
        """Leader: ({rank: error or None}, missing ranks) after waiting at most timeout_s; a
        malformed vote counts as that rank's failure."""
        keys = {r: f"vote/{n}/{r}" for r in range(self.world_size)}
        missing: tuple[int, ...] = ()
        try:
            self._wait(keys, f"vote on reload {n}")
        except RankTimeout as exc:
            missing = exc.missing
        votes: dict[int, str | None] = {}
        for r, key in keys.items():
            if r in missing:
                continue
            # a voter that timed out waiting for our decision decided itself and dropped its vote,
            # possibly between any check and a get (which would then block for the store's whole
            # timeout and fail): read without blocking, in one round trip, and skip it when gone
            try:
                raw = self.peek(key)
                if raw is None:
                    continue
                votes[r] = wire.decode_vote(key, raw)
            except ProtocolError as exc:
                votes[r] = f"malformed vote: {exc}"
        return votes, missing

    def decide(self, n: int, reason: str | None) -> str | None:
        """Set reload n's decision unless one is set: None = commit, else the abort reason.

        Returns the decision in force (first writer wins, so every rank follows the same one);
        a malformed decision in force is an abort on every rank that reads it."""
        try:
            now = self._store.compare_set(f"decision/{n}", b"", wire.encode_decision(reason))
        except ForgedValue as exc:  # a forged decision: abort, and say so in a value that checks
            reason = f"forged decision refused: {exc}"
            self._store.set(f"decision/{n}", wire.encode_decision(reason))
            return reason
        return self._decision(n, now)

    def _decision(self, n: int, raw: bytes) -> str | None:
        try:
            return wire.decode_decision(f"decision/{n}", raw)
        except ProtocolError as exc:
            return f"malformed decision: {exc}"

    def await_decision(self, n: int) -> str | None:
        """Non-leader: the leader's decision on reload n; past the timeout, abort it ourselves,
        naming the ranks whose votes are missing (else the leader)."""
        try:
            raw = self._get(f"decision/{n}", 0, f"decide reload {n}")
        except RankTimeout as exc:
            missing = [r for r in range(self.world_size) if not self._store.check([f"vote/{n}/{r}"])]
            if missing:
                return self.decide(n, f"rank {', '.join(map(str, missing))} did not vote on reload {n} "
                                      f"within {self.timeout_s:g} s")
            return self.decide(n, str(exc))
        return self._decision(n, raw)

    def finish(self, n: int) -> None:
        """This rank is done with reload n (it knows the decision): drop its vote and say so in
        its signed ``done/<n>/<rank>``; the rank that finds every rank's there (each checked)
        deletes ``reload/<n>``, ``decision/<n>`` and the done keys, so the store holds no key of
        a decided reload and no value another process writes can delete them while a rank
        still reads (a rank that gave up on a lost store leaves them: bounded by the reloads
        that failed that way)."""
        self._store.delete_key(f"vote/{n}/{self.rank}")
        self._store.set(f"done/{n}/{self.rank}", b"1")
        keys = [f"done/{n}/{r}" for r in range(self.world_size)]
        for key in keys:
            try:
                if self.peek(key) != b"1":
                    return
            except ForgedValue:  # refused and counted: that rank is not done
                return
        for key in (f"reload/{n}", f"decision/{n}", *keys):
            self._store.delete_key(key)

    # ---- start-up ----------------------------------------------------------------------------
    def exchange(self, tag: str, value: Any) -> list[Any]:
        """Every rank's ``value`` (index = rank); RankTimeout names the ranks that did not arrive."""
        self._store.set(f"{tag}/{self.rank}", wire.encode_fingerprint(value))
        keys = {r: f"{tag}/{r}" for r in range(self.world_size)}
        self._wait(keys, f"arrive at {tag}")
        return [wire.decode_fingerprint(k, self._get(k, r, f"arrive at {tag}")) for r, k in keys.items()]
