"""Speculation schedule benchmark: a batch-size schedule against every fixed S and greedy.

At each request count (all arriving at once, so the batch size is the request count until
requests finish), the same prompts through target-only greedy decoding, an engine at each fixed
chain S (eager backend), and an engine under a schedule, interleaved over rounds. Targets (issue
"speculation schedules"): the schedule reaches at least 0.97x the best fixed S at 1 and 16
requests, and at least 1.0x greedy at 32 (where speculation turns off). Also: steps per band and
band switches per 100 steps.
"""

from __future__ import annotations

import argparse
import statistics
import time

from draftgraph.runtime import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.engine import SpecDecodeEngine
from draftgraph.runtime.models import default_models, greedy_generate
from draftgraph.runtime.models.corpus import held_out_prompts
from draftgraph.runtime.schedule import SpeculationSchedule
from scripts.benchutil import emit, record
from scripts.benchutil import target as stated_target

DEFAULT_SCHEDULE = "1:5,4:3,12:2,24:0"


def _args(s: int, schedule: str | None, slots: int) -> RuntimeArgs:
    return RuntimeArgs(SpeculativeConfig(s, 1), CudaGraphConfig(PhaseGraphConfig(max_bs=slots)),
                       max_running_requests=slots,
                       schedule=SpeculationSchedule.parse(schedule) if schedule else None)


def bench(counts: tuple[int, ...], fixed: tuple[int, ...], schedule: str, rounds: int, max_new: int) -> list[dict]:
    target, head = default_models()
    rows = []
    for conc in counts:
        prompts = [list(p) for p in held_out_prompts(conc, seed=70 + conc)]
        slots = max(conc, 1)
        engines = {f"S={s}": SpecDecodeEngine(_args(s, None, slots), target, head, backend="eager",
                                              acceptance_watch=None) for s in fixed}
        engines["schedule"] = SpecDecodeEngine(_args(3, schedule, slots), target, head, backend="eager",
                                               acceptance_watch=None)
        warm = [p[:16] for p in prompts]
        greedy_generate(target, warm, 4)
        for eng in engines.values():
            eng.generate(warm, 4)
            eng.reset_stats()
        times: dict[str, list[float]] = {"greedy": []}
        ref = None
        for _ in range(rounds):
            t0 = time.perf_counter()
            ref = greedy_generate(target, prompts, max_new)
            times["greedy"].append(time.perf_counter() - t0)
            for key, eng in engines.items():
                t0 = time.perf_counter()
                out = eng.generate(prompts, max_new)
                times.setdefault(key, []).append(time.perf_counter() - t0)
                if out != ref:
                    raise AssertionError(f"{key} at {conc} requests differs from greedy")
        tokens = conc * max_new
        tps = {k: [tokens / x for x in v] for k, v in times.items()}
        med = {k: statistics.median(v) for k, v in tps.items()}
        best_fixed = max((k for k in med if k.startswith("S=")), key=lambda k: med[k])
        sch = engines["schedule"].stats()["schedule"]
        steps = sum(b["served"] for b in sch["bands"])
        for key in med:
            rows.append({"requests": conc, "config": key, "tokens_per_s": med[key],
                         "vs_greedy": med[key] / med["greedy"], "vs_best_fixed": med[key] / med[best_fixed],
                         "_values": tps[key], "best_fixed": best_fixed,
                         "bands": {b["band"]: b["served"] for b in sch["bands"]} if key == "schedule" else None,
                         "switches_per_100_steps": sch["switches_per_100_steps"] if key == "schedule" else None,
                         "steps": steps if key == "schedule" else None})
    return rows


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--json", default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--schedule", default=DEFAULT_SCHEDULE)
    a = p.parse_args(argv)
    counts = (1, 32) if a.quick else (1, 4, 16, 32)
    fixed = (1, 3, 5) if a.quick else (1, 2, 3, 4, 5)
    rows = bench(counts, fixed, a.schedule, a.rounds or (1 if a.quick else 3), 32 if a.quick else 64)
    records = []
    for r in rows:
        targets = []
        if r["config"] == "schedule":
            if r["requests"] in (1, 16):
                targets.append(stated_target(f"schedule at {r['requests']} requests >= 0.97x the best fixed S",
                                             r["vs_best_fixed"], ">=", 0.97))
            if r["requests"] == 32:
                targets.append(stated_target("schedule at 32 requests >= 1.0x greedy", r["vs_greedy"], ">=", 1.0))
        records.append(record("schedule", f"{r['config']} requests={r['requests']}",
                              {"config": r["config"], "requests": r["requests"], "schedule": a.schedule},
                              "tokens_per_s", r.pop("_values"), backend="eager",
                              ratios={"vs_greedy": r["vs_greedy"], "vs_best_fixed": r["vs_best_fixed"]},
                              targets=targets))
    return emit("bench_schedule", rows, ["requests", "config", "tokens_per_s", "vs_greedy", "vs_best_fixed",
                                         "bands", "switches_per_100_steps"],
                {"schedule": a.schedule, "records": records}, a.json)


if __name__ == "__main__":
    main()
