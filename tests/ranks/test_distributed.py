"""Several ranks: RankCoordinator over real CPU processes (gloo on 127.0.0.1), bounded in time.

One launch of three ranks runs every scenario in turn (spawning processes costs seconds on two
busy cores); each scenario builds its own coordinators, and each test checks one scenario's
per-rank records. A two-rank world is a subgroup (global ranks 1 and 2) of the same launch.
The single-rank references (a fresh worker with the new args) are computed in this process.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import signal
import tempfile
import traceback

import pytest
import torch
import torch.distributed as dist

from draftgraph.runtime import (
    AdaptiveStepController,
    CudaGraphConfig,
    EagleDraftWorker,
    PhaseGraphConfig,
    RuntimeArgs,
    SpeculativeConfig,
    install_reload_signal,
)
from draftgraph.runtime.ranks.coordinator import (
    ProposalRejected,
    RankCoordinator,
    RankDivergenceError,
    RankMismatchError,
)
from draftgraph.runtime.ranks.launch import RankLaunchError, spawn_ranks
from draftgraph.runtime.testing import TinyDraftModel, make_draft_input

pytestmark = pytest.mark.slow  # the slow tier (make test-all, CI): three rank processes

WORLD = 3
POLL = 4
TIMEOUT_S = 8.0  # coordinator timeout in the fault scenarios (a healthy rank prepares well within it, even on
# a loaded 2-core CI machine; the stalled rank is released by events, so this bounds only the waits)
STALL_BOUND_S = 120.0  # the unresponsive rank stalls until both others gave up, at most this long
STEPS = 16
PROPOSE_AT = 5  # first poll at or after it: step 8
CHECK_BS = 3


def args_for(s: int, bs: tuple[int, ...] = (1, 2, 4)) -> RuntimeArgs:
    return RuntimeArgs(SpeculativeConfig(s, 1), CudaGraphConfig(PhaseGraphConfig(bs=bs)))


class FaultyWorker(EagleDraftWorker):
    """EagleDraftWorker whose next captures fail (``fault = "fail"``) or stall (``fault``: a
    callable, called before the capture, that returns when the stall should end)."""

    fault = None

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        capture = self.capture  # the worker's capture collaborator: its blocking capture is wrapped
        real = capture.capture

        def faulty(state, backend):
            if self.fault == "fail":
                raise RuntimeError("injected capture failure")
            if callable(self.fault):
                self.fault()
            return real(state, backend)

        capture.capture = faulty


def captured_worker(args: RuntimeArgs) -> FaultyWorker:
    worker = FaultyWorker(args, TinyDraftModel())
    worker.capture_graphs("trace")
    return worker


def serve(coordinator: RankCoordinator, worker, steps: int, propose: dict[int, RuntimeArgs] | None = None,
          stamp_mode: bool = False, group=None) -> list[tuple[int, int]]:
    """(generation, S) served at every step; ``propose`` maps step -> args proposed on this rank.

    Each step ends with an all_reduce, as a tensor-parallel draft step would: ranks in lockstep."""
    served = []
    inp = make_draft_input(2, 1)
    for t in range(steps):
        if propose and t in propose:
            if propose[t] == "sighup":  # through install_reload_signal(..., coordinator=...)
                os.kill(os.getpid(), signal.SIGHUP)
            else:
                coordinator.propose_reload(propose[t])
        if stamp_mode:  # the engine's per-step broadcast carries the leader's stamp
            box = [coordinator.stamp() if coordinator.is_leader else None]
            dist.broadcast_object_list(box, src=0)
            generation = coordinator.apply(box[0])
        else:
            generation = coordinator.step()
        worker.draft_forward(inp)
        dist.all_reduce(torch.zeros(1), group=group)
        served.append((generation, worker.spec.num_steps))
    return served


def after_outputs(worker, rank: int) -> list[torch.Tensor]:
    """Outputs of the current state for a fixed input (cloned: graph outputs are views)."""
    out = worker.draft_forward(make_draft_input(CHECK_BS, 1, seed=10 + rank))
    return [t.clone() for t in out]


# ---- scenarios, run inside every rank -------------------------------------------------------
def scenario_reload(rank, world, group=None, members=None):
    members = members or list(range(world))
    if rank not in members:
        return None
    worker = captured_worker(args_for(3))
    coord = RankCoordinator(worker, group=group, poll_every=POLL, timeout_s=30.0, name="reload")
    propose, uninstall = None, None
    if rank == members[-1] and group is None:  # world 3: the proposal comes from SIGHUP
        path = os.path.join(tempfile.mkdtemp(), "args.json")
        with open(path, "w") as f:
            json.dump({"speculative": {"num_steps": 2, "topk": 1},
                       "cuda_graph_config": {"decode": {"bs": [1, 2, 4]}}}, f)
        uninstall = install_reload_signal(worker, path, coordinator=coord)
        propose = {PROPOSE_AT: "sighup"}
    elif rank == members[-1]:
        propose = {PROPOSE_AT: args_for(2)}
    served = serve(coord, worker, STEPS, propose, group=group)
    if uninstall is not None:
        uninstall()
    return {"served": served, "outputs": after_outputs(worker, rank), "history": list(coord.history),
            "graphs": worker.state.has_graphs}


def scenario_capture_failure(rank, world):
    worker = captured_worker(args_for(3))
    coord = RankCoordinator(worker, poll_every=POLL, timeout_s=30.0, name="fail")
    if rank == 1:
        worker.fault = "fail"
    propose = {1: args_for(2)} if rank == 2 else None
    served = serve(coord, worker, STEPS, propose)
    return {"served": served, "history": list(coord.history), "graphs": worker.state.has_graphs}


def scenario_mismatch(rank, world):
    worker = FaultyWorker(args_for(3, bs=(1, 2) if rank == 2 else (1, 2, 4)), TinyDraftModel())
    try:
        RankCoordinator(worker, poll_every=POLL, timeout_s=30.0, name="mismatch")
    except RankMismatchError as exc:
        return str(exc)
    return None


def scenario_adaptive(rank, world):
    worker = EagleDraftWorker(RuntimeArgs(SpeculativeConfig(4, 1)), TinyDraftModel())
    coord = RankCoordinator(worker, poll_every=8, timeout_s=30.0, name="adaptive")
    ctl = AdaptiveStepController(worker, [1, 2, 3, 4], alpha=0.3, coordinator=coord, backend="trace")
    gen = torch.Generator().manual_seed(rank)  # every rank sees different acceptance
    inp = make_draft_input(2, 1)
    states, observed = [], []
    for t in range(200):
        coord.step()
        level = 3.5 if (t // 50) % 2 == 0 else 0.5
        accepted = max(0.0, level + float(torch.randn(1, generator=gen)))
        observed.append(accepted)
        s = ctl.step(accepted)
        worker.draft_forward(inp)
        states.append((s, worker.spec.num_steps))
    return {"states": states, "observed": observed}


def scenario_concurrent(rank, world):
    worker = captured_worker(args_for(3))
    coord = RankCoordinator(worker, poll_every=POLL, timeout_s=30.0, name="concurrent")
    propose = {1: args_for(2) if rank == 1 else args_for(4)} if rank in (1, 2) else None
    served = serve(coord, worker, 12, propose)
    try:
        coord.propose_reload(args_for(2))
        coord.propose_reload(args_for(2))
        second = None
    except ProposalRejected as exc:
        second = str(exc)
    return {"served": served, "history": list(coord.history), "second": second}


def scenario_stamp(rank, world):
    worker = captured_worker(args_for(3))
    coord = RankCoordinator(worker, poll_every=POLL, timeout_s=30.0, name="stamp")
    propose = {PROPOSE_AT: args_for(2)} if rank == 1 else None
    served = serve(coord, worker, STEPS, propose, stamp_mode=True)
    return {"served": served, "outputs": after_outputs(worker, rank), "history": list(coord.history)}


def scenario_diverged(rank, world):
    worker = EagleDraftWorker(RuntimeArgs(SpeculativeConfig(3, 1)), TinyDraftModel())
    coord = RankCoordinator(worker, poll_every=POLL, timeout_s=30.0, name="diverged")
    stopped = None
    for t in range(2 * POLL + 1):
        if t == 2 and rank == 1:
            worker.reload(RuntimeArgs(SpeculativeConfig(2, 1)))  # behind the coordinator's back
        if stopped is None:
            try:
                coord.step()
            except RankDivergenceError as exc:  # a real server stops here; the test keeps lockstep
                stopped = (t, str(exc))
        dist.all_reduce(torch.zeros(1))
    return {"faults": coord.stats.faults, "last_error": coord.last_error, "stopped": stopped}


_FORGER = """
import sys
from datetime import timedelta
import torch.distributed as dist
from draftgraph.runtime import RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.ranks import wire
port, ns = int(sys.argv[1]), sys.argv[2]
store = dist.PrefixStore(ns, dist.TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=10)))
for r in range(64):  # the leader's words, written ahead of it: another adaptive choice
    store.set(f"round/{r}", b"1,0,0")
