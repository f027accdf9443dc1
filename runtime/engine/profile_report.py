"""What a profiled run's trace says, per range name and per step: read from the trace's events.

`trace_ranges` picks draftgraph's ranges out of a Chrome trace's events (spans-only traces: category
``draftgraph``; torch-profiler traces: ``user_annotation`` events whose label a span used);
`range_table` gives per range name calls, total / mean / p50 / p99 ms and the share of the
``step`` ranges' time; `step_stages` gives each ``step`` range's stage times; `format_table`
prints the table; `write_stage_plot` draws ``stages.svg`` when matplotlib is installed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from typing import Any

from .stats import STAGES

__all__ = ["base_name", "format_table", "label_attrs", "range_table", "step_stages", "trace_ranges",
           "write_stage_plot"]

logger = logging.getLogger(__name__)


def base_name(label: str) -> str:
    """``replay[bs=3,padded=4]`` -> ``replay``."""
    return label.split("[", 1)[0]


def label_attrs(label: str) -> dict[str, str]:
    """``step[i=3,bs=4]`` -> ``{"i": "3", "bs": "4"}`` (values as text)."""
    if "[" not in label or not label.endswith("]"):
        return {}
    inner = label[label.index("[") + 1:-1]
    return dict(kv.split("=", 1) for kv in inner.split(",") if "=" in kv)


def trace_ranges(events: Iterable[dict[str, Any]], labels: set[str] | None = None) -> list[dict[str, Any]]:
    """draftgraph's complete events (``ph`` "X") in ``events``, by start time: category
    ``draftgraph``, or ``user_annotation`` with a label in ``labels`` (the span labels seen while
    a torch profiler recorded; None takes every user annotation)."""
    out = []
    for e in events:
        if e.get("ph") != "X":
            continue
        cat = e.get("cat")
        if cat == "draftgraph" or (cat == "user_annotation" and (labels is None or e.get("name") in labels)):
            out.append(e)
    out.sort(key=lambda e: (float(e["ts"]), -float(e["dur"])))
    return out


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), q in [0, 1]."""
    pos = q * (len(sorted_values) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def range_table(ranges: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per range name (labels grouped by name): calls, total_ms, mean_ms, p50_ms, p99_ms and
    share (total over the ``step`` ranges' total; 0 without step ranges). Ordered: ``step``,
    the stages in step order, then the other names by total time."""
    durs: dict[str, list[float]] = {}
    for e in ranges:
        durs.setdefault(base_name(e["name"]), []).append(float(e["dur"]) / 1e3)
    step_total = sum(durs.get("step", []))
    table: dict[str, dict[str, float]] = {}
    order = [n for n in ("step", *STAGES) if n in durs]
    order += sorted((n for n in durs if n not in order), key=lambda n: -sum(durs[n]))
    for name in order:
        v = sorted(durs[name])
        total = sum(v)
        table[name] = {"calls": len(v), "total_ms": total, "mean_ms": total / len(v),
                       "p50_ms": _percentile(v, 0.5), "p99_ms": _percentile(v, 0.99),
                       "share": total / step_total if step_total else 0.0}
    return table


def step_stages(ranges: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each ``step`` range: its index (from the label), ms, and per stage the ms of the stage
    ranges it holds (same thread, inside its time)."""
    steps = []
    for j, e in enumerate(ranges):  # ranges are sorted by start: scan forward to the step's end
        if base_name(e["name"]) != "step":
            continue
        t1 = float(e["ts"]) + float(e["dur"])
        stages = {s: 0.0 for s in STAGES}
        for c in ranges[j + 1:]:
            if float(c["ts"]) > t1:
                break
            name = base_name(c["name"])
            if name in stages and c.get("tid") == e.get("tid") and float(c["ts"]) + float(c["dur"]) <= t1:
                stages[name] += float(c["dur"]) / 1e3
        index = label_attrs(e["name"]).get("i")
        steps.append({"i": int(index) if index is not None else len(steps), "label": e["name"],
                      "ms": float(e["dur"]) / 1e3, "stages_ms": stages})
    return steps


def format_table(table: dict[str, dict[str, float]]) -> str:
    """The range table as text, one line per range name."""
    head = f"{'range':<16} {'calls':>6} {'total ms':>10} {'mean ms':>9} {'p50 ms':>9} {'p99 ms':>9} {'share':>7}"
    lines = [head]
    for name, r in table.items():
        lines.append(f"{name:<16} {r['calls']:>6} {r['total_ms']:>10.3f} {r['mean_ms']:>9.3f} "
                     f"{r['p50_ms']:>9.3f} {r['p99_ms']:>9.3f} {r['share']:>6.1%}")
    return "\n".join(lines)


def write_stage_plot(steps: Sequence[dict[str, Any]], path: str) -> str | None:
    """Stacked stage ms per profiled step as an SVG at ``path``; None (logged) when matplotlib
    (the ``bench`` extra) is missing or there is no step."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        logger.info("matplotlib is not installed (the bench extra): no %s", path)
        return None
    if not steps:
        return None
    fig = Figure(figsize=(max(7.0, 1.5 + 0.25 * len(steps)), 3.5))
    ax = fig.add_subplot()
    xs = list(range(len(steps)))
    bottom = [0.0] * len(steps)
    for stage in STAGES:
        ys = [s["stages_ms"][stage] for s in steps]
        if any(ys):
            ax.bar(xs, ys, bottom=bottom, label=stage, width=0.8)
            bottom = [b + y for b, y in zip(bottom, ys)]
    ax.set_xticks(xs, [str(s["i"]) for s in steps], fontsize=6)
    ax.set_xlabel("engine step")
    ax.set_ylabel("ms")
    ax.set_title("draftgraph: stage times per profiled step")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, format="svg")
    return path
