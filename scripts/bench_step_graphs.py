"""The whole step in graphs (issue 31): steady decode of the engine with all its graphs against
the same engine eager, and speculation against target-only greedy decoding on the same backend.

Steady decode: 128 new tokens per request (``--quick``: 16), chain S=3 (fixed), the default
embedded models, 1, 4 and 16 requests (``--quick``: 1 and 4). Capture sizes up to 16
(``max_bs=16``, 16 request slots); every graph is captured before timing (blocking capture,
then `worker.capture.wait`), and one warm-up run of every case is left out. Cases, interleaved per
round (the order rotates), medians over the rounds:

  (a) ``engine eager``: the engine on the eager backend;
  (b) ``engine <graph>``: the engine on this machine's graph backend ("auto": compile on a CPU
      with a compiler, cuda on a GPU; ``--quick``: trace), plus ``engine trace`` (the
      semantics-only reference, ``--no-trace`` to skip); ``--graph-phases verify,extend``
      passes the engine's ``graph_phases`` (default: the engine's own choice per backend);
  (c) ``target-only greedy``: `greedy_generate`, eager;
  (d) ``target-only greedy compiled``: the same with its decode step compiled
      (scripts/greedy_compiled.py; not in ``--quick``).

Every output is checked against (c). Targets, on a compiled graph backend (never on trace, so
``--quick`` states none of them): (b)/(a) >= 1.5 at 1 and 4 requests, >= 1.2 at 16; (b)/(d)
>= 1.5 at 1 request (speculation vs target-only on the same backend), reported at every
request count beside (a)/(c); ``decode_vs_eager`` is (b)/(a) without the admission stage
(prefill, not in graphs). Per step: host syncs at 4 requests (graphs/sync_audit.py's
``count_host_syncs``; target <= 2) for every engine, and each engine's seconds per stage
(``stats()["stage_s"]`` per step), so a note can say where the time goes.

Torch runs ``--threads`` threads (default 1: on a shared 2-core machine two threads swing the
figures); the load average before and after is in the JSON: a busy machine makes every figure
noisy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from draftgraph.graphs.sync_audit import count_host_syncs
from draftgraph.runtime import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.engine import SpecDecodeEngine
from draftgraph.runtime.models import default_models, greedy_generate
from draftgraph.runtime.models.corpus import held_out_prompts
from scripts.benchutil import emit, record, target
from scripts.greedy_compiled import CompiledGreedy

MAX_BS = 16
VS_EAGER = {1: 1.5, 4: 1.5, 16: 1.2}  # (b)/(a): engine with graphs over the engine eager
VS_TARGET_ONLY = {1: 1.5}  # (b)/(d): speculative over target-only, same backend
SYNC_LIMIT = 2  # host syncs per steady step at 4 requests
SYNC_REQUESTS = 4
GREEDY, GREEDY_COMPILED = "target-only greedy", "target-only greedy compiled"


def _args(device: str) -> RuntimeArgs:
    return RuntimeArgs(SpeculativeConfig(3, 1), CudaGraphConfig(PhaseGraphConfig(max_bs=MAX_BS)),
                       max_running_requests=MAX_BS, device=device)


def _engine(target_model: Any, head: Any, backend: str, device: str, phases: tuple[str, ...] | None
            ) -> tuple[str, SpecDecodeEngine, dict]:
    """An engine with every graph ready; (the backend that serves, the engine, its start-up).
    ``phases``: the engine's ``graph_phases`` (None: not passed, the engine's default)."""
    start = time.perf_counter()
    kw = {"graph_phases": phases} if phases is not None and backend != "eager" else {}
    eng = SpecDecodeEngine(_args(device), target_model, head, backend=backend, capture="blocking", **kw)
    if not eng.worker.capture.wait(1800.0):
        raise RuntimeError(f"backend={backend!r}: graphs not ready after 1800 s")
    graphs = eng.worker.state.graphs
    name = graphs.backend_name if graphs is not None else "eager"
    st = eng.stats()
    ready = {"ready_s": time.perf_counter() - start, "capture_s": st["capture_s"], "compile_s": st["compile_s"],
             "sizes": st["state"]["capture_sizes"], "sizes_failed": st["states"][0]["sizes_failed"],
             "units_loaded": st["units_loaded"], "units_compiled": st["units_compiled"]}
    return name, eng, ready


def _sync_counts(eng: SpecDecodeEngine, prompts: list[list[int]], steps: int = 4) -> dict[str, Any]:
    """Host syncs of each of ``steps`` steady steps at 4 requests (admission done before)."""
    for p in prompts[:SYNC_REQUESTS]:
        eng.add_request(p, 64)
    eng.step()  # admission (a prefill reads its first token) and one step
    eng.reset_stats()
    per_step: list[list[str]] = []
    for _ in range(steps):
        with count_host_syncs() as found:
            eng.step()
        per_step.append(list(found))
    batches = eng.stats()["batch_sizes"]
    while eng.has_work():
        for rid in eng.step():
            eng.pop_result(rid)
    if batches != {SYNC_REQUESTS: steps}:
        raise RuntimeError(f"sync count: steps ran batches {batches}, not {steps} x {SYNC_REQUESTS}")
    return {"per_step": [len(s) for s in per_step], "reads": sorted({r for s in per_step for r in s})}


def _stages(st: dict[str, Any]) -> dict[str, float]:
    """Milliseconds per step of every stage the engine times (``stats()["stage_s"]``), and their sum."""
    steps = max(st["steps"], 1)
    out = {k: v / steps * 1e3 for k, v in st["stage_s"].items()}
    out["step"] = sum(out.values())
    return out


def _time_cases(cases: dict[str, Callable[[], list[list[int]]]], ref: list[list[int]], rounds: int
                ) -> dict[str, list[float]]:
    """Seconds per run of every case, interleaved (the order rotates per round); each output
    checked against the greedy reference."""
    names = list(cases)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            start = time.perf_counter()
            out = cases[n]()
            times[n].append(time.perf_counter() - start)
            if out != ref:
                raise AssertionError(f"{n}: output differs from target-only greedy decoding")
    return times


def _n(conc: int) -> str:
    return f"{conc} request" + ("s" if conc != 1 else "")


def _ratio(times: dict[str, list[float]], num: str, den: str) -> float | None:
    """Tokens/s of ``num`` over ``den`` (medians), None when either did not run."""
    if num not in times or den not in times:
        return None
    return statistics.median(times[den]) / statistics.median(times[num])


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--requests", type=int, nargs="+", default=None)
    p.add_argument("--max-new", type=int, default=None)
    p.add_argument("--device", default="cpu", help="cpu, or cuda (the cuda graph backend)")
    p.add_argument("--backend", default=None, help="the graph backend of (b) (default: auto; --quick: trace)")
    p.add_argument("--no-trace", action="store_true", help="skip the trace engine (semantics-only reference)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--graph-phases", default=None, metavar="verify,extend",
                   help="the graph engines' graph_phases ('' for none; default: the engine's own default)")
    a = p.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(a.threads)
    try:
        return _run(a)
    finally:
        torch.set_num_threads(threads)


def _cases(tgt: Any, compiled: CompiledGreedy | None, engines: dict[str, SpecDecodeEngine],
           prompts: list[list[int]], max_new: int) -> dict[str, Callable[[], list[list[int]]]]:
    """The timed cases on ``prompts``: target-only greedy (eager, compiled) and every engine."""
    cases: dict[str, Callable[[], list[list[int]]]] = {GREEDY: lambda: greedy_generate(tgt, prompts, max_new)}
    if compiled is not None:
        cases[GREEDY_COMPILED] = lambda: compiled.generate(prompts, max_new)
    for name, eng in engines.items():
        cases[f"engine {name}"] = lambda eng=eng: eng.generate(prompts, max_new)
    return cases


def _engine_figures(conc: int, case: str, times: dict[str, list[float]], st: dict[str, Any],
                    graph_name: str | None, decode: dict[str, float]) -> tuple[dict, dict, list]:
    """(table columns, ratios, targets) of one engine case from its timings and ``stats()``."""
    be = case.removeprefix("engine ")
    stage = _stages(st)
    cols = {"accept": st["accept_length_mean"], "ms_step": stage["step"],
            **{k: v for k, v in stage.items() if k in ("admit", "draft", "verify", "extend")}}
    same = GREEDY if be in ("eager", "trace") else GREEDY_COMPILED
    ratios = {"accept_length": st["accept_length_mean"], "vs_eager": _ratio(times, case, "engine eager"),
              "vs_target_only_same_backend": _ratio(times, case, same),
              "draft_graph_share": st["draft_replays"] / max(st["draft_replays"] + st["draft_eager"], 1)}
    decode[be] = sum(times[case]) - st["stage_s"].get("admit", 0.0)  # the rounds' time out of admission
    if "eager" in decode:
        ratios["decode_vs_eager"] = decode["eager"] / decode[be]
    for phase, replays in st.get("phase_replays", {}).items():  # graph phases (verify, extend), where captured
        ratios[f"{phase}_replays_per_step"] = replays / max(st["verify_steps"], 1)
    cols.update(vs_eager=ratios["vs_eager"], vs_target_only=ratios["vs_target_only_same_backend"])
    targets = []
    if be == graph_name and ratios["vs_eager"] is not None and conc in VS_EAGER:
        targets.append(target(f"step graphs: engine {be} / eager, {_n(conc)} >= {VS_EAGER[conc]:g}x",
                              ratios["vs_eager"], ">=", VS_EAGER[conc]))
    vs_same = ratios["vs_target_only_same_backend"]
    if be == graph_name and same == GREEDY_COMPILED and vs_same is not None and conc in VS_TARGET_ONLY:
        limit = VS_TARGET_ONLY[conc]
        targets.append(target(f"step graphs: engine {be} / target-only compiled, {_n(conc)} >= {limit:g}x",
                              vs_same, ">=", limit))
    return cols, ratios, targets


def _measure(conc: int, tgt: Any, compiled: CompiledGreedy | None, engines: dict[str, SpecDecodeEngine],
             graph_name: str | None, params: dict[str, Any], stages: dict, stats_out: dict
             ) -> tuple[list[dict], list[dict]]:
    """Rows and records of one request count (``stages`` gets each engine's stage figures,
    ``stats_out`` its whole ``stats()`` after the timed rounds)."""
    max_new, rounds = params["max_new"], params["rounds"]
    prompts = [list(x) for x in held_out_prompts(conc, seed=40 + conc)]
    ref = greedy_generate(tgt, prompts, max_new)
    cases = _cases(tgt, compiled, engines, prompts, max_new)
    _time_cases(cases, ref, 1)  # warm-up: left out (compiles the greedy step's tiers)
    before = {}
    for name, eng in engines.items():
        eng.reset_stats()
        before[name] = eng.stats()  # the worker's counters (replays, eager steps) are not reset
    times = _time_cases(cases, ref, rounds)
    tokens = conc * max_new
    decode: dict[str, float] = {}
    rows, records = [], []
    for case, ts in times.items():
        be = case.removeprefix("engine ") if case.startswith("engine ") else (
            "compile" if case == GREEDY_COMPILED else "eager")
        row: dict[str, Any] = {"requests": conc, "case": case, "backend": be,
                               "tokens_per_s": tokens / statistics.median(ts)}
        ratios: dict[str, float | None] = {}
        targets: list[dict[str, Any]] = []
        if case == GREEDY_COMPILED:
            ratios["vs_greedy_eager"] = _ratio(times, case, GREEDY)
        if case.startswith("engine "):
            st = engines[be].stats()
            st["draft_replays"] = st["graph_replays"] - before[be]["graph_replays"]
            st["draft_eager"] = st["eager_steps"] - before[be]["eager_steps"]
            st["phase_replays"] = {k: v["replays"] - before[be]["phases"][k]["replays"]
                                   for k, v in (st.get("phases") or {}).items()}
            stages.setdefault(be, {})[f"requests={conc}"] = _stages(st)
            stats_out.setdefault(be, {})[f"requests={conc}"] = st  # whatever the engine reports (phases...)
            cols, ratios, targets = _engine_figures(conc, case, times, st, graph_name, decode)
            row.update(cols)
        rows.append(row)
        records.append(record("step_graphs", f"{case} requests={conc}", {**params, "requests": conc},
                              "tokens_per_s", [tokens / x for x in ts], backend=be, ratios=ratios,
                              targets=targets))
    return rows, records


def _run(a: argparse.Namespace) -> dict:
    load_before = os.getloadavg()
    rounds = a.rounds or (1 if a.quick else 5)
    max_new = a.max_new or (16 if a.quick else 128)
    concs = tuple(a.requests or ((1, 4) if a.quick else (1, 4, 16)))
    if max(concs) > MAX_BS:
        raise ValueError(f"--requests {max(concs)}: at most {MAX_BS} (the capture sizes' top)")
    graph_be = a.backend or ("trace" if a.quick else "auto")
    phases = None if a.graph_phases is None else tuple(x for x in a.graph_phases.split(",") if x)
    tgt, head = default_models(device=a.device)
    engines: dict[str, SpecDecodeEngine] = {}
    ready: dict[str, dict] = {}
    for be in ["eager", graph_be] + ([] if a.no_trace or graph_be == "trace" else ["trace"]):
        name, eng, info = _engine(tgt, head, be, a.device, phases)
        if name not in engines:  # "auto" may resolve to a backend already there (eager: no compiler)
            engines[name], ready[name] = eng, info
    # the speed targets are stated for a backend that runs compiled code: trace (an FX replay in
    # Python, the semantics-only reference; --quick's graph backend) gets none
    graph_name = next((n for n in engines if n not in ("eager", "trace")), None)
    compiled = None if a.quick else CompiledGreedy(tgt)
    syncs = {name: _sync_counts(eng, [list(x) for x in held_out_prompts(SYNC_REQUESTS, seed=44)])
             for name, eng in engines.items()}
    rows: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []
    stages: dict[str, dict[str, dict[str, float]]] = {}
    engine_stats: dict[str, dict[str, Any]] = {}
    params = {"chain": "S=3", "max_new": max_new, "max_bs": MAX_BS, "device": a.device, "threads": a.threads,
              "rounds": rounds, "graph_phases": "default" if phases is None else ",".join(phases)}
    for conc in concs:
        r, rec = _measure(conc, tgt, compiled, engines, graph_name, params, stages, engine_stats)
        rows += r
        records += rec
    for name, s in syncs.items():
        rows.append({"requests": SYNC_REQUESTS, "case": "host syncs per steady step", "backend": name,
                     "syncs": max(s["per_step"])})
        records.append(record("step_graphs", f"host syncs per steady step requests={SYNC_REQUESTS} {name}",
                              {"chain": "S=3", "requests": SYNC_REQUESTS, "reads": s["reads"]}, "syncs_per_step",
                              s["per_step"], backend=name,
                              targets=[target(f"step graphs: host syncs per step at {SYNC_REQUESTS} requests, "
                                              f"{name} <= {SYNC_LIMIT}", max(s["per_step"]), "<=", SYNC_LIMIT)]))
    extra = {"stages_ms_per_step": stages, "host_syncs": syncs, "graphs_ready": ready, "graph_backend": graph_name,
             "load_average": {"before": load_before, "after": os.getloadavg()},
             "verdicts": {t["name"]: t["met"] for r in records for t in r["targets"]}, "engine_stats": engine_stats,
             "records": records}
    cols = ["requests", "case", "backend", "tokens_per_s", "vs_eager", "vs_target_only", "accept", "ms_step",
            "admit", "draft", "verify", "extend", "syncs"]
    return emit("bench_step_graphs", rows, cols, extra, a.json)


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
