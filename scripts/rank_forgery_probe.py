"""Forged rank messages from another local process: do three ranks still serve the same state?

Three CPU ranks (`spawn_ranks`, gloo on loopback), each a tiny draft worker with a coordinator
(poll every 4 steps) and an adaptive controller (S 1..4, each rank seeing different
acceptance). Before the first poll a second process connects to the store and writes
schema-valid round words (adaptive choice 1) for 64 rounds ahead of the leader. The ranks
then serve 48 steps. Prints whether every rank served the same (generation, S) at every step,
at how many steps rank 1 differed from rank 0, the coordinators' faults and forged values
refused (issue 40, point 1; None where the code has no such count).

    python -m scripts.rank_forgery_probe
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import torch
import torch.distributed as dist

from draftgraph.runtime import AdaptiveStepController, EagleDraftWorker, RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.ranks.coordinator import RankCoordinator
from draftgraph.runtime.ranks.launch import spawn_ranks
from draftgraph.runtime.testing import TinyDraftModel, make_draft_input

_FORGER = """
import sys
from datetime import timedelta
import torch.distributed as dist
port, ns = int(sys.argv[1]), sys.argv[2]
store = dist.PrefixStore(ns, dist.TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=10)))
for r in range(64):
    store.set(f"round/{r}", b"1,0,0")
print("written")
"""


def rank_fn(rank: int, world: int) -> dict[str, Any]:
    """One rank: the forger runs from rank 0 before the first poll, then 48 steps are served."""
    base = dist.distributed_c10d._get_default_store()  # noqa: SLF001  # no public getter
    while isinstance(base, dist.PrefixStore):
        base = base.underlying_store
    client = dist.TCPStore(base.host, base.port, None, False, timeout=base.timeout)
    worker = EagleDraftWorker(RuntimeArgs(SpeculativeConfig(4, 1)), TinyDraftModel())
    coord = RankCoordinator(worker, poll_every=4, timeout_s=30.0, store=client, name="forged")
    ctl = AdaptiveStepController(worker, [1, 2, 3, 4], alpha=0.3, coordinator=coord, backend="trace")
    if rank == 0:
        subprocess.run([sys.executable, "-c", _FORGER, str(base.port), "draftgraph/forged/world/1/"],
                       check=True, capture_output=True, timeout=120)
    dist.barrier()
    gen = torch.Generator().manual_seed(rank)
    inp = make_draft_input(2, 1)
    states = []
    for t in range(48):
        generation = coord.step()
        level = 3.5 if (t // 16) % 2 == 0 else 0.5
        s = ctl.step(max(0.0, level + float(torch.randn(1, generator=gen))))
        worker.draft_forward(inp)
        dist.all_reduce(torch.zeros(1))
        states.append((generation, s))
    return {"states": states, "faults": coord.stats.faults, "forged": getattr(coord.stats, "forged", None)}


def main() -> None:
    """Run the three ranks and print the JSON summary."""
    ranks = spawn_ranks(3, rank_fn, timeout_s=200.0)
    first = ranks[0]["states"]
    print(json.dumps({"identical": all(r["states"] == first for r in ranks),
                      "steps_differing_rank0_vs_1": sum(a != b for a, b in zip(first, ranks[1]["states"])),
                      "faults": [r["faults"] for r in ranks], "forged": [r["forged"] for r in ranks]}))


if __name__ == "__main__":
    main()
