"""`make bench`: every benchmark in one run, JSON of each into bench-results/ (or --out)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

BENCHES = ("bench_engine", "bench_organize", "bench_graphs", "bench_replay", "bench_reload",
           "bench_topology", "bench_ranks")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default="bench-results")
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    failed = []
    for name in BENCHES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            print(f"{name}: not available ({exc})", file=sys.stderr)
            continue
        argv = ["--json", os.path.join(a.out, f"{name}.json")] + (["--quick"] if a.quick else [])
        try:
            mod.main(argv)
        except Exception as exc:  # report and go on: one broken bench should not hide the others
            print(f"{name} failed: {exc!r}", file=sys.stderr)
            failed.append(name)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
