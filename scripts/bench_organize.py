"""Organize benchmark: chain fast path vs a static tree's organize vs the general path vs
SGLang's organize vs a bare slice.

For b in (1, 8, 64, 256) and S in (1, 3, 5), all variants interleaved in one process, plus the
aten ops each dispatches per call. "static" is what a static draft tree of depth S pays to
organize a step: the key check of its topology buffers and their views at b. Prints a table and
JSON (``--json PATH`` also writes it), with one summary record per case and variant.
"""

from __future__ import annotations

import argparse

import torch

from draftgraph.runtime import (
    CudaGraphConfig,
    DraftInput,
    EagleDraftWorker,
    MultiLayerEagleDraftWorker,
    PhaseGraphConfig,
    RuntimeArgs,
    SpeculativeConfig,
)
from draftgraph.runtime.testing import TinyDraftModel
from draftgraph.runtime.topology.organize import organize_chain_steps
from scripts.benchutil import count_ops, emit, load_sglang, record, synced, target, time_interleaved

BATCHES = (1, 8, 64, 256)
STEPS = (1, 3, 5)
VARIANTS = ("fast", "static", "general", "sglang", "bare")


def static_tree(s: int) -> tuple[tuple[int, ...], ...]:
    """A static draft tree of depth s: two children at the root, then a spine."""
    return ((0,), (1,)) + tuple((0,) * d for d in range(2, s + 1))


def sglang_organize(ref, topk_p, topk_index, s):
    """SGLang's multi-layer general path, composed from its select/organize functions."""
    spec_utils, eagle_utils = ref
    _, _, _, info = spec_utils.select_top_k_tokens(0, topk_p, topk_index, None, None, 1)
    if s == 1:
        return eagle_utils.organize_draft_results([info[0]], [info[1]], [info[2]], s + 1)
    b = topk_index.shape[0]
    scores = [info[0][:, :, i].unsqueeze(-1) for i in range(s)]
    tokens = [info[1][:, i].unsqueeze(-1) for i in range(s)]
    parents = [info[2]] + [torch.full((b, 1), i, dtype=torch.long, device=topk_index.device)
                           for i in range(1, s)]
    return eagle_utils.organize_draft_results(scores, tokens, parents, s + 1)


def bench_case(b, s, ref, device, repeats, inner):
    args = RuntimeArgs(SpeculativeConfig(s, 1), CudaGraphConfig(PhaseGraphConfig(max_bs=256)),
                       device=device)
    worker = MultiLayerEagleDraftWorker(args)
    gen = torch.Generator().manual_seed(b * 31 + s)
    inp = DraftInput(torch.rand(b, s, generator=gen).to(device),
                     torch.randint(0, 32000, (b, s), generator=gen).to(device), None)
    buf = worker.state.chain_buffers
    parents, score_indices, topk_index = buf.parents, buf.score_indices, inp.topk_index
    tree_args = RuntimeArgs(SpeculativeConfig(s, 2, tree_choices=static_tree(s)),
                            CudaGraphConfig(PhaseGraphConfig(max_bs=256)), device=device)
    tree_state = EagleDraftWorker(tree_args, TinyDraftModel(device=device)).state
    fns = {
        "fast": lambda: worker.draft_forward(inp),
        "static": lambda: tree_state.static_buffers().view(b),
        "general": lambda: organize_chain_steps(inp.topk_p, inp.topk_index, None, s, s + 1),
        "bare": lambda: (parents[:b], score_indices[:b], topk_index),
    }
    if ref is not None:
        fns["sglang"] = lambda: sglang_organize(ref, inp.topk_p, inp.topk_index, s)
    if device != "cpu":
        fns = {k: synced(f) for k, f in fns.items()}
    t = time_interleaved(fns, repeats=repeats, inner=inner)
    ops = {k: count_ops(f) for k, f in fns.items()}
    row = {"b": b, "S": s, **{f"{k}_us": v * 1e6 for k, v in t.items()},
           **{f"{k}_ops": ops[k]["compute_ops"] for k in fns}}
    row["fast/bare"] = t["fast"] / t["bare"]
    row["static/bare"] = t["static"] / t["bare"]
    if "sglang" in t:
        row["sglang/fast"] = t["sglang"] / t["fast"]
        row["general/sglang"] = t["general"] / t["sglang"]
    row["_samples"] = t
    return row


def case_records(row: dict, device: str) -> list[dict]:
    """Summary records of one (b, S) row: one per variant, with the targets that concern it."""
    b, s, t = row["b"], row["S"], row["_samples"]
    out = []
    for v in VARIANTS:
        if v not in t:
            continue
        ratios: dict = {"compute_ops": row[f"{v}_ops"]}
        targets = []
        if v == "fast":
            ratios.update({"fast/bare": row["fast/bare"], "sglang/fast": row.get("sglang/fast")})
            targets += [target("fast path dispatches no compute op", row["fast_ops"], "==", 0),
                        target("fast <= 1.5x bare slice", row["fast/bare"], "<=", 1.5)]
            if "sglang/fast" in row and (b, s) == (1, 3):
                targets.append(target("fast >= 15x faster than SGLang (b=1, S=3)",
                                      row["sglang/fast"], ">=", 15))
            if "sglang/fast" in row and b == 256:
                targets.append(target("fast >= 100x faster than SGLang (b=256)",
                                      row["sglang/fast"], ">=", 100))
        elif v == "static":
            ratios["static/bare"] = row["static/bare"]
        elif v == "general" and "general/sglang" in row:
            ratios["general/sglang"] = row["general/sglang"]
            targets.append(target("general path within 1.2x SGLang", row["general/sglang"], "<=", 1.2))
        out.append(record("organize", f"b={b} S={s} {v}", {"b": b, "S": s, "variant": v,
                                                             "device": device},
                          "us_per_call", t[v], backend="eager", scale=1e6, ratios=ratios,
                          targets=targets))
    return out



def targets(rows, have_ref):
    """The issue's targets, checked on the measured rows."""
    def at(b, s):
        return next(r for r in rows if r["b"] == b and r["S"] == s)
    out = {
        "fast_path_compute_ops_zero": all(r["fast_ops"] == 0 for r in rows),
        "fast_le_1.5x_bare": all(r["fast/bare"] <= 1.5 for r in rows),
    }
    if have_ref:
        out["fast_ge_15x_sglang_b1_S3"] = at(1, 3)["sglang/fast"] >= 15
        out["fast_ge_100x_sglang_b256"] = all(r["sglang/fast"] >= 100 for r in rows if r["b"] == 256)
        out["general_within_1.2x_sglang"] = all(r["general/sglang"] <= 1.2 for r in rows)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--json", help="also write the JSON here")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--inner", type=int, default=200)
    p.add_argument("--quick", action="store_true", help="fewer repeats (demo / smoke)")
    a = p.parse_args(argv)
    if a.quick:
        a.repeats, a.inner = 5, 50
    ref = load_sglang()
    rows = [bench_case(b, s, ref, a.device, a.repeats, a.inner) for s in STEPS for b in BATCHES]
    records = [r for row in rows for r in case_records(row, a.device)]
    for row in rows:
        del row["_samples"]
    cols = ["b", "S", "fast_us", "static_us", "bare_us", "general_us", "sglang_us", "fast/bare",
            "sglang/fast", "general/sglang", "fast_ops", "static_ops", "general_ops", "sglang_ops"]
    return emit("organize", rows, cols, {"device": a.device, "targets": targets(rows, ref is not None),
                                         "records": records}, a.json)


if __name__ == "__main__":
    main()
