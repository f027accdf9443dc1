"""The target's verify forward and the draft's extend in graphs: do they pay on this CPU, are
they exact, and which KV window tiers to capture (issue 31, items 2 and 4).

1. Verify: the default target (float64) over N=4 chain tokens per request, attending to a KV
   window of ``lk`` cache positions under the engine's verify mask (built inside the step from
   the lengths), at b in {1, 4, 16} and lk in {64, 128, 256, 512}. Per b, every window and
   path is timed in one run, interleaved round by round (windows compare under the same load):
   eager, raw ``torch.compile`` (dynamo, one compile per shape), and `GraphCaptureManager.run`
   on the "trace" (FX replay) and "compile" (inductor) backends.
   Each compiled path is checked against eager on fresh inputs (not the capture inputs):
   hidden states bitwise, argmax tokens equal (`first_equal`: the tokens; for extend, the features).
2. KV tiers, from the compile backend's figures: a verify at committed length L reads the
   smallest tier >= L + N. Per tiering, the mean verify time over lengths 1..508 (uniform) and
   over 1..252 (a steady decode of 128 new tokens stays there), beside attention over the full
   cache (512) with a mask, and the graphs each needs (tiers x sizes).
3. Extend: the EAGLE head's `extend` (float32) over 4 committed tokens per request, lk=128,
   at b in {1, 4, 16}: the same four paths and the same exactness check.

4. The target's linear layers alone at each b's b x N tokens (float64, no attention, no graph):
   the part of a verify no graph removes (``--floor-only``: only this part, seconds).

Figures only, no targets (the engine-level targets of issue 31 live in bench_engine). Prints a
table per part and the JSON (``--json PATH`` writes it); ``--quick``: lk=128, b=1, no raw
torch.compile, few rounds.
"""

from __future__ import annotations

import argparse
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from draftgraph.graphs import GraphCaptureManager
from draftgraph.graphs.compile.inductor import compiler_available
from draftgraph.runtime.models import default_models
from scripts.benchutil import emit, record, time_interleaved

N = 4  # verify width (chain S=3) and extend width
SIZES = (1, 4, 16)
WINDOWS = (64, 128, 256, 512)
EXTEND_WINDOW = 128
SLOTS = max(SIZES) + 1  # slot 0 is the dummy slot
TIERINGS = ((512,), (256, 512), (128, 512), (128, 256, 512), (64, 128, 256, 512))
PATHS = ("eager", "torch_compile", "trace", "compile")


