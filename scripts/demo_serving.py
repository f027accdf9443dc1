"""A simulated long-running serving loop: the main job of `make demo` (CPU, under a minute).

A seeded loop of draft steps on an EagleDraftWorker with the tiny draft model: graphs
captured per batch size, batch sizes drawn from a serving-like mix (mostly small, sometimes
full, now and then above the largest captured size), an AdaptiveStepController fed a
synthetic acceptance signal, and a live reload to another configuration at the midpoint,
delivered the way a server gets one: the new config is written to the reload file and the
process sends itself SIGHUP (``kill -HUP <pid>`` from outside works too).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import sys
import tempfile
import time

import psutil
import torch
from tqdm import tqdm

from draftgraph.runtime import (
    AdaptiveStepController,
    CudaGraphConfig,
    EagleDraftWorker,
    PhaseGraphConfig,
    RuntimeArgs,
    SpeculativeConfig,
    TinyDraftModel,
    build_tree,
    install_reload_signal,
    make_draft_input,
)

CANDIDATE_STEPS = (1, 2, 3, 5)
FIRST = {"speculative": {"num_steps": 3, "topk": 1},
         "cuda_graph_config": {"decode": {"max_bs": 32}}, "max_running_requests": 48}
SECOND = {"speculative": {"num_steps": 4, "topk": 1},
          "cuda_graph_config": {"decode": {"max_bs": 24}}, "max_running_requests": 40}


def args_of(d: dict) -> RuntimeArgs:
    decode = d["cuda_graph_config"]["decode"]
    return RuntimeArgs(SpeculativeConfig(**d["speculative"]),
                       CudaGraphConfig(PhaseGraphConfig(max_bs=decode["max_bs"])),
                       max_running_requests=d["max_running_requests"])


def batch_size(rng: random.Random, args: RuntimeArgs) -> int:
    """Serving-like mix: mostly small, sometimes full, now and then above the graphs."""
    max_bs, pool = args.decode.max_bs, args.max_running_requests
    r = rng.random()
    if r < 0.70:
        return rng.randint(1, 8)
    if r < 0.88:
        return rng.randint(9, max_bs - 1)
    if r < 0.95:
        return max_bs
    return rng.randint(max_bs + 1, pool)


def acceptance(rng: random.Random, step: int, s: int) -> float:
    """Synthetic mean accepted draft tokens: a slowly drifting quality, capped by S."""
    phase = (step // 250) % 4
    mean = (0.6, 2.2, 4.5, 1.4)[phase]
    return min(float(s), max(0.0, rng.gauss(mean, 0.6)))


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reload-at", type=int, default=None, help="step of the reload (default: half way)")
    p.add_argument("--reload-file", default=None, help="config file read on SIGHUP")
    p.add_argument("--backend", default="auto")
    p.add_argument("--json", action="store_true", help="print the summary as JSON only")
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    rng = random.Random(a.seed)
    torch.manual_seed(a.seed)
    reload_at = a.steps // 2 if a.reload_at is None else a.reload_at
    reload_file = a.reload_file or os.path.join(tempfile.mkdtemp(prefix="draftgraph-"), "args.json")
    with open(reload_file, "w") as f:
        json.dump(FIRST, f)

    proc = psutil.Process()
    rss0 = proc.memory_info().rss
    t0 = time.perf_counter()
    model = TinyDraftModel()
    args = args_of(FIRST)
    worker = EagleDraftWorker(args, model)
    # the controller builds (and captures) one state per candidate S and activates one of them
    controller = AdaptiveStepController(worker, CANDIDATE_STEPS, backend=a.backend)
    controller.step()
    setup_s = time.perf_counter() - t0
    rss_setup = proc.memory_info().rss
    uninstall = install_reload_signal(worker, reload_file)
    seen_states = {id(s): s for s in [worker.state, *controller.states.values()]}
    generation_of = {id(s): 0 for s in seen_states.values()}
    accepted_total = drafted_total = 0.0
    verified_tokens = 0
    loop_start = time.perf_counter()
    try:
        bar = tqdm(range(a.steps), disable=a.no_progress or a.json, desc="serving", unit="step")
        for step in bar:
            if step == reload_at:
                with open(reload_file, "w") as f:
                    json.dump(SECOND, f)
                os.kill(os.getpid(), signal.SIGHUP)  # applied at the next draft step
            s = controller.step(acceptance(rng, step, worker.speculative_num_steps))
            b = batch_size(rng, worker.args)
            inp = make_draft_input(b, 1, seed=rng.randrange(1 << 30))
            parents, top_idx, tokens = worker.draft_forward(inp)
            tree = build_tree(inp.topk_index[:, 0], parents, top_idx, tokens,
                              torch.full((b,), 100), 1, worker.speculative_num_steps,
                              worker.speculative_num_draft_tokens, validate=False)
            state = worker.last_state
            if id(state) not in seen_states:
                seen_states[id(state)] = state
                generation_of[id(state)] = state.generation
            for st in controller.states.values():
                if id(st) not in seen_states:
                    seen_states[id(st)] = st
                    generation_of[id(st)] = st.generation
            acc = acceptance(rng, step, s)
            accepted_total += acc * b
            drafted_total += s * b
            verified_tokens += tree.tokens.shape[0]
            bar.set_postfix(S=worker.speculative_num_steps, b=b, refresh=False)
    finally:
        uninstall()
    loop_s = time.perf_counter() - loop_start
    summary = summarize(worker, controller, seen_states, generation_of, setup_s, loop_s,
                        (rss_setup - rss0, proc.memory_info().rss - rss_setup),
                        accepted_total, drafted_total, a)
    summary["verify_tokens_built"] = verified_tokens
    if a.json:
        print(json.dumps(summary, indent=2))
    else:
        print_summary(summary)
    return summary


def summarize(worker, controller, states, generation_of, setup_s, loop_s, rss_delta,
              accepted, drafted, a) -> dict:
    rows = []
    for st in states.values():
        stt = st.stats
        rows.append({
            "generation": generation_of[id(st)], "S": st.num_steps, "N": st.num_draft_tokens,
            "sizes": len(st.capture_sizes), "steps": stt.steps, "replays": stt.graph_replays,
            "eager": stt.eager_steps, "pad_rows": stt.pad_rows,
            "capture_s": round(stt.capture_s, 3), "capture_kib": round(stt.capture_bytes / 1024, 1),
        })
    rows.sort(key=lambda r: (r["generation"], r["S"]))
    c = worker.counters
    replays = c.graph_replays
    pad = sum(r["pad_rows"] for r in rows)
    return {
        "steps": a.steps, "seed": a.seed, "backend": worker.state.graphs.backend_name
        if worker.state.graphs is not None else "eager",
        "setup_s": round(setup_s, 3), "loop_s": round(loop_s, 3),
        "us_per_step": round(loop_s / max(a.steps, 1) * 1e6, 1),
        "states": rows,
        "counters": c.as_dict(),
        "controller_switches": controller.switches,
        "padding_waste_rows": pad,
        "padding_waste_per_replay": round(pad / replays, 3) if replays else 0.0,
        "reloads": list(worker.reload_history),
        "rss_setup_mib": round(rss_delta[0] / 2**20, 1),
        "rss_loop_growth_mib": round(rss_delta[1] / 2**20, 1),
        "synthetic_acceptance_rate": round(accepted / drafted, 3) if drafted else 0.0,
        "final_state": worker.state.describe(),
    }


def print_summary(s: dict) -> None:
    cols = ["generation", "S", "N", "sizes", "steps", "replays", "eager", "pad_rows",
            "capture_s", "capture_kib"]
    print(f"\ndraftgraph demo: {s['steps']} draft steps, backend {s['backend']}, "
          f"setup {s['setup_s']} s, loop {s['loop_s']} s ({s['us_per_step']} us/step)")
    print("\nsteps per state")
    widths = [max(len(c), *(len(str(r[c])) for r in s["states"])) for c in cols]
    print("  ".join(c.rjust(w) for c, w in zip(cols, widths)))
    for r in s["states"]:
        print("  ".join(str(r[c]).rjust(w) for c, w in zip(cols, widths)))
    c = s["counters"]
    print("\ntotals")
    for key in ("graph_replays", "graph_eager_fallbacks", "eager_steps", "fast_path_hits",
                "tree_path_calls", "capacity_fallbacks", "switches", "reloads", "failed_reloads"):
        print(f"  {key:24s} {c[key]}")
    print(f"  {'controller switches':24s} {s['controller_switches']}")
    print(f"  {'padding waste':24s} {s['padding_waste_rows']} rows "
          f"({s['padding_waste_per_replay']} per replay)")
    for r in s["reloads"]:
        print(f"  reload ({r['policy']}): {'ok' if r['ok'] else 'FAILED'} in {r['seconds']:.3f} s "
              f"(capture {r['capture_s']:.3f} s, {r['capture_bytes'] / 1024:.1f} KiB of graph outputs)")
    print(f"  {'RSS at setup':24s} +{s['rss_setup_mib']} MiB (torch tracing machinery, graphs)")
    print(f"  {'RSS growth in the loop':24s} {s['rss_loop_growth_mib']} MiB")


if __name__ == "__main__":
    main(sys.argv[1:])
