"""Side by side on the real model (issue 47 item 6; run as ``scripts/bench_hf.py --target smollm2``
or ``python -m scripts.bench_real``): SmolLM2-135M-Instruct in float32 on held-out chat prompts
(the shipped demo set, through the chat template), at 1 request and at 4.

Systems: transformers' ``generate`` (dynamic cache; ``--compiled`` adds the static cache
compiled), prompt-lookup decoding (one sequence at a time: transformers takes no batch there),
draftgraph eager, with graphs (the draft step: the CPU default, captured before timing), with graphs
behind the payoff gate (what the commands serve a real model by default) and, with
``--phases``, with graphs and the verify / extend phases (trace backend: inductor takes minutes per
phase graph for 30 layers); and llama.cpp on the same GGUF file through llama-cpp-python when it is
installed (``make bench-peers``): it runs the file's Q4_1 weights, the others float32. With
``--weights q4`` or ``both`` (the default) the same systems but prompt lookup run again on the
file's Q4_1 codes (`models.q4_linear`: int4 kernel, bf16 into it, the stream in float64): rows marked
"(q4)", their identical-to-greedy against the q4 target's own greedy decoding.

One process, ``--threads`` torch threads for every system alike (llama.cpp too); every system
runs once per round, rounds alternate the order; medians over rounds, ratios the median of each
round's ratio. Every request asks ``--new-tokens`` tokens and stops at eos; tokens/s counts the
tokens produced. ``identical_to_greedy``: the outputs equal the target's own greedy decoding
(`greedy_generate`, float32, one token a forward). ``tokens_per_fwd``: the acceptance length.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from draftgraph.runtime import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.engine import SpecDecodeEngine
from draftgraph.runtime.engine.loading import resolve_models
from draftgraph.runtime.models import greedy_generate, load_models
from draftgraph.runtime.models.hf_text import eos_id_of, load_tokenizer
from draftgraph.runtime.models.prompt_file import demo_prompts, encode_all
from scripts.benchutil import emit, record
from scripts.benchutil import target as stated_target

PLD_TOKENS = 10
Q4 = " (q4)"  # the suffix of a row computed from the file's Q4_1 codes
# (row, requests, baseline, at least): the targets on this CPU
TARGETS = (("draftgraph graphs", 1, "generate", 2.5), ("draftgraph graphs", 4, "generate", 3.0),
           ("draftgraph graphs", 1, "llama.cpp", 1.0), ("draftgraph graphs (q4)", 1, "llama.cpp", 1.0))

Run = Callable[[], list[list[int]]]


def _cut(ids: list[int], eos: int | None, n: int) -> list[int]:
    ids = ids[:n]
    return ids[:ids.index(eos) + 1] if eos is not None and eos in ids else ids


def _hf_systems(folder: Path, prompts: list[list[int]], n: int, eos: int, compiled: bool,
                weights: str = "dense") -> dict[str, Run]:
    from transformers import AutoModelForCausalLM

    from draftgraph.runtime.models.q4_linear import compute_as_q4

    if weights == "q4":
        model = compute_as_q4(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval())
        return {"generate": batched_run(model, prompts, n, eos)}
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    base = dict(do_sample=False, max_new_tokens=n, pad_token_id=eos, eos_token_id=eos)

    def batched(**kw: Any) -> Run:
        return batched_run(model, prompts, n, eos, **kw)

    def one_by_one(**kw: Any) -> Run:
        def run() -> list[list[int]]:
            out = []
            with torch.no_grad():
                for p in prompts:
                    ids = torch.tensor([p])
                    out.append(_cut(model.generate(ids, attention_mask=torch.ones_like(ids), **base, **kw)
                                    [0, len(p):].tolist(), eos, n))
            return out
        return run

    systems = {"generate": batched()}
    if compiled:
        from transformers import CompileConfig

        config = CompileConfig()
        config._compile_all_devices = True  # noqa: SLF001  (CompileConfig's switch for non-GPU devices)
        systems["generate static compiled"] = batched(cache_implementation="static", compile_config=config)
    systems["prompt lookup"] = one_by_one(prompt_lookup_num_tokens=PLD_TOKENS)
    return systems


def batched_run(model: Any, prompts: list[list[int]], n: int, eos: int, **kw: Any) -> Run:
    """transformers' greedy ``generate`` over ``prompts`` as one left-padded batch."""
    base = dict(do_sample=False, max_new_tokens=n, pad_token_id=eos, eos_token_id=eos)
    width = max(map(len, prompts))  # left padding, as generate expects for a decoder-only batch
    ids = torch.tensor([[eos] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])

    def run() -> list[list[int]]:
        with torch.no_grad():
            return [_cut(r, eos, n) for r in model.generate(ids, attention_mask=mask, **base, **kw)[:, width:]
                    .tolist()]
    return run


