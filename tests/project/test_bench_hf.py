"""`scripts/bench_hf.py --quick` (the smoke run): every system's row, each output identical to the
embedded target's greedy tokens, the targets stated, in well under a minute."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("trained_models")

ROOT = Path(__file__).resolve().parents[2]
SYSTEMS = {"generate", "generate static", "generate f32", "assisted", "prompt lookup", "draftgraph eager",
           "draftgraph graphs"}


def test_quick_bench_hf(tmp_path: Path) -> None:
    out = tmp_path / "bench_hf.json"
    proc = subprocess.run([sys.executable, "-m", "scripts.bench_hf", "--quick", "--json", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    rows = doc["rows"]
    assert {(r["system"], r["requests"]) for r in rows} == {(s, c) for s in SYSTEMS for c in (1, 4)}
    assert all(r["identical_to_greedy"] for r in rows), [r["system"] for r in rows if not r["identical_to_greedy"]]
    assert all(r["tokens_per_s"] > 0 for r in rows)
    assert len(doc["targets"]) == 3 and all("met" in v for v in doc["targets"].values())
    assert doc["sequential_at_4"] == ["assisted", "prompt lookup"]