def verify_step(target: torch.nn.Module, cache: Any, lk: int) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The verify forward over a KV window of ``lk``: (tokens, positions [b, N], lens, slots [b],
    tree_mask [b, N, N]) -> (argmax [b, N], hidden [b, N, d]); writes K/V at lens + i."""
    def step(tokens: torch.Tensor, positions: torch.Tensor, lens: torch.Tensor, slots: torch.Tensor,
             tree_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, n = tokens.shape
        write = lens[:, None] + torch.arange(n)[None]
        rel = torch.arange(lk)[None] - lens[:, None]
        in_tree = (rel >= 0) & (rel < n)
        col = rel.clamp(0, n - 1).unsqueeze(1).expand(b, n, lk)
        mask = tree_mask.gather(2, col) & in_tree.unsqueeze(1) | (rel < 0).unsqueeze(1)
        logits, hidden = target(tokens, positions, write, slots, mask, cache)
        return logits.argmax(-1), hidden
    return step


def verify_inputs(rows: int, lk: int, vocab: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Random rows whose lengths fill the window's second half (the tree ends inside it)."""
    lens = torch.randint(lk // 2, lk - N + 1, (rows,), generator=gen)
    return {"tokens": torch.randint(0, vocab, (rows, N), generator=gen),
            "positions": lens[:, None] + torch.arange(N)[None], "lens": lens,
            "slots": torch.arange(1, rows + 1), "tree_mask": torch.ones(rows, N, N, dtype=torch.bool).tril()}


def extend_step(head: torch.nn.Module, lk: int) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The EAGLE head's extend over N committed tokens per request at lens .. lens + N - 1:
    (feats [b, N, d], tokens [b, N], lens, slots [b]) -> (features, logits)."""
    def step(feats: torch.Tensor, tokens: torch.Tensor, lens: torch.Tensor, slots: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
        b, n = tokens.shape
        pos = lens[:, None] + torch.arange(n)[None]
        mask = torch.arange(lk)[None, None] <= pos[:, :, None]
        return head.extend(feats, tokens, pos, slots, slots[:, None].expand(b, n), mask)
    return step


def extend_inputs(rows: int, lk: int, dim: int, vocab: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    lens = torch.randint(lk // 2, lk - N + 1, (rows,), generator=gen)
    return {"feats": torch.randn(rows, N, dim, generator=gen),
            "tokens": torch.randint(0, vocab, (rows, N), generator=gen), "lens": lens,
            "slots": torch.arange(1, rows + 1)}


def _fill(tensors: tuple[torch.Tensor, ...], gen: torch.Generator) -> None:
    for t in tensors:
        t.copy_(torch.randn(t.shape, generator=gen, dtype=t.dtype) * 0.5)


def _rows(inputs: dict[str, torch.Tensor], b: int) -> dict[str, torch.Tensor]:
    return {k: v[:b].clone() for k, v in inputs.items()}


def _exact(step: Callable[..., Any], fn: Callable[[dict[str, torch.Tensor]], Any], args: dict[str, torch.Tensor]
           ) -> dict[str, Any]:
    """One path against eager on the same fresh inputs (eager runs first, each time: both write
    the same cache entries). The first output is compared as tokens (verify) or features."""
    want = step(**args)
    got = fn(args)
    diff = max(float((a.double() - g.double()).abs().max()) for a, g in zip(want, got))
    return {"bitwise": all(torch.equal(a, g) for a, g in zip(want, got)), "first_equal": torch.equal(want[0], got[0]),
            "max_abs_diff": diff}


def _own_code(fn: Callable[..., Any], tag: str) -> Callable[..., Any]:
    """``fn`` over a code object of its own: dynamo keeps one cache per code object, so each
    (window, batch) compiles once and checks only its own guards."""
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{tag}")
    return types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


@dataclass
class _Case:
    """One step (one KV window) and its captured managers."""

    lk: int
    step: Callable[..., Any]
    static: dict[str, torch.Tensor]
    managers: dict[str, GraphCaptureManager]
    capture_s: dict[str, float]


def _case(lk: int, step: Callable[..., Any], static: dict[str, torch.Tensor], sizes: tuple[int, ...],
          pad: dict[str, Any]) -> _Case:
    """The step with a "trace" and a "compile" manager captured at ``sizes``."""
    managers, capture_s = {}, {}
    for backend in ("trace", "compile"):
        start = time.perf_counter()
        m = GraphCaptureManager(step, static, sizes, backend=backend, pad_values=pad)
        m.capture()
        capture_s[backend] = time.perf_counter() - start
        managers[backend] = m
    return _Case(lk, step, static, managers, capture_s)


def _measure(cases: list[_Case], b: int, fresh: Callable[[int], dict[str, torch.Tensor]], raw: bool,
             repeats: int, inner: int) -> dict[int, tuple[dict[str, Any], dict[str, Any], float | None]]:
    """At batch ``b``, every path of every case timed in one interleaved run (so windows compare
    under the same load); per window: (samples by path, exactness by path, torch.compile seconds)."""
    calls: dict[str, Callable[[], Any]] = {}
    out = {}
    with torch.no_grad():
        for case in cases:
            args = _rows(case.static, b)
            paths: dict[str, Callable[[dict[str, torch.Tensor]], Any]] = {"eager": lambda a, s=case.step: s(**a)}
            compile_s = None
            if raw:
                fn = torch.compile(_own_code(case.step, f"lk{case.lk}_b{b}"), dynamic=False)
                start = time.perf_counter()
                fn(**args)  # the compile of this shape
                compile_s = time.perf_counter() - start
                paths["torch_compile"] = lambda a, f=fn: f(**a)
            for name, m in case.managers.items():
                paths[name] = lambda a, m=m: m.run(a, clone=True)
            inputs = fresh(case.lk)
            exact = {name: _exact(case.step, fn, inputs) for name, fn in paths.items() if name != "eager"}
            out[case.lk] = ({}, exact, compile_s)
            calls.update({f"{name}@{case.lk}": (lambda fn=fn, a=args: fn(a)) for name, fn in paths.items()})
        timed = time_interleaved(calls, repeats=repeats, inner=inner, gc_off=True)
    for key, sample in timed.items():
        name, lk = key.split("@")
        out[int(lk)][0][name] = sample
    return out


def _row(part: str, b: int, lk: int, s: dict[str, Any], exact: dict[str, Any], compile_s: float | None,
         managers: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"part": part, "b": b, "lk": lk}
    for name in PATHS:
        row[f"{name}_ms"] = s[name] * 1e3 if name in s else None
    for name in PATHS[1:]:
        row[f"x_{name}"] = s["eager"] / s[name] if name in s else None
    comp = managers.get("compile")
    size = comp.stats.sizes.get(b) if comp is not None else None
    row["compile_engine"] = size.engine if size is not None else None
    row["compile_fallback"] = size.fallback if size is not None else None
    for name, e in exact.items():
        row[f"bitwise_{name}"] = e["bitwise"]
        row[f"diff_{name}"] = e["max_abs_diff"]
    row["first_equal"] = all(e["first_equal"] for e in exact.values())  # verify: tokens; extend: features
    row["torch_compile_s"] = compile_s
    return row


def tier_of(length: int, tiers: tuple[int, ...]) -> int:
    """The smallest tier >= length (ValueError past the largest: refused at admission)."""
    for t in sorted(tiers):
        if t >= length:
            return t
    raise ValueError(f"length={length}: past the largest tier {max(tiers)}")


def tiering_rows(rows: list[dict[str, Any]], windows: tuple[int, ...], capture_s: dict[int, float],
                 n_sizes: int) -> list[dict[str, Any]]:
    """Mean verify ms per tiering (compile backend figures) over uniform committed lengths."""
    out = []
    for b in sorted({r["b"] for r in rows}):
        ms = {r["lk"]: r["compile_ms"] for r in rows if r["b"] == b and r["part"] == "verify"}
        full = max(windows)
        for tiers in TIERINGS:
            if not set(tiers) <= set(ms):
                continue
            entry: dict[str, Any] = {"b": b, "tiers": "/".join(map(str, tiers)), "graphs": len(tiers) * n_sizes,
                                     "capture_s": sum(capture_s[t] for t in tiers)}
            for label, top in (("all", full - N), ("le256", 256 - N)):
                lengths = range(1, top + 1)
                mean = sum(ms[tier_of(n + N, tiers)] for n in lengths) / len(lengths)
                entry[f"mean_ms_{label}"] = mean
                entry[f"x_full_{label}"] = ms[full] / mean
            out.append(entry)
    return out


def matmul_floor_rows(target: Any, batches: list[int], repeats: int = 200) -> list[dict[str, Any]]:
    """Milliseconds of the target's linear layers alone (every ``nn.Linear``, float64) at a
    verify's b x N tokens: the part of a verify that no graph removes, which the eager and the
    graphed engine both run (median of ``repeats`` passes after 20 warm-up passes)."""
    layers = [m for m in target.modules() if isinstance(m, torch.nn.Linear)]
    rows = []
    for b in batches:
        xs = [torch.randn(b * N, m.in_features, dtype=m.weight.dtype) for m in layers]
        times = []
        with torch.no_grad():
            for i in range(20 + repeats):
                start = time.perf_counter()
                for m, x in zip(layers, xs):
                    torch.nn.functional.linear(x, m.weight, m.bias)
                if i >= 20:
                    times.append(time.perf_counter() - start)
        times.sort()
        rows.append({"b": b, "tokens": b * N, "layers": len(layers), "matmul_floor_ms": times[len(times) // 2] * 1e3})
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--json")
    p.add_argument("--windows", type=int, nargs="+", default=list(WINDOWS))
    p.add_argument("--batch", type=int, nargs="+", default=list(SIZES))
    p.add_argument("--no-raw", action="store_true", help="skip raw torch.compile (one compile per shape)")
    p.add_argument("--no-extend", action="store_true")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--inner", type=int, default=5)
    p.add_argument("--threads", type=int, help="intra-op threads (default: torch's)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--floor-only", action="store_true",
                   help="only part 4: the target's linear layers alone at each b's verify tokens")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.floor_only:
        target, _ = default_models()
        floor = matmul_floor_rows(target, sorted(set(a.batch)))
        return emit("verify", floor, ["b", "tokens", "layers", "matmul_floor_ms"],
                    {"n": N, "threads": torch.get_num_threads()}, a.json)
    if a.quick:
        a.windows, a.batch, a.no_raw, a.repeats, a.inner = [128], [1], True, 3, 3
    if not compiler_available():
        raise SystemExit("bench_verify: no C++ compiler for inductor")
    if any(b not in SIZES for b in a.batch):
        raise SystemExit(f"--batch {a.batch}: each must be a capture size {SIZES}")
    windows = tuple(sorted(a.windows))
    sizes = tuple(sorted(set(a.batch)))  # captured sizes: the timed ones only
    gen = torch.Generator().manual_seed(0)
    target, head = default_models()
    vocab, dim = target.vocab_size, target.hidden_size
    cache = target.new_cache(SLOTS)
    _fill((*cache.k, *cache.v), gen)
    rows: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []
    tree_pad = {"tree_mask": True}  # pad rows attend to themselves (no all-masked softmax)
    parts = [("verify", [_case(lk, verify_step(target, cache, lk), verify_inputs(max(SIZES), lk, vocab, gen), sizes,
                               tree_pad) for lk in windows],
              lambda lk, b: verify_inputs(b, lk, vocab, gen))]
    if not a.no_extend:
        head.allocate_cache(SLOTS)
        _fill((*head.cache.k, *head.cache.v), gen)
        lk = EXTEND_WINDOW
        parts.append(("extend", [_case(lk, extend_step(head, lk), extend_inputs(max(SIZES), lk, dim, vocab, gen),
                                       sizes, {})],
                      lambda lk, b: extend_inputs(b, lk, dim, vocab, gen)))
    capture_s = {c.lk: c.capture_s["compile"] for c in parts[0][1]}
    for part, cases, fresh in parts:
        for b in a.batch:
            measured = _measure(cases, b, lambda lk, b=b, f=fresh: f(lk, b), not a.no_raw, a.repeats, a.inner)
            for case in cases:
                samples, exact, compile_s = measured[case.lk]
                rows.append(_row(part, b, case.lk, samples, exact, compile_s, case.managers))
                records += _records(part, b, case.lk, samples)
    tiers = tiering_rows(rows, windows, capture_s, len(sizes))
    floor = matmul_floor_rows(target, sorted(set(a.batch)), repeats=max(20, a.repeats * 5))
    _print_table("the target's linear layers alone (part of every verify, graphed or not)", floor,
                 ["b", "tokens", "layers", "matmul_floor_ms"])
    cols = ["part", "b", "lk", "eager_ms", "torch_compile_ms", "trace_ms", "compile_ms", "x_torch_compile",
            "x_trace", "x_compile", "compile_engine", "bitwise_compile", "bitwise_torch_compile", "diff_torch_compile",
            "first_equal"]
    _print_table("kv tiers (compile backend; x_full: full-cache verify / this)", tiers,
                 ["b", "tiers", "graphs", "capture_s", "mean_ms_all", "x_full_all", "mean_ms_le256", "x_full_le256"])
    extra = {"n": N, "sizes": list(sizes), "windows": list(windows), "extend_window": EXTEND_WINDOW,
             "threads": torch.get_num_threads(), "repeats": a.repeats, "inner": a.inner,
             "capture_s": capture_s, "tiers": tiers, "matmul_floor": floor, "reduce": "median of interleaved rounds",
             "records": records}
    return emit("verify", rows, cols, extra, a.json)


def _print_table(title: str, rows: list[dict[str, Any]], cols: list[str]) -> None:
    def fmt(v: Any) -> str:
        return f"{v:.3g}" if isinstance(v, float) else "-" if v is None else str(v)

    if not rows:
        return
    widths = {c: max(len(c), *(len(fmt(r.get(c))) for r in rows)) for c in cols}
    print(f"\n== {title} ==")
    print("  ".join(c.rjust(widths[c]) for c in cols))
    for r in rows:
        print("  ".join(fmt(r.get(c)).rjust(widths[c]) for c in cols))


def _records(part: str, b: int, lk: int, s: dict[str, Any]) -> list[dict[str, Any]]:
    """Verdict-free summary records: ms per call of each path, its speedup over eager."""
    out = []
    for name, sample in s.items():
        ratios = {} if name == "eager" else {"eager/this": s["eager"] / sample}
        out.append(record("verify", f"{part} b={b} lk={lk} {name}", {"part": part, "b": b, "lk": lk, "n": N},
                          "ms_per_call", sample, backend="torch.compile" if name == "torch_compile" else name,
                          scale=1e3, ratios=ratios))
    return out


if __name__ == "__main__":
    main()
