"""Each graph phase of a runtime state (target verify, draft extend, per KV window tier) replayed
against its eager step, at b in {1, 8, 64}: the phase figures of scripts/gpu_check.sh.

The models are the default shapes with their initial weights (timing does not depend on
training, and the GPU machine has no model cache). The phases come from the engine's own
provider (`EnginePhases`), so this measures the very steps the engine captures. Without CUDA it
runs on the CPU with the trace backend (a smoke run; ``--batches 1,2`` keeps it short).
Prints a table and JSON (``--json PATH`` writes it).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from draftgraph.graphs import GraphCaptureManager
from draftgraph.runtime import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.engine.drafting import EagleDrafter
from draftgraph.runtime.engine.phases import EnginePhases, default_tiers
from draftgraph.runtime.models.default_spec import DRAFT_VOCAB, EAGLE3_LAYER_IDS, MAX_LEN, head_config, target_config
from draftgraph.runtime.models.eagle_heads import Eagle3Head
from draftgraph.runtime.models.hf_target import HFTarget
from scripts.benchutil import emit, synced, time_interleaved

BATCHES = (1, 8, 64)


def _inputs(static: dict[str, torch.Tensor], b: int, lk: int) -> dict[str, torch.Tensor]:
    """Rows [b, ...] for one phase: real slots 1..b at a length that fills half the window."""
    out = {name: t[:b].clone() for name, t in static.items()}
    length = max(1, lk // 2)
    out["slots"] = torch.arange(1, b + 1, device=out["slots"].device)
    out["lens"] = torch.full_like(out["lens"], length)
    if "positions" in out:  # verify: a chain at the length
        n = out["positions"].shape[1]
        out["positions"] = length + torch.arange(n, device=out["positions"].device).expand(b, n)
        out["tree_mask"] = torch.ones_like(out["tree_mask"]).tril()
    else:  # extend: every row accepted, every request alive
        w = out["path"].shape[1]
        out["path"] = torch.arange(w, device=out["path"].device).expand(b, w).contiguous()
        out["length"] = torch.full_like(out["length"], w)
        out["alive"] = torch.ones_like(out["alive"])
    return out


def measure(backend: str, device: str, batches: tuple[int, ...], spec: SpeculativeConfig,
            repeats: int, inner: int) -> list[dict[str, Any]]:
    """One row per (phase, b): eager and replay ms, the ratio, and the phase's capture seconds."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)  # the default models' shapes, random weights (time does not depend on them)
    model = LlamaForCausalLM(target_config()).to(device)
    target = HFTarget(model, MAX_LEN, feature_layers=tuple(i + 1 for i in EAGLE3_LAYER_IDS))
    head = Eagle3Head(head_config(), target, draft_vocab_size=DRAFT_VOCAB, biased=frozenset())
    rows_max = max(batches)
    args = RuntimeArgs(spec, CudaGraphConfig(PhaseGraphConfig(max_bs=rows_max)), max_running_requests=rows_max,
                       device=device)
    drafter = EagleDrafter(args, head, rows_max + 1)
    cache = target.new_cache(rows_max + 1)
    phases = EnginePhases(target, cache, drafter, default_tiers(cache.max_len))
    out: list[dict[str, Any]] = []
    with torch.no_grad():
        for name, graph_step in phases(spec, rows_max).items():
            manager = GraphCaptureManager(graph_step.step, graph_step.static_inputs, batches, backend=backend,
                                          pad_values=graph_step.pad_values)
            t0 = time.perf_counter()
            manager.capture()
            capture_s = time.perf_counter() - t0
            lk = int(name.split("@")[1])
            for b in batches:
                inputs = _inputs(graph_step.static_inputs, b, lk)
                fns = {"eager": lambda s=graph_step.step, x=inputs: s(**x),
                       "replay": lambda m=manager, x=inputs: m.run(x)}
                if device.startswith("cuda"):
                    fns = {k: synced(f) for k, f in fns.items()}
                t = time_interleaved(fns, repeats=repeats, inner=inner)
                eager_ms, replay_ms = t["eager"] * 1e3, t["replay"] * 1e3
                out.append({"phase": name, "b": b, "eager_ms": eager_ms, "replay_ms": replay_ms,
                            "speedup": eager_ms / replay_ms if replay_ms else None, "capture_s": capture_s})
            manager.release()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default=None, help="graph backend (default: cuda with CUDA, else trace)")
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--inner", type=int, default=20)
    ap.add_argument("--json", default=None, metavar="PATH")
    ns = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    backend = ns.backend or ("cuda" if cuda else "trace")
    device = "cuda" if cuda else "cpu"
    batches = tuple(sorted({int(b) for b in ns.batches.split(",")}))
    rows = measure(backend, device, batches, SpeculativeConfig(3, 1), ns.repeats, ns.inner)
    emit("gpu_phases", rows, ["phase", "b", "eager_ms", "replay_ms", "speedup", "capture_s"],
         {"backend": backend, "device": device, "spec": "chain S=3 (N=4)"}, ns.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