def _llama_cpp(prompts: list[list[int]], n: int, eos: int, threads: int) -> Run | None:
    """llama.cpp on the wheel's GGUF (greedy, one sequence at a time), or None when not installed."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    from draftgraph.runtime.models.smollm2 import gguf_file

    llm = Llama(model_path=str(gguf_file()), n_ctx=1024, n_threads=threads, n_batch=512, verbose=False)

    def run() -> list[list[int]]:
        out = []
        for p in prompts:
            llm.reset()
            got: list[int] = []
            for t in llm.generate(p, temp=0.0, top_k=1, reset=True):
                got.append(int(t))
                if t == eos or len(got) >= n:
                    break
            out.append(got)
        return out
    return run


def _engines(folder: Path, head: Path, spec: SpeculativeConfig, phases: bool, eos: int, graph_backend: str,
             weights: str = "dense") -> tuple[dict[str, Any], Any]:
    target, draft = load_models(folder, head, "float64" if weights == "q4" else "float32", max_len=1024,
                                weights=weights)
    args = RuntimeArgs(spec, CudaGraphConfig(PhaseGraphConfig(bs=(1, 2, 4))), max_running_requests=4)
    out = {"draftgraph eager": SpecDecodeEngine(args, target, draft, backend="eager", eos_id=eos)}
    start = time.perf_counter()
    out["draftgraph graphs"] = SpecDecodeEngine(args, target, draft, backend=graph_backend, capture="fill",
                                                eos_id=eos)
    print(f"graphs ({graph_backend}, draft step) ready in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    # what `simulate`, `generate` and `serve` serve a real model by default: the spec behind the
    # payoff gate (plain steps while speculation is measured slower)
    out["draftgraph graphs gated"] = SpecDecodeEngine(args, target, draft, backend=graph_backend, capture="fill",
                                                      eos_id=eos, adaptive_steps=(0,))
    if phases:
        start = time.perf_counter()
        out["draftgraph graphs+phases"] = SpecDecodeEngine(args, target, draft, backend="trace", capture="blocking",
                                                           graph_phases=("verify", "extend"), eos_id=eos)
        print(f"graphs (trace, draft, verify, extend) ready in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return out, target


def _named(name: str, weights: str) -> str:
    return name + Q4 if weights == "q4" else name


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="smollm2", help="smollm2 or a checkpoint folder (then --draft)")
    p.add_argument("--draft", default=None, help="the head's folder (default: the target's default head)")
    p.add_argument("--json", default=None)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=4, help="chain S (default 4)")
    p.add_argument("--compiled", action="store_true", help="add generate with the static cache compiled")
    p.add_argument("--phases", action="store_true", help="add draftgraph with verify / extend graphs (trace)")
    p.add_argument("--quick", action="store_true", help="the smoke run: one round of 8 tokens")
    p.add_argument("--weights", default="both", choices=["dense", "q4", "both"],
                   help="the target's linear layers: float32, the file's Q4_1 codes, or both side by side")
    a = p.parse_args(argv)
    if a.quick:
        a.rounds, a.new_tokens = 1, 8
    torch.set_num_threads(a.threads)
    choice = resolve_models(a.target, a.draft, "float32")
    folder, head = Path(choice.target), Path(choice.draft)
    tok = load_tokenizer(folder, 0)
    eos = eos_id_of(tok)
    n = a.new_tokens
    # --quick (the smoke run) records its graphs with trace: inductor takes minutes for them cold
    kinds = ("dense", "q4") if a.weights == "both" else (a.weights,)
    engines: dict[str, Any] = {}
    targets: dict[str, Any] = {}
    for kind in kinds:
        built, targets[kind] = _engines(folder, head, SpeculativeConfig(a.steps, 1), a.phases and kind == "dense",
                                        eos, "trace" if a.quick else "auto", kind)
        engines.update({_named(name, kind): eng for name, eng in built.items()})
    rows, records, per_round = [], [], {}
    try:
        for conc in (1, 4):
            items = demo_prompts()[-8:]  # the last eight of the shipped set: never a training prompt
            prompts = encode_all(tok, items[:conc] if conc == 1 else items[1:1 + conc])
            refs = {kind: greedy_generate(t, prompts, n, eos) for kind, t in targets.items()}
            systems: dict[str, Run] = {}
            for kind in kinds:
                systems.update({_named(k, kind): fn for k, fn in
                                _hf_systems(folder, prompts, n, eos, a.compiled, kind).items()})
            peer = _llama_cpp(prompts, n, eos, a.threads)
            if peer is not None:
                systems["llama.cpp"] = peer
            for name, eng in engines.items():
                systems[name] = (lambda e=eng, ps=prompts: e.generate(ps, n))
            for fn in systems.values():
                fn()  # untimed: lazy initialisation, allocator
            times: dict[str, list[float]] = {k: [] for k in systems}
            tokens: dict[str, int] = {}
            same: dict[str, bool] = {k: True for k in systems}
            acc: dict[str, float] = {}
            order = list(systems)
            for r in range(a.rounds):
                for name in (order if r % 2 == 0 else order[::-1]):
                    if name in engines:
                        engines[name].reset_stats()
                    start = time.perf_counter()
                    out = systems[name]()
                    times[name].append(time.perf_counter() - start)
                    tokens[name] = sum(map(len, out))
                    same[name] &= out == refs["q4" if name.endswith(Q4) or "dense" not in refs else "dense"]
                    acc[name] = engines[name].stats()["accept_length_mean"] if name in engines else 1.0
            per_round[conc] = times
            base_row = "generate" if "generate" in times else _named("generate", "q4")
            for name, ts in times.items():
                t = statistics.median(ts)
                vs = statistics.median(b / o for b, o in zip(times[base_row], ts))
                note = ("Q4_1 weights (the file's own)" if name == "llama.cpp" else
                        "Q4_1 codes, int4 kernel (stream float64)" if name.endswith(Q4) else "float32")
                rows.append({"requests": conc, "system": name, "tokens_per_s": tokens[name] / t, "vs_generate": vs,
                             "tokens_per_fwd": acc[name], "identical_to_greedy": same[name], "weights": note})
                records.append(record("hf_real", f"{name} requests={conc}",
                                      {"system": name, "requests": conc, "max_new": n, "threads": a.threads},
                                      "tokens_per_s", [tokens[name] / x for x in ts], backend=name,
                                      ratios={"vs_generate": vs, "tokens_per_fwd": acc[name]}))
    finally:
        for eng in engines.values():
            eng.close()
    verdicts = {}
    if "dense" not in kinds:  # the targets read the q4 rows then
        per_round = {c: {(k[:-len(Q4)] if k.endswith(Q4) else k): v for k, v in t.items()}
                     for c, t in per_round.items()}
    for name, conc, base, limit in TARGETS:
        if name in per_round[conc] and base in per_round[conc]:
            ratio = statistics.median(b / o for b, o in zip(per_round[conc][base], per_round[conc][name]))
            label = f"{name}, {conc} request{'s' if conc > 1 else ''}: >= {limit:g}x {base}"
            verdicts[label] = {"ratio": ratio, "met": ratio >= limit}
            for rec in records:
                if rec["case"] == f"{name} requests={conc}":
                    rec["targets"].append(stated_target(label, ratio, ">=", limit))
    extra = {"model": choice.name, "weights": list(kinds), "head": str(head), "new_tokens": n, "rounds": a.rounds,
             "threads": a.threads,
             "spec": f"chain S={a.steps}", "llama_cpp": "installed" if "llama.cpp" in per_round[1] else
             "not installed (make bench-peers)", "targets": verdicts, "records": records}
    return emit("bench_real", rows, ["requests", "system", "tokens_per_s", "vs_generate", "tokens_per_fwd",
                                     "identical_to_greedy", "weights"], extra, a.json)


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
