"""The real model's whole step in compiled graphs, one request at a time (issue 47, item 7).

SmolLM2-135M-Instruct as the file stores it (Q4_1 codes through the int4 kernel, float64
stream), the shipped EAGLE-3 head behind the payoff gate (candidates S = 0, 1, 2), on held-out
chat prompts, one request at a time: transformers' ``generate`` over the same int4 modules, the
engine eager, and the engine on the ``compile`` backend with the verify and extend phases
(``graph_phases=("verify", "extend")``; plain steps from a target-only state's width-1 verify).
Rounds interleaved in one process; tokens per second of wall time including each request's
prefill; every engine row checked against the target's own greedy decoding.

The compiled engine's graphs are captured blocking before the rounds (one size, two KV tiers,
three states: about 8-10 minutes cold on 2 cores, seconds once the compiled-code store holds
them); the time is printed. ``--quick``: one round of 16 tokens on one prompt.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from draftgraph.runtime import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.engine import SpecDecodeEngine
from draftgraph.runtime.engine.loading import resolve_models
from draftgraph.runtime.models import greedy_generate, load_models
from draftgraph.runtime.models.hf_text import eos_id_of, load_tokenizer
from draftgraph.runtime.models.prompt_file import demo_prompts, encode_all
from draftgraph.runtime.models.q4_linear import compute_as_q4
from scripts.benchutil import emit, record

MAX_LEN = 256  # cache positions: a held-out prompt and 64 new tokens fit
TIERS = (128, 256)
GATE = (0, 1, 2)


def _generate(folder: Path, eos: int, n: int) -> Any:
    """transformers' own greedy ``generate`` over the same int4 modules (its own model copy)."""
    from transformers import AutoModelForCausalLM

    model = compute_as_q4(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval())

    def run(prompt: list[int]) -> list[int]:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                                 pad_token_id=eos, eos_token_id=eos)
        return out[0, len(prompt):].tolist()
    return run


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default=None)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--prompts", type=int, default=4, help="held-out prompts per round (the shipped set's tail)")
    p.add_argument("--tiers", type=int, nargs="+", default=list(TIERS),
                   help=f"KV window tiers, ascending, the last = {MAX_LEN} (default: %(default)s)")
    p.add_argument("--quick", action="store_true")
    a = p.parse_args(argv)
    if a.quick:
        a.rounds, a.new_tokens, a.prompts = 1, 16, 1
    torch.set_num_threads(1)
    choice = resolve_models("smollm2", None, "float32")
    folder, head = Path(choice.target), Path(choice.draft)
    tok = load_tokenizer(folder, 0)
    eos, n = eos_id_of(tok), a.new_tokens
    prompts = encode_all(tok, demo_prompts()[-8:][:a.prompts])  # never a training prompt
    target, draft = load_models(folder, head, "float64", max_len=MAX_LEN, weights="q4")
    args = RuntimeArgs(SpeculativeConfig(max(GATE), 1), CudaGraphConfig(PhaseGraphConfig(bs=(1,))),
                       max_running_requests=1)
    start = time.perf_counter()
    compiled = SpecDecodeEngine(args, target, draft, backend="compile", capture="blocking",
                                graph_phases=("verify", "extend"), kv_tiers=tuple(a.tiers), adaptive_steps=GATE,
                                eos_id=eos)
    ready_s = time.perf_counter() - start
    print(f"compiled phases ready in {ready_s:.0f} s", file=sys.stderr)
    eager = SpecDecodeEngine(args, target, draft, backend="eager", adaptive_steps=GATE, eos_id=eos)
    engines = {"draftgraph eager gated": eager, "draftgraph compiled phases gated": compiled}
    systems = {"generate": _generate(folder, eos, n),
               **{name: (lambda prompt, e=eng: e.generate([prompt], n)[0]) for name, eng in engines.items()}}
    refs = [greedy_generate(target, [pr], n, eos)[0] for pr in prompts]
    for fn in systems.values():
        fn(prompts[0])  # untimed: lazy initialisation
    rates: dict[str, list[float]] = {k: [] for k in systems}
    same = {k: True for k in systems}
    order = list(systems)
    try:
        for r in range(a.rounds):
            for name in (order if r % 2 == 0 else order[::-1]):
                tokens, t0 = 0, time.perf_counter()
                for pr, ref in zip(prompts, refs):
                    out = list(systems[name](pr))
                    tokens += len(out)
                    same[name] &= out == list(ref)
                rates[name].append(tokens / (time.perf_counter() - t0))
        stats = {name: eng.stats() for name, eng in engines.items()}
    finally:
        for eng in engines.values():
            eng.close()
    base = rates["generate"]
    rows, records = [], []
    for name, vals in rates.items():
        vs = statistics.median(v / b for v, b in zip(vals, base))
        st = stats.get(name)
        rows.append({"system": name, "tokens_per_s": statistics.median(vals), "vs_generate": vs,
                     "accept_length": st["accept_length_mean"] if st else 1.0,
                     "steps_by_s": st["payoff"]["steps_by_s"] if st else None, "identical_to_greedy": same[name]})
        records.append(record("real_phases", name, {"system": name, "max_new": n, "prompts": len(prompts)},
                              "tokens_per_s", vals, backend=name, ratios={"vs_generate": vs}))
    phases = stats["draftgraph compiled phases gated"]["phases"]
    extra = {"model": choice.name, "weights": "Q4_1 codes, int4 kernel (stream float64)", "head": str(head),
             "gate": list(GATE), "kv_tiers": list(a.tiers), "new_tokens": n, "rounds": a.rounds,
             "compiled_ready_s": ready_s,
             "phase_graphs": {k: {"graphs": v["graphs"], "replays": v["replays"], "compile_s": v["compile_s"],
                                  "eager_steps_by_reason": v["eager_steps_by_reason"]} for k, v in phases.items()},
             "records": records}
    return emit("bench_real_phases", rows, ["system", "tokens_per_s", "vs_generate", "accept_length", "steps_by_s",
                                            "identical_to_greedy"], extra, a.json)


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