store.set("proposal", wire.encode_proposal(0, RuntimeArgs(SpeculativeConfig(2, 1)), "swap"))
print("written")
"""


def scenario_forged(rank, world):
    """A second local process writes schema-valid round words and a reload proposal into the
    store before the ranks poll (issue 40: the ranks diverged silently). Each value is refused
    for its MAC; the ranks serve identically."""
    import subprocess
    import sys

    base = dist.distributed_c10d._get_default_store()
    while isinstance(base, dist.PrefixStore):
        base = base.underlying_store
    client = dist.TCPStore(base.host, base.port, None, False, timeout=base.timeout)  # keys as the forger sees them
    worker = EagleDraftWorker(RuntimeArgs(SpeculativeConfig(4, 1)), TinyDraftModel())
    coord = RankCoordinator(worker, poll_every=4, timeout_s=30.0, store=client, name="forged")
    ctl = AdaptiveStepController(worker, [1, 2, 3, 4], alpha=0.3, coordinator=coord, backend="trace")
    forger = None
    if rank == 0:
        forger = subprocess.run([sys.executable, "-c", _FORGER, str(base.port), coord.store_namespace],
                                capture_output=True, text=True, timeout=120)
    ok = torch.tensor([forger is None or (forger.returncode == 0 and "written" in forger.stdout)], dtype=torch.int32)
    dist.broadcast(ok, 0)  # every rank waits for the forger, and all stop together if it failed
    if not ok.item():
        return {"forger_failed": forger.stderr[-2000:] if forger is not None else "on rank 0"}
    gen = torch.Generator().manual_seed(rank)
    inp = make_draft_input(2, 1)
    states = []
    for t in range(48):
        generation = coord.step()
        level = 3.5 if (t // 16) % 2 == 0 else 0.5
        s = ctl.step(max(0.0, level + float(torch.randn(1, generator=gen))))
        worker.draft_forward(inp)
        dist.all_reduce(torch.zeros(1))
        states.append((generation, s, worker.spec.num_steps))
    return {"states": states, "forged": coord.stats.forged, "faults": coord.stats.faults,
            "reloads": coord.stats.reloads}


def scenario_secret(rank, world):
    """The run's secret reached this rank, and not through its command line or environment."""
    import hashlib

    from draftgraph.runtime.ranks.auth import process_secret

    secret = process_secret()
    leaks = []
    for name in ("cmdline", "environ"):
        with open(f"/proc/self/{name}", "rb") as f:
            text = f.read()
        leaks += [name for form in (secret, secret.hex().encode()) if secret and form in text]
    return {"digest": hashlib.sha256(secret).hexdigest() if secret else None, "leaks": leaks}


