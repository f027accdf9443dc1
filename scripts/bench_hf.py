"""Side by side with what a transformers user would pick instead (issue 42, item 6; a first cut:
not yet in `make bench`, no assisted generation, no static cache). On the embedded target converted
to a transformers ``LlamaForCausalLM`` (`hf_convert`), float64, one process, arms interleaved per
round: transformers ``generate`` (dynamic cache; batch 4 left-padded), prompt-lookup decoding
(batch 1), and draftgraph serving the same model through `HFTarget` with the trained embedded EAGLE
head, eager and with graphs. Prints tokens/s (best round), acceptance, and whether each arm's
tokens equal ``generate``'s; ``--json`` for the rows."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import torch

from draftgraph.runtime import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.engine import SpecDecodeEngine
from draftgraph.runtime.models import default_models
from draftgraph.runtime.models.corpus import held_out_prompts
from draftgraph.runtime.models.hf_convert import to_transformers
from draftgraph.runtime.models.hf_target import HFTarget


def _generate(model: Any, prompts: list[list[int]], n: int, lookup: bool = False) -> list[list[int]]:
    """transformers' greedy ``generate`` of the prompts as one (left-padded) batch."""
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    extra = {"prompt_lookup_num_tokens": 3} if lookup else {}
    out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n, min_new_tokens=n,
                         pad_token_id=0, **extra)
    return out[:, width:].tolist()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backend", default="trace", help="the graphs arm's backend (trace, compile, auto)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    target, head = default_models(seed=0, draft="eagle")
    plain = to_transformers(target)  # the user's model, transformers' own attention
    served = HFTarget(to_transformers(target), target.cfg.max_len)
    prompts = [list(p) for p in held_out_prompts(4, seed=11, min_len=32, max_len=64)]
    args = RuntimeArgs(SpeculativeConfig(3, 1), CudaGraphConfig(PhaseGraphConfig(bs=(1, 4))), max_running_requests=4)
    engines = {"eager": SpecDecodeEngine(args, served, head, backend="eager")}
    engines["graphs"] = SpecDecodeEngine(args, served, head, backend=a.backend, capture="blocking",
                                         graph_phases=("verify", "extend"))
    n = a.new_tokens
    arms: list[tuple[str, int, Callable[[], list[list[int]]], str | None]] = []
    for b in (1, 4):
        batch = prompts[:b]
        arms.append(("transformers generate", b, lambda batch=batch: _generate(plain, batch, n), None))
        if b == 1:
            arms.append(("prompt lookup", b, lambda batch=batch: _generate(plain, batch, n, lookup=True), None))
        for kind, engine in engines.items():
            arms.append((f"draftgraph {kind}", b, lambda batch=batch, e=engine: e.generate(batch, n), kind))
    seen: dict[tuple[str, int], dict[str, Any]] = {}
    for _ in range(a.rounds):
        for name, b, run, kind in arms:
            if kind is not None:
                engines[kind].reset_stats()
            start = time.perf_counter()
            out = run()
            tps = b * n / (time.perf_counter() - start)
            row = seen.setdefault((name, b), {"arm": name, "requests": b, "tokens_per_s": 0.0})
            row["tokens_per_s"] = max(row["tokens_per_s"], tps)
            row["accept_length"] = engines[kind].stats()["accept_length_mean"] if kind is not None else None
            row["tokens"] = out
    for engine in engines.values():
        engine.close()
    rows = list(seen.values())
    for row in rows:
        row["identical_to_generate"] = row["tokens"] == seen[("transformers generate", row["requests"])]["tokens"]
    for row in rows:
        del row["tokens"]
    if a.json:
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            acc = "" if r["accept_length"] is None else f"  accept {r['accept_length']:.2f}"
            print(f"{r['arm']:24s} requests={r['requests']}  {r['tokens_per_s']:7.1f} tokens/s{acc}  "
                  f"identical to generate: {r['identical_to_generate']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
