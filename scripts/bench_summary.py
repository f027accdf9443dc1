"""The benchmark summary (`bench-results/summary.json`): its schema check, its table, and a
Markdown rendering for the README.

One record per case (see ``benchutil.record``): benchmark, case, backend, params, metric,
median and spread over the repeats, the ratios the targets are stated in, the targets with
their verdicts, and the machine and torch version that ran it. ``python -m scripts.bench_summary
[summary.json] [--markdown]`` prints the table (or Markdown) of a written summary.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["SCHEMA_VERSION", "validate_summary", "table", "markdown"]

SCHEMA_VERSION = 1
_RECORD = {"benchmark": str, "case": str, "backend": str, "params": dict, "metric": str,
           "median": float, "spread": dict, "ratios": dict, "targets": list, "machine": str,
           "torch": str}
_SPREAD = ("min", "p25", "p75", "max", "n")
_TARGET = {"name": str, "value": float, "op": str, "limit": float, "met": bool}
_TOP = {"schema": int, "created": str, "quick": bool, "machine": dict, "command": str,
        "benchmarks": dict, "records": list}


def _is(value: Any, kind: type) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def validate_summary(doc: Any) -> None:
    """Raise ValueError listing every way ``doc`` departs from the summary schema (types,
    spread order, target verdicts that contradict their value, duplicate cases, a benchmark
    that ran without records)."""
    errors: list[str] = []
    if not isinstance(doc, dict):
        raise ValueError(f"summary: {type(doc).__name__}, expected an object")
    for key, kind in _TOP.items():
        if key not in doc:
            errors.append(f"summary: missing {key!r}")
        elif not _is(doc[key], kind):
            errors.append(f"summary.{key}={doc[key]!r}: expected {kind.__name__}")
    if errors:
        raise ValueError("; ".join(errors))
    if doc["schema"] != SCHEMA_VERSION:
        errors.append(f"summary.schema={doc['schema']}: expected {SCHEMA_VERSION}")
    seen: set[tuple[str, str]] = set()
    for i, rec in enumerate(doc["records"]):
        where = f"records[{i}]"
        if not isinstance(rec, dict):
            errors.append(f"{where}: expected an object")
            continue
        for key, kind in _RECORD.items():
            if key not in rec:
                errors.append(f"{where}: missing {key!r}")
            elif not _is(rec[key], kind):
                errors.append(f"{where}.{key}={rec[key]!r}: expected {kind.__name__}")
        if any(e.startswith(where) for e in errors):
            continue
        where = f"{where} ({rec['benchmark']}: {rec['case']})"
        if (rec["benchmark"], rec["case"]) in seen:
            errors.append(f"{where}: duplicate case")
        seen.add((rec["benchmark"], rec["case"]))
        sp = rec["spread"]
        if not all(_is(sp.get(k), float) for k in _SPREAD) or not _is(sp["n"], int) or sp["n"] < 1:
            errors.append(f"{where}.spread={sp!r}: needs numbers min, p25, p75, max and n >= 1")
        elif not sp["min"] <= sp["p25"] <= sp["p75"] <= sp["max"] or not sp["min"] <= rec["median"] <= sp["max"]:
            errors.append(f"{where}: spread {sp!r} and median {rec['median']} out of order")
        for name, value in rec["ratios"].items():
            if not _is(value, float):
                errors.append(f"{where}.ratios[{name!r}]={value!r}: expected a number")
        for j, t in enumerate(rec["targets"]):
            bad = [k for k, kind in _TARGET.items() if not isinstance(t, dict) or not _is(t.get(k), kind)]
            if bad:
                errors.append(f"{where}.targets[{j}]: bad or missing {bad}")
                continue
            ops = {"<=": t["value"] <= t["limit"], ">=": t["value"] >= t["limit"],
                   "==": t["value"] == t["limit"]}
            if t["op"] not in ops:
                errors.append(f"{where}.targets[{j}].op={t['op']!r}: expected one of {sorted(ops)}")
            elif ops[t["op"]] != t["met"]:
                errors.append(f"{where}.targets[{j}]: met={t['met']} contradicts "
                              f"{t['value']} {t['op']} {t['limit']}")
    for name, info in doc["benchmarks"].items():
        if not isinstance(info, dict) or info.get("status") not in ("ok", "failed", "unavailable"):
            errors.append(f"benchmarks[{name!r}]={info!r}: needs a status ok/failed/unavailable")
        elif info["status"] == "ok" and not any(r.get("benchmark") == info.get("name", name)
                                                for r in doc["records"] if isinstance(r, dict)):
            errors.append(f"benchmarks[{name!r}]: ran but wrote no record")
    if errors:
        raise ValueError("; ".join(errors))


def _fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1e5 else f"{v:.3e}"


def _ratios(rec: dict[str, Any], limit: int = 2) -> str:
    keys = [k for k in rec["ratios"] if k not in ("compute_ops", "nodes", "nodes_no_organize")]
    return ", ".join(f"{k}={_fmt(rec['ratios'][k])}" for k in keys[:limit])


def _verdict(rec: dict[str, Any]) -> str:
    if not rec["targets"]:
        return ""
    met = sum(t["met"] for t in rec["targets"])
    return "met" if met == len(rec["targets"]) else f"MISSED {len(rec['targets']) - met}/{len(rec['targets'])}"


def table(doc: dict[str, Any]) -> str:
    """One plain-text table of every record, then the list of targets missed."""
    head = ("benchmark", "case", "backend", "metric", "median", "p25-p75", "ratios", "targets")
    rows = [(r["benchmark"], r["case"], r["backend"], r["metric"], _fmt(r["median"]),
             f"{_fmt(r['spread']['p25'])}-{_fmt(r['spread']['p75'])}", _ratios(r), _verdict(r))
            for r in doc["records"]]
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    missed = [(r, t) for r in doc["records"] for t in r["targets"] if not t["met"]]
    total = sum(len(r["targets"]) for r in doc["records"])
    lines.append(f"targets: {total - len(missed)} of {total} met")
    lines += [f"  MISSED {r['benchmark']} / {r['case']}: {t['name']} ({_fmt(t['value'])} {t['op']} "
              f"{_fmt(t['limit'])})" for r, t in missed]
    return "\n".join(lines)


def markdown(doc: dict[str, Any], benchmark: str | None = None) -> str:
    """The records (of one benchmark, or all) as a Markdown table."""
    recs = [r for r in doc["records"] if benchmark in (None, r["benchmark"])]
    lines = ["| benchmark | case | backend | metric | median | p25-p75 (n) | ratios | targets |",
             "|---|---|---|---|---|---|---|---|"]
    for r in recs:
        sp = r["spread"]
        lines.append(f"| {r['benchmark']} | {r['case']} | {r['backend']} | {r['metric']} | "
                     f"{_fmt(r['median'])} | {_fmt(sp['p25'])}-{_fmt(sp['p75'])} ({sp['n']}) | "
                     f"{_ratios(r, 3)} | {_verdict(r)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("summary", nargs="?", default="bench-results/summary.json")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--benchmark", default=None)
    a = p.parse_args(argv)
    with open(a.summary) as f:
        doc = json.load(f)
    validate_summary(doc)
    print(markdown(doc, a.benchmark) if a.markdown else table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
