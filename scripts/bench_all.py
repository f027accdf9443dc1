"""`make bench`: every benchmark in one run (fixed seeds), each one's JSON and log into
bench-results/ (or --out), then `summary.json` (one record per case, see bench_summary.py) and
one table. ``--quick`` (``make bench QUICK=1``) runs each benchmark once, small: the CI smoke."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import json
import os
import subprocess
import sys
import time

if __name__ == "__main__" and not __package__:
    # Run as a file (`python scripts/bench_all.py`, as `draftgraph bench` does): run it again as
    # the module `scripts.bench_all`, with the checkout on PYTHONPATH and the caller's directory
    # kept, so the package imports below resolve and --out stays relative to where it was asked.
    _root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    _path = os.pathsep.join(filter(None, (_root, os.environ.get("PYTHONPATH"))))
    sys.exit(subprocess.call([sys.executable, "-m", "scripts.bench_all", *sys.argv[1:]],
                             env=dict(os.environ, PYTHONPATH=_path)))

from scripts.bench_summary import SCHEMA_VERSION, table, validate_summary  # noqa: E402
from scripts.benchutil import machine_info  # noqa: E402

BENCHES = ("bench_engine", "bench_organize", "bench_graphs", "bench_replay", "bench_reload",
           "bench_topology", "bench_ranks", "bench_soak", "bench_compile", "bench_refit",
           "bench_profile", "bench_metrics", "bench_schedule", "bench_ready", "bench_verify",
           "bench_step_graphs", "bench_hf", "bench_real", "bench_serve", "bench_load")


def _machine_label(m: dict) -> str:
    return m["gpu"] or f"{m['cpu']} ({m['cores']} cores)"


def run_one(name: str, out: str, quick: bool) -> tuple[dict, list[dict]]:
    """Run one benchmark module with its output in ``out/name.log``; (status entry, records)."""
    log = os.path.join(out, f"{name}.log")
    info: dict = {"name": name, "status": "ok", "json": os.path.join(out, f"{name}.json"), "log": log}
    try:
        mod = importlib.import_module(f"scripts.{name}")
    except ModuleNotFoundError as exc:
        info.update(status="unavailable", error=repr(exc))
        return info, []
    argv = ["--json", info["json"]] + (["--quick"] if quick else [])
    start = time.perf_counter()
    try:
        with open(log, "w") as f, contextlib.redirect_stdout(f):
            doc = mod.main(argv)
    except Exception as exc:  # report and go on: one broken bench should not hide the others
        info.update(status="failed", error=repr(exc))
        return info, []
    finally:
        info["seconds"] = round(time.perf_counter() - start, 1)
    records = list(doc.get("records", []))
    if records:
        info["name"] = records[0]["benchmark"]
    return info, records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default="bench-results")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", nargs="+", choices=BENCHES, default=None, help="run these only")
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    machine = machine_info()
    label = _machine_label(machine)
    summary = {"schema": SCHEMA_VERSION, "created": datetime.datetime.now(datetime.timezone.utc)
               .isoformat(timespec="seconds"), "quick": a.quick, "machine": machine,
               "command": "python -m scripts.bench_all" + (" --quick" if a.quick else ""),
               "benchmarks": {}, "records": []}
    for name in a.only or BENCHES:
        print(f"{name} ...", file=sys.stderr, flush=True)
        info, records = run_one(name, a.out, a.quick)
        print(f"{name}: {info['status']} in {info.get('seconds', 0)} s, {len(records)} records"
              + (f" ({info['error']})" if "error" in info else ""), file=sys.stderr, flush=True)
        summary["benchmarks"][name] = info
        for rec in records:
            rec.update(machine=label, torch=machine["torch"])
        summary["records"] += records
    validate_summary(summary)
    path = os.path.join(a.out, "summary.json")
    with open(path, "w") as f:
        json.dump(summary, f, indent=1)
    print(table(summary))
    print(f"\nsummary: {path} ({len(summary['records'])} records; machine: {label}; "
          f"torch {machine['torch']}; {summary['created']})")
    return 1 if any(i["status"] == "failed" for i in summary["benchmarks"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
