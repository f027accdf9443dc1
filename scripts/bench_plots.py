"""The plots of docs/performance.md, drawn from a benchmark summary (``make bench`` then ``make plots``).

Writes PNGs (matplotlib, the optional ``bench`` extra) into ``--out`` (default docs/):

- ``organize.png``: organize time vs batch size per S (fast path, static tree, general path,
  SGLang's organize, bare slice), log scales;
- ``replay.png``: draft step, graph replay vs eager per batch size (chain and tree);
- ``reload.png``: reload time and peak memory per policy;
- ``engine.png``: engine tokens/s and acceptance length per configuration vs greedy.

Error bars are the quartiles over the repeats. Each figure is titled with the machine, the torch
version and the date of the summary.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

__all__ = ["draw_all"]


def _records(doc: dict[str, Any], benchmark: str) -> list[dict[str, Any]]:
    return [r for r in doc["records"] if r["benchmark"] == benchmark]


def _err(recs: list[dict[str, Any]]) -> list[list[float]]:
    """Asymmetric error bars (median - p25, p75 - median)."""
    return [[r["median"] - r["spread"]["p25"] for r in recs], [r["spread"]["p75"] - r["median"] for r in recs]]


def _stamp(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    where = m.get("gpu") or f"{m['cpu']}, {m['cores']} cores"
    return f"{where}; torch {m['torch']}; {doc['created'][:10]}" + ("; QUICK" if doc["quick"] else "")


def _finish(fig: Any, plt: Any, path: str, title: str, doc: dict[str, Any],
            rect: tuple[float, ...] | None = None) -> None:
    """Title the figure with what ran it, lay it out, write it, free it."""
    fig.suptitle(f"{title} ({_stamp(doc)})", fontsize=9)
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def organize(doc: dict[str, Any], plt: Any, path: str) -> None:
    recs = _records(doc, "organize")
    steps = sorted({r["params"]["S"] for r in recs})
    fig, axes = plt.subplots(1, len(steps), figsize=(4.2 * len(steps), 3.8), sharey=True, squeeze=False)
    labels = {"fast": "chain fast path", "static": "static tree", "general": "general path",
              "sglang": "SGLang organize", "bare": "bare slice"}
    for ax, s in zip(axes[0], steps):
        for variant, label in labels.items():
            pts = sorted((r for r in recs if r["params"]["S"] == s and r["params"]["variant"] == variant),
                         key=lambda r: r["params"]["b"])
            if pts:
                ax.errorbar([r["params"]["b"] for r in pts], [r["median"] for r in pts], yerr=_err(pts),
                            marker="o", capsize=2, label=label)
        ax.set(xscale="log", yscale="log", xlabel="batch size", title=f"S = {s}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("µs per call")
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=len(names), fontsize=8)
    _finish(fig, plt, path, "Organize a draft step: time vs batch size", doc, rect=(0, 0.08, 1, 1))


def replay(doc: dict[str, Any], plt: Any, path: str) -> None:
    recs = [r for r in _records(doc, "graphs") if "b" in r["params"] and "replay" in r["params"]]
    kinds = sorted({r["params"]["kind"] for r in recs})
    fig, axes = plt.subplots(1, len(kinds), figsize=(5.2 * len(kinds), 3.8), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        modes = sorted({r["params"]["replay"] for r in recs if r["params"]["kind"] == kind})
        for mode in modes:
            pts = sorted((r for r in recs if r["params"]["kind"] == kind and r["params"]["replay"] == mode),
                         key=lambda r: r["params"]["b"])
            ax.errorbar([r["params"]["b"] for r in pts], [r["median"] for r in pts], yerr=_err(pts),
                        marker="o", capsize=2, label=mode)
        p0 = next(r["params"] for r in recs if r["params"]["kind"] == kind)
        ax.set(xscale="log", xlabel="batch size", ylabel="µs per draft step",
               title=f"{kind} (S={p0['S']}, topk={p0['topk']})")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    _finish(fig, plt, path, "Whole draft step: captured graph replay vs eager", doc)


def reload(doc: dict[str, Any], plt: Any, path: str) -> None:
    recs = [r for r in _records(doc, "reload") if "policy" in r["params"]]
    names = [r["params"]["policy"] for r in recs]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.6))
    a1.bar(names, [r["median"] for r in recs], yerr=_err(recs), capsize=4, color="tab:blue")
    a1.set(ylabel="seconds per reload (recapture included)", title="reload time")
    mem_key = "cuda_peak_delta_mib" if all("cuda_peak_delta_mib" in r["ratios"] for r in recs) else None
    x = range(len(recs))
    a2.bar([i - 0.2 for i in x], [r["ratios"]["state_bytes_peak_kib"] for r in recs], width=0.4,
           label="peak bytes owned by states (KiB)")
    other = mem_key or "rss_peak_delta_mib"
    a2.bar([i + 0.2 for i in x], [r["ratios"][other] * 1024 for r in recs], width=0.4,
           label=f"{other.replace('_mib', '')} (KiB)")
    a2.set_xticks(list(x), names)
    a2.set(title="peak memory during a reload")
    a2.legend(fontsize=8)
    _finish(fig, plt, path, "Reload (recapture) per policy", doc)


def engine(doc: dict[str, Any], plt: Any, path: str) -> None:
    recs = _records(doc, "engine")
    conc = sorted({r["params"]["requests"] for r in recs})
    cases = []
    for r in recs:
        key = (r["params"]["config"], r["backend"])
        if key not in cases:
            cases.append(key)
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    width = 0.8 / len(conc)
    for j, c in enumerate(conc):
        pts = [next((r for r in recs if (r["params"]["config"], r["backend"]) == k
                     and r["params"]["requests"] == c), None) for k in cases]
        xs = [i + (j - (len(conc) - 1) / 2) * width for i in range(len(cases))]
        ok = [(x, r) for x, r in zip(xs, pts) if r is not None]
        a1.bar([x for x, _ in ok], [r["median"] for _, r in ok], width=width, yerr=_err([r for _, r in ok]),
               capsize=2, label=f"{c} request{'s' if c > 1 else ''}")
        a2.bar([x for x, _ in ok], [r["ratios"]["accept_length"] for _, r in ok], width=width)
        for x, r in ok:
            a1.annotate(f"{r['ratios']['speedup']:.2f}x", (x, r["median"]), ha="center", va="bottom",
                        fontsize=6)
    a1.set(ylabel="tokens / s")
    a1.legend(fontsize=8)
    a1.grid(True, axis="y", alpha=0.3)
    a2.set(ylabel="acceptance length")
    a2.grid(True, axis="y", alpha=0.3)
    a2.set_xticks(range(len(cases)), [f"{c}\n{b}" if c != "greedy" else "greedy" for c, b in cases],
                  fontsize=7)
    _finish(fig, plt, path, "Engine on the default models, lossless vs greedy (speedup over greedy on bars)",
            doc)


def draw_all(doc: dict[str, Any], out: str) -> list[str]:
    """Draw every plot of ``doc`` into ``out``; the paths written."""
    try:
        import matplotlib
    except ImportError as exc:
        raise SystemExit("bench_plots: matplotlib is missing; pip install -e '.[bench]' "
                         "(or `make plots`, which installs it)") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out, exist_ok=True)
    written = []
    for name, fn in (("organize", organize), ("replay", replay), ("reload", reload), ("engine", engine)):
        bench = "graphs" if name == "replay" else name
        if not _records(doc, bench):
            continue
        path = os.path.join(out, f"{name}.png")
        fn(doc, plt, path)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("summary", nargs="?", default="bench-results/summary.json")
    p.add_argument("--out", default="docs")
    a = p.parse_args(argv)
    with open(a.summary) as f:
        doc = json.load(f)
    for path in draw_all(doc, a.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