def scenario_unresponsive(rank, world):
    """Rank 2's capture of the proposed state stalls until ranks 0 and 1 have given up on its
    vote (they mark it in the store when their step returns): ordered by events, not timed. Had
    they waited for rank 2 instead of their timeout, rank 2 would stall to STALL_BOUND_S and
    record ``released_by_peers`` False."""
    store = dist.distributed_c10d._get_default_store()
    gave_up = [f"test/stall/gave_up/{r}" for r in (0, 1)]
    worker = captured_worker(args_for(3))
    coord = RankCoordinator(worker, poll_every=POLL, timeout_s=TIMEOUT_S, name="stall")
    released = {"by_peers": None}
    if rank == 2:
        def stall() -> None:
            try:
                store.wait(gave_up, datetime.timedelta(seconds=STALL_BOUND_S))
                released["by_peers"] = True
            except Exception:  # noqa: BLE001 (the store's timeout: recorded, checked by the test)
                released["by_peers"] = False
        worker.fault = stall
    propose = {1: args_for(2)} if rank == 1 else None
    served = []
    inp = make_draft_input(2, 1)
    for t in range(STEPS):
        if propose and t in propose:
            coord.propose_reload(propose[t])
        generation = coord.step()
        if rank != 2 and coord.history and not store.check([gave_up[rank]]):
            store.set(gave_up[rank], "1")  # this rank's step returned with the round decided
        worker.draft_forward(inp)
        dist.all_reduce(torch.zeros(1))  # lockstep, as a draft step's collectives keep ranks
        served.append((generation, worker.spec.num_steps))
    return {"served": served, "history": list(coord.history), "released_by_peers": released["by_peers"],
            "graphs": worker.state.has_graphs}


