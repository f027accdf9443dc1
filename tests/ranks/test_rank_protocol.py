"""The store protocol of the rank coordinator, in one process: each rank is its own store client.

A TCPStore server on 127.0.0.1 (port chosen by the OS) stands for the process group's store.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch.distributed as dist

from draftgraph.runtime import RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.ranks import protocol as rp
from draftgraph.runtime.ranks.protocol import RankProtocol, RankTimeout


@pytest.fixture
def server():
    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=10), wait_for_workers=False)
    yield store


def ranks(server, world: int, timeout_s: float = 0.5, ns: str = "t/") -> list[RankProtocol]:
    return [RankProtocol(server, ns, r, world, timeout_s) for r in range(world)]


def test_round_word_reaches_every_rank(server):
    leader, a, b = ranks(server, 3)
    assert leader.open_round(0, (4, 0, 1)) is False
    assert a.read_round(0) == (4, 0, 1) and b.read_round(0) == (4, 0, 1)


def test_marked_round_makes_the_leader_look_and_readers_wait_for_the_final_word(server):
    leader, a = ranks(server, 2)
    leader.open_round(0, (3, 0))
    assert a.mark_round(0) == 1  # round 0 is published: the mark goes to the next one
    assert leader.open_round(1, (3, 0)) is True
    leader.close_round(1, (3, 7))
    assert a.read_round(1) == (3, 7)


def test_missing_leader_round_times_out_naming_rank_0(server):
    _, a = ranks(server, 2, timeout_s=0.3)
    with pytest.raises(RankTimeout, match="rank 0 did not publish poll round 5") as info:
        a.read_round(5)
    assert info.value.missing == (0,)


def test_one_proposal_at_a_time(server):
    leader, a, b = ranks(server, 3)
    args = RuntimeArgs(SpeculativeConfig(2, 1))
    assert a.offer((1, args, "swap")) is None
    holder = b.offer((2, args, "release_first"))
    assert holder is not None and holder[0] == 1  # b learns who holds the slot
    assert leader.take() is not None
    leader.release()
    assert leader.take() is None and b.offer((2, args, "swap")) is None


def test_votes_name_failing_and_missing_ranks_and_first_decision_wins(server):
    leader, a, b = ranks(server, 3, timeout_s=0.3)
    leader.vote(1, None)
    a.vote(1, "ReloadError: capture failed")
    votes, missing = leader.collect_votes(1)
    assert votes == {0: None, 1: "ReloadError: capture failed"} and missing == (2,)
    assert b.decide(1, "rank 0 did not decide") == "rank 0 did not decide"
    assert leader.decide(1, None) == "rank 0 did not decide"  # the first writer wins everywhere
    assert a.await_decision(1) == "rank 0 did not decide"


def test_late_decision_names_the_rank_whose_vote_is_missing(server):
    leader, a, b = ranks(server, 3, timeout_s=0.3)
    leader.vote(2, None)
    a.vote(2, None)
    assert "rank 2 did not vote on reload 2" in a.await_decision(2)


def test_start_up_exchange_names_the_rank_that_did_not_arrive(server):
    _, b, _ = ranks(server, 3, timeout_s=0.3)
    with pytest.raises(RankTimeout, match="rank 0, 2 did not arrive at hello") as info:
        b.exchange("hello", {"spec": "s"})
    assert info.value.missing == (0, 2)


def test_old_rounds_are_deleted_in_the_background(server, monkeypatch):
    monkeypatch.setattr(rp, "_ROUND_WINDOW", 4)
    monkeypatch.setattr(rp, "_GC_BATCH", 2)
    leader, a = ranks(server, 2)
    for r in range(9):
        leader.open_round(r, (1, 0))
    leader._gc.join(timeout=5.0)
    check = a._store.check
    assert not check(["round/0"]) and not check(["round/1"]) and check(["round/8"])


class _DropsVoteAfterSeen(dist.Store):
    """A HashStore where one vote key vanishes right after the leader's first read of it that
    follows its wait: the voter timed out on the decision, decided itself and dropped its vote
    in that window (the race CI met: the leader's blocking get then failed the whole reload)."""

    armed = False

    def __init__(self, key: str) -> None:
        super().__init__()
        self.inner, self.key = dist.HashStore(), key
        self.inner.set_timeout(timedelta(seconds=2))

    def set(self, k, v):
        self.inner.set(k, v)

    def get(self, k):
        return self._then_drop(k, self.inner.get, k)

    def add(self, k, n):
        return self.inner.add(k, n)

    def compare_set(self, k, e, d):
        return self._then_drop(k, self.inner.compare_set, k, e, d)

    def delete_key(self, k):
        return self.inner.delete_key(k)

    def num_keys(self):
        return self.inner.num_keys()

    def set_timeout(self, t):
        self.inner.set_timeout(t)

    def check(self, keys):
        return self._then_drop(keys[0] if len(keys) == 1 else None, self.inner.check, keys)

    def wait(self, keys, timeout=None):
        self.inner.wait(keys, timeout) if timeout is not None else self.inner.wait(keys)
        self.armed = self.armed or self.key in keys

    def _then_drop(self, k, op, *args):
        out = op(*args)
        if self.armed and k == self.key:
            self.armed = False
            self.inner.delete_key(k)
        return out


def test_a_vote_dropped_while_the_leader_reads_it_neither_blocks_nor_fails_the_reload():
    store = _DropsVoteAfterSeen("t//vote/1/1")  # PrefixStore joins namespace and key with "/"
    leader, one = (RankProtocol(store, "t/", r, 2, 0.5) for r in range(2))
    leader.vote(1, None)
    one.vote(1, None)
    assert leader.collect_votes(1) == ({0: None, 1: None}, ())  # read in one atomic step


def test_peek_reads_without_blocking_and_never_creates_the_key(server):
    (p,) = ranks(server, 1, timeout_s=5.0)
    assert p.peek("nothing") is None
    assert not server.check(["t//nothing"])
    p.vote(3, "oops")
    assert p.peek("vote/3/0") is not None and rp.wire.decode_vote("k", p.peek("vote/3/0")) == "oops"
