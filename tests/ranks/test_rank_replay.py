"""Rank messages bound to their moment (issue 49, point 4), in one process: a TCPStore server on
127.0.0.1 stands for the group's store, each rank is its own client, and a raw client replays
the ranks' own signed values, as another local process could (it can read the store)."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch.distributed as dist

from draftgraph.runtime import RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.ranks import auth, wire
from draftgraph.runtime.ranks.auth import new_secret
from draftgraph.runtime.ranks.protocol import RankProtocol

NS = "t/"
S2 = RuntimeArgs(SpeculativeConfig(2, 1))
S4 = RuntimeArgs(SpeculativeConfig(4, 1))


@pytest.fixture
def server():
    return dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=30), wait_for_workers=False)


def _raw(server) -> dist.PrefixStore:
    client = dist.TCPStore("127.0.0.1", server.port, None, False, timeout=timedelta(seconds=30))
    return dist.PrefixStore(NS, client)


def _ranks(server, world: int = 2, timeout_s: float = 0.5) -> list[RankProtocol]:
    secret = new_secret()
    return [RankProtocol(server, NS, r, world, timeout_s, secret=secret) for r in range(world)]


def _decide_and_release(leader: RankProtocol, payload: bytes, n: int) -> None:
    """What the leader does with a proposal: post it as reload n, decide, free the slot."""
    leader.post_reload(n, payload)
    leader.decide(n, None)
    leader.release()


def test_an_older_proposal_replayed_over_a_new_one_is_refused_and_counted(server):
    """The S=2 proposal of an earlier reload is copied back over the operator's S=4: the leader
    refuses it (counted), never applies it. Before: the leader took S=2 (a valid MAC)."""
    leader, follower = _ranks(server)
    raw = _raw(server)
    assert follower.offer((1, S2, "swap")) is None
    old = raw.get("proposal")  # what a reader of the store keeps
    payload = leader.take(marked=True)
    assert leader.check_proposal(payload)[1] == S2
    _decide_and_release(leader, payload, 1)
    assert follower.offer((1, S4, "swap")) is None
    raw.set("proposal", old)  # the replay
    assert leader.take(marked=True) is None
    assert leader.stale == 1
    assert follower.offer((1, S4, "swap")) is None  # the slot is usable again at once
    assert leader.check_proposal(leader.take(marked=True))[1] == S4


def test_a_replayed_free_slot_that_drops_a_proposal_is_counted(server):
    """A proposer marked the round; the free value replayed over its proposal drops it: the
    leader says so (counted, logged) instead of seeing "no proposal". Before: silent."""
    leader, follower = _ranks(server)
    raw = _raw(server)
    free = raw.get("proposal")
    assert follower.offer((1, S4, "swap")) is None
    raw.set("proposal", free)
    assert leader.take(marked=True) is None and leader.stale == 1


def test_a_free_value_of_an_older_epoch_is_refused(server):
    leader, follower = _ranks(server)
    raw = _raw(server)
    free0 = raw.get("proposal")
    assert follower.offer((1, S2, "swap")) is None
    _decide_and_release(leader, leader.take(marked=True), 1)
    raw.set("proposal", free0)  # epoch 0 back, now that the slot is in epoch 1
    assert leader.take() is None and leader.stale == 1
    assert wire.free_epoch(raw.get("proposal").rpartition(b"#")[0]) == 1  # the leader wrote its own


def test_an_old_proposal_parked_in_the_slot_is_replaced_by_the_next_proposer(server):
    """Parking: the old S=2 proposal replayed into the free slot with no round marked would
    refuse every later proposal ("in flight"), so no reload could land. A proposer that knows
    the slot's epoch (every poll word carries it) replaces it. Before: refused for ever."""
    leader, follower = _ranks(server)
    raw = _raw(server)
    assert follower.offer((1, S2, "swap")) is None
    old = raw.get("proposal")
    _decide_and_release(leader, leader.take(marked=True), 1)
    follower.epoch = leader.epoch  # as the next poll word tells it
    raw.set("proposal", old)
    assert follower.offer((1, S4, "swap")) is None and follower.stale == 1
    assert leader.check_proposal(leader.take(marked=True))[1] == S4


def test_bumped_done_counters_cannot_delete_a_decision_a_rank_still_reads(server):
    """Before: ``done/<n>`` was an unsigned counter; bumping it made the first rank to finish
    delete the decision, the other rank timed out, decided an abort itself and the ranks
    diverged (one committed, one kept the old state)."""
    leader, follower = _ranks(server)
    raw = _raw(server)
    payload = wire.encode_proposal(0, S4, "swap")
    leader.post_reload(1, payload)
    assert leader.decide(1, None) is None
    raw.add("done/1", 1)  # the counter of the old protocol
    raw.set("done/1/1", b"1")  # a forged "rank 1 is done"
    leader.finish(1)
    assert follower.await_decision(1) is None  # the leader's commit, still there
    follower.finish(1)
    assert leader.peek("decision/1") is None  # then deleted, once both were done


def test_instances_and_run_ids_come_from_no_store_counter():
    a, b = auth.next_instance("x/world"), auth.next_instance("x/world")
    assert b == a + 1 and auth.next_instance("y/world") == 1
    secret = new_secret()
    assert auth.run_id(secret) == auth.run_id(secret) != auth.run_id(new_secret())
    assert auth.run_id(None) == "open" and secret.hex()[:12] not in auth.run_id(secret)