KEY_ROUNDS = 3  # reloads in the bounded-store scenario


def scenario_store_keys(rank, world):
    """KEY_ROUNDS reloads through a coordinator on its own store client: afterwards no
    ``reload/<n>`` or ``decision/<n>`` key is left (every rank read them, the last deleted them)."""
    base = dist.distributed_c10d._get_default_store()
    while isinstance(base, dist.PrefixStore):
        base = base.underlying_store
    client = dist.TCPStore(base.host, base.port, None, False, timeout=base.timeout)
    worker = captured_worker(args_for(3))
    coord = RankCoordinator(worker, poll_every=1, timeout_s=30.0, store=client, name="keys")
    propose = {2 * i: args_for(2 if i % 2 == 0 else 3) for i in range(KEY_ROUNDS)} if rank == 0 else None
    served = serve(coord, worker, 2 * KEY_ROUNDS + 1, propose)
    dist.barrier()  # every rank has finished every reload
    ns = dist.PrefixStore(coord.store_namespace, client)
    keys = [(f"reload/{n}", f"decision/{n}", *(f"done/{n}/{r}" for r in range(world)))
            for n in range(1, KEY_ROUNDS + 1)]
    left = [k for group in keys for k in group if ns.check([k])]
    return {"reloads": coord.stats.reloads, "left": left, "generation": served[-1][0]}


def run_all(rank, world):
    """Every scenario in order; an exception is recorded (the others still run)."""
    logging.basicConfig(level=logging.WARNING)
    subgroup = dist.new_group([1, 2])  # collective: every rank creates it
    scenarios = {
        "reload3": lambda: scenario_reload(rank, world),
        "reload2": lambda: scenario_reload(rank, world, group=subgroup, members=[1, 2]),
        "capture_failure": lambda: scenario_capture_failure(rank, world),
        "mismatch": lambda: scenario_mismatch(rank, world),
        "adaptive": lambda: scenario_adaptive(rank, world),
        "concurrent": lambda: scenario_concurrent(rank, world),
        "stamp": lambda: scenario_stamp(rank, world),
        "diverged": lambda: scenario_diverged(rank, world),
        "forged": lambda: scenario_forged(rank, world),
        "secret": lambda: scenario_secret(rank, world),
        "store_keys": lambda: scenario_store_keys(rank, world),
        "unresponsive": lambda: scenario_unresponsive(rank, world),  # last: it leaves rank 2 behind
    }
    out = {}
    for name, fn in scenarios.items():
        try:
            out[name] = ("ok", fn())
        except Exception:
            out[name] = ("error", traceback.format_exc())
    return out


