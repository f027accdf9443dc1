"""Rank messages that prove their sender (issue 40, point 1), in one process: a TCPStore server on
127.0.0.1 stands for the group's store, each rank is its own client, and a raw client writes
what another local process could."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch.distributed as dist

from draftgraph.runtime import RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.ranks import auth, wire
from draftgraph.runtime.ranks.auth import ForgedValue, SignedStore, new_secret
from draftgraph.runtime.ranks.protocol import RankProtocol

NS = "t/"


@pytest.fixture
def server():
    return dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=10), wait_for_workers=False)


def _raw(server) -> dist.PrefixStore:
    """What any local process may do: connect and write keys of the namespace."""
    client = dist.TCPStore("127.0.0.1", server.port, None, False, timeout=timedelta(seconds=5))
    return dist.PrefixStore(NS, client)


def _ranks(server, world: int, secret: bytes, timeout_s: float = 0.5) -> list[RankProtocol]:
    return [RankProtocol(server, NS, r, world, timeout_s, secret=secret) for r in range(world)]


def test_a_value_without_this_runs_mac_is_refused_counted_and_named(server, caplog):
    secret = new_secret()
    store = SignedStore(dist.PrefixStore(NS, server), NS, secret)
    store.set("k", b"payload")
    assert store.get("k") == b"payload"
    raw = _raw(server)
    other = SignedStore(raw, NS, new_secret())
    for forged in (b"payload", b"payload#" + b"0" * 64, other.sign("k", b"payload"),
                   store.sign("j", b"payload")):  # none, a junk tag, another run's, another key's
        raw.set("k", forged)
        with pytest.raises(ForgedValue, match="store key 'k'"):
            store.get("k")
    assert store.forged == 4 and store.last_forged == "k"
    assert "store key 'k'" in caplog.text and "refused" in caplog.text
    assert isinstance(ForgedValue("x"), wire.ProtocolError)


def test_a_forged_round_word_ahead_of_the_leader_is_replaced_and_never_obeyed(server):
    leader, follower = _ranks(server, 2, new_secret())
    _raw(server).set("round/3", b"5,0,0")  # an adaptive choice written ahead of the leader
    assert leader.open_round(3, (2, 0, 0, 77)) is False
    assert follower.read_round(3) == (2, 0, 0, 77)  # the leader's word, not the forgery
    assert leader.forged == 1


def test_a_forged_word_the_leader_never_replaces_times_out_refused(server):
    _, follower = _ranks(server, 2, new_secret(), timeout_s=0.3)
    _raw(server).set("round/4", b"5,0,0")
    with pytest.raises(ForgedValue, match="round/4"):
        follower.read_round(4)
    assert follower.forged >= 1


def test_a_forged_proposal_is_never_applied_and_a_rank_takes_the_slot_back(server):
    leader, follower = _ranks(server, 2, new_secret())
    raw = _raw(server)
    args = RuntimeArgs(SpeculativeConfig(2, 1))
    raw.set("proposal", wire.encode_proposal(1, args, "swap"))  # schema-valid, unsigned
    assert leader.take() is None and leader.forged == 1  # refused, the slot freed
    raw.set("proposal", wire.encode_proposal(1, args, "swap"))
    assert follower.offer((1, args, "swap")) is None  # a rank's proposal replaces the forgery
    assert leader.check_proposal(leader.take()) == (1, args, "swap")


def test_forged_votes_and_decisions_abort_the_reload_on_every_rank(server):
    leader, follower = _ranks(server, 2, new_secret())
    raw = _raw(server)
    raw.set("vote/1/1", wire.encode_vote(None))  # "ready", unsigned
    leader.vote(1, None)
    votes, missing = leader.collect_votes(1)
    assert missing == () and votes[0] is None and "not signed" in votes[1]
    raw.set("decision/2", wire.encode_decision(None))  # "commit", unsigned
    reason = leader.decide(2, None)
    assert reason is not None and "forged decision refused" in reason
    assert follower.await_decision(2) == reason  # the follower reads the leader's abort


def test_without_a_secret_the_ranks_warn_once():
    import subprocess
    import sys

    code = ("import logging; logging.basicConfig()\n"
            "from draftgraph.runtime.ranks import auth\n"
            "auth.warn_unauthenticated(); auth.warn_unauthenticated()\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stderr.count("unauthenticated") == 1


def test_process_secret_rules():
    with pytest.raises(ValueError, match="at least 16"):
        auth.set_process_secret(b"short")
    auth.set_process_secret(None)
    assert auth.process_secret() is None