# ---- tests (in the launching process) ---------------------------------------------------------
@pytest.fixture(scope="module")
def ranks():
    return spawn_ranks(WORLD, run_all, timeout_s=150.0)


def result(ranks, name: str) -> list:
    per_rank = []
    for rank, out in enumerate(ranks):
        status, value = out[name]
        assert status == "ok", f"scenario {name} raised on rank {rank}:\n{value}"
        per_rank.append(value)
    return per_rank


def check_reload_everywhere(records: list[dict], proposer: int) -> None:
    """Every rank switched at the first poll at or after the proposal, and equals a fresh worker."""
    first_poll = -(-PROPOSE_AT // POLL) * POLL
    expected = [(0, 3)] * first_poll + [(1, 2)] * (STEPS - first_poll)
    fresh = EagleDraftWorker(args_for(2), TinyDraftModel())
    fresh.capture_graphs("trace")
    for i, rec in enumerate(records):
        assert rec["served"] == expected, f"member {i}: {rec['served']}"
        assert [h["proposer"] for h in rec["history"]] == [proposer]
        ref = fresh.draft_forward(make_draft_input(CHECK_BS, 1, seed=10 + rec["rank"]))
        for j, (got, want) in enumerate(zip(rec["outputs"], ref)):
            assert torch.equal(got, want), f"member {i} output {j} differs from a fresh single-rank worker"


def test_reload_proposed_on_nonzero_rank_world3(ranks):
    records = result(ranks, "reload3")
    for rank, rec in enumerate(records):
        rec["rank"] = rank
        assert rec["graphs"]
    check_reload_everywhere(records, proposer=2)


def test_reload_world2_subgroup(ranks):
    records = result(ranks, "reload2")
    assert records[0] is None  # rank 0 is not in the subgroup
    for rank in (1, 2):
        records[rank]["rank"] = rank
    check_reload_everywhere(records[1:], proposer=1)  # global rank 2 is group rank 1


def test_capture_failure_on_one_rank_keeps_old_state_everywhere(ranks):
    records = result(ranks, "capture_failure")
    for rec in records:
        assert rec["served"] == [(0, 3)] * STEPS  # serving went on, old state everywhere
        assert rec["graphs"]  # swap policy: the old graphs still serve
        (h,) = rec["history"]
        assert not h["ok"] and "rank 1 failed" in h["error"] and "injected capture failure" in h["error"]
        assert "rank 0 failed" not in h["error"] and "rank 2 failed" not in h["error"]


def test_startup_mismatch_of_capture_sizes_rejected_on_every_rank(ranks):
    messages = result(ranks, "mismatch")
    for msg in messages:
        assert msg is not None, "a rank accepted mismatched capture sizes"
        assert "capture_sizes: rank 0, 1 = (1, 2, 4); rank 2 = (1, 2)" in msg
    assert len(set(messages)) == 1


def test_adaptive_switching_identical_on_all_ranks(ranks):
    records = result(ranks, "adaptive")
    assert records[0]["observed"] != records[1]["observed"]  # the ranks saw different acceptance
    states = [rec["states"] for rec in records]
    assert states[1] == states[0] and states[2] == states[0]
    assert len({s for s, _ in states[0]}) >= 2  # it did switch
    assert all(s == served for s, served in states[0])
    changes = [t for t in range(1, 200) if states[0][t][0] != states[0][t - 1][0]]
    assert all(t % 8 == 0 for t in changes), changes  # switches only at polls


def test_concurrent_proposals_one_wins_other_rejected(ranks):
    records = result(ranks, "concurrent")
    served = [rec["served"] for rec in records]
    assert served[1] == served[0] and served[2] == served[0]
    committed = [h for h in records[0]["history"] if h.get("event") == "reload" and h["ok"]]
    assert len(committed) == 1
    winner = committed[0]["proposer"]
    loser = 3 - winner
    (rejected,) = [h for h in records[loser]["history"] if h["event"] == "rejected"]
    assert f"rank {winner}'s proposal" in rejected["error"]
    assert "already waiting" in records[0]["second"]


def test_zero_collective_mode_reloads_at_same_step(ranks):
    records = result(ranks, "stamp")
    for rank, rec in enumerate(records):
        rec["rank"] = rank
    check_reload_everywhere(records, proposer=1)


def test_a_reload_outside_the_coordinator_stops_that_rank_loudly_at_the_next_poll(ranks):
    """Issue 40: the fingerprint of (generation, state) in every poll word; a rank that serves
    something else stops with RankDivergenceError instead of serving on."""
    records = result(ranks, "diverged")
    assert records[0]["faults"] == 0 and records[2]["faults"] == 0
    assert records[0]["stopped"] is None and records[2]["stopped"] is None
    t, message = records[1]["stopped"]
    assert t == POLL  # the first poll after the reload at step 2
    assert "rank 1 diverged from the leader at step 4: it serves generation 1" in message
    assert "the leader generation 0" in message


def test_forged_store_values_from_another_process_are_refused_and_the_ranks_stay_identical(ranks):
    """Issue 40: schema-valid words written ahead of the leader made the ranks diverge silently."""
    records = result(ranks, "forged")
    assert records[0]["states"] == records[1]["states"] == records[2]["states"]
    assert {g for g, _, _ in records[0]["states"]} == {0}  # the forged proposal never ran
    assert len({s for _, s, _ in records[0]["states"]}) > 1  # the leader's own choices were served
    assert records[0]["forged"] >= 1  # the leader refused the words it found ahead of it
    assert all(r["reloads"] == 0 and r["faults"] == 0 for r in records)


def test_the_run_secret_reaches_every_rank_privately(ranks):
    records = result(ranks, "secret")
    assert records[0]["digest"] is not None
    assert records[0]["digest"] == records[1]["digest"] == records[2]["digest"]
    assert all(r["leaks"] == [] for r in records)


def test_unresponsive_rank_aborts_within_timeout_and_serving_continues(ranks):
    records = result(ranks, "unresponsive")
    for rec in records:
        assert rec["served"] == [(0, 3)] * STEPS
        assert rec["graphs"]
        (h,) = rec["history"]
        assert not h["ok"] and "rank 2 did not vote" in h["error"], h
    # ranks 0 and 1 gave up at their timeout while rank 2 still stalled: it was released by them
    assert records[2]["released_by_peers"] is True


# ---- launcher and argument checks (no processes needed for most) -----------------------------
def _raise_on_rank_one(rank, world):
    if rank == 1:
        raise RuntimeError("boom on rank one")
    return rank


def test_decided_reloads_leave_no_keys_in_the_store(ranks):
    for rec in result(ranks, "store_keys"):
        assert rec["reloads"] == KEY_ROUNDS and rec["generation"] == KEY_ROUNDS
        assert rec["left"] == []  # on main: reload/1..3 and decision/1..3 stayed forever


def test_spawn_ranks_names_the_failing_rank():
    with pytest.raises(RankLaunchError) as info:
        spawn_ranks(2, _raise_on_rank_one, timeout_s=60.0)
    assert set(info.value.failures) == {1} and "boom on rank one" in info.value.failures[1]
    assert info.value.results == {0: 0}


def test_coordinator_rejects_bad_arguments():
    worker = EagleDraftWorker(args_for(3), TinyDraftModel())
    with pytest.raises(ValueError, match="poll_every"):
        RankCoordinator(worker, poll_every=0)
    with pytest.raises(ValueError, match="timeout_s"):
        RankCoordinator(worker, timeout_s=-1)
    with pytest.raises(RuntimeError, match="not initialized"):
        RankCoordinator(worker)
