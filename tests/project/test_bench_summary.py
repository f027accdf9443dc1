"""`make bench QUICK=1`: every benchmark runs once, small, and bench-results/summary.json keeps
its schema (one record per case with machine, torch, backend, params, median and spread,
ratios and target verdicts). Timings are not checked; the schema check is tested on its own."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCHES = {"bench_engine": "engine", "bench_organize": "organize", "bench_graphs": "graphs",
           "bench_replay": "replay", "bench_reload": "reload", "bench_topology": "topology",
           "bench_ranks": "ranks", "bench_soak": "soak", "bench_compile": "compile", "bench_refit": "refit",
           "bench_profile": "profile",
           "bench_metrics": "metrics", "bench_schedule": "schedule", "bench_ready": "ready",
           "bench_verify": "verify", "bench_step_graphs": "step_graphs", "bench_hf": "hf", "bench_real": "hf_real",
           "bench_serve": "serve",
           "bench_load": "load"}


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _summary_module():
    return _script("bench_summary")


def test_sample_keeps_its_measurements_and_reports_their_spread() -> None:
    bu = _script("benchutil")
    s = bu.Sample([5.0, 1.0, 3.0, 2.0, 4.0])
    assert float(s) == 3.0 and s.values == (5.0, 1.0, 3.0, 2.0, 4.0)
    assert type(s * 2.0) is float and s * 2.0 == 6.0
    # quartiles by the exclusive method: positions (n+1)/4 and 3(n+1)/4 of the sorted values
    assert bu.spread(s.values) == {"min": 1.0, "p25": 1.5, "p75": 4.5, "max": 5.0, "n": 5}
    assert bu.spread([7.0]) == {"min": 7.0, "p25": 7.0, "p75": 7.0, "max": 7.0, "n": 1}
    with pytest.raises(ValueError, match="at least one"):
        bu.Sample([])
    rec = bu.record("x", "c", {}, "us", s, backend="eager", scale=10.0, ratios={"r": 1, "skip": None})
    assert rec["median"] == 30.0 and rec["spread"]["max"] == 50.0 and rec["ratios"] == {"r": 1.0}


@pytest.mark.parametrize("value, op, limit, met", [
    (1.4, "<=", 1.5, True), (1.6, "<=", 1.5, False), (15.0, ">=", 15, True), (14.9, ">=", 15, False),
    (0, "==", 0, True), (1, "==", 0, False)])
def test_target_verdicts(value, op, limit, met) -> None:
    t = _script("benchutil").target("t", value, op, limit)
    assert t["met"] is met and (t["value"], t["op"], t["limit"]) == (value, op, limit)


def test_target_rejects_an_unknown_operator() -> None:
    with pytest.raises(ValueError, match="op='<'"):
        _script("benchutil").target("t", 1.0, "<", 2.0)


def _valid_doc() -> dict:
    """A small summary written by hand: one benchmark, two records."""
    rec = {"benchmark": "organize", "case": "b=1 S=3 fast", "backend": "eager",
           "params": {"b": 1, "S": 3}, "metric": "us_per_call", "median": 3.0,
           "spread": {"min": 2.0, "p25": 2.5, "p75": 3.5, "max": 4.0, "n": 5},
           "ratios": {"fast/bare": 0.8},
           "targets": [{"name": "fast <= 1.5x bare", "value": 0.8, "op": "<=", "limit": 1.5, "met": True}],
           "machine": "cpu (2 cores)", "torch": "2.14.1"}
    other = dict(rec, case="b=1 S=3 bare", median=4.0, ratios={}, targets=[])
    return {"schema": 1, "created": "2026-12-03T00:00:00+00:00", "quick": True,
            "machine": {"cpu": "cpu", "cores": 2}, "command": "python -m scripts.bench_all --quick",
            "benchmarks": {"bench_organize": {"name": "organize", "status": "ok"}},
            "records": [rec, other]}


def test_schema_check_accepts_a_valid_summary() -> None:
    _summary_module().validate_summary(_valid_doc())


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["records"][0].pop("median"), "missing 'median'"),
    (lambda d: d["records"][0].update(backend=None), "backend=None"),
    (lambda d: d["records"][0]["targets"][0].update(met=False), "contradicts"),
    (lambda d: d["records"][0]["targets"][0].update(op="<"), "op='<'"),
    (lambda d: d["records"][0]["spread"].update(p25=3.9), "out of order"),
    (lambda d: d["records"][0].update(median=9.0), "out of order"),
    (lambda d: d["records"][0]["spread"].update(n=0), "n >= 1"),
    (lambda d: d["records"][1].update(case="b=1 S=3 fast"), "duplicate case"),
    (lambda d: d["records"][0]["ratios"].update(x="fast"), "expected a number"),
    (lambda d: d.update(records=[]), "ran but wrote no record"),
    (lambda d: d["benchmarks"].update(bench_x={"status": "maybe"}), "needs a status"),
    (lambda d: d.update(schema=2), "schema=2"),
    (lambda d: d.pop("machine"), "missing 'machine'"),
])
def test_schema_check_names_what_is_wrong(mutate, message) -> None:
    doc = copy.deepcopy(_valid_doc())
    mutate(doc)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        _summary_module().validate_summary(doc)


@pytest.mark.slow  # the slow tier: the benchmark smoke (make bench QUICK=1), minutes
def test_quick_bench_writes_a_summary_of_every_benchmark(tmp_path) -> None:
    out = tmp_path / "bench"
    try:
        proc = subprocess.run([sys.executable, "-m", "scripts.bench_all", "--quick",
                               "--out", str(out)], cwd=ROOT, capture_output=True,
                              text=True, timeout=1200)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"bench_all --quick did not finish in {exc.timeout} s")
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads((out / "summary.json").read_text())
    _summary_module().validate_summary(doc)  # raises naming every departure
    assert doc["quick"] is True
    assert {k: v["status"] for k, v in doc["benchmarks"].items()} == dict.fromkeys(BENCHES, "ok")
    by_bench: dict[str, list[dict]] = {}
    for rec in doc["records"]:
        by_bench.setdefault(rec["benchmark"], []).append(rec)
        assert rec["torch"] == doc["machine"]["torch"]
        assert rec["machine"] in (doc["machine"]["gpu"], f"{doc['machine']['cpu']} ({doc['machine']['cores']} cores)")
    assert set(by_bench) == set(BENCHES.values())
    # the cases the README's tables and plots are drawn from are all there
    engine = {(r["params"]["config"], r["params"]["requests"]) for r in by_bench["engine"]}
    assert {("greedy", 1), ("chain S=3", 1), ("static N=7", 4), ("multi-layer S=3", 4)} <= engine
    organize = {r["params"]["variant"] for r in by_bench["organize"]}
    assert {"fast", "static", "general", "bare"} <= organize
    if importlib.util.find_spec("sglang") is not None or os.environ.get("DRAFTGRAPH_REQUIRE_SGLANG") == "1":
        assert "sglang" in organize
    assert {r["params"]["policy"] for r in by_bench["reload"] if "policy" in r["params"]} == {
        "swap", "release_first"}
    stated = {t["name"] for r in doc["records"] for t in r["targets"]}
    for name in ("manager overhead <= 1.5x copy floor", "worker overhead <= 10% of run",
                 "switch under 50 us", "coordinator adds <= 5% to an engine step (poll_every 8)",
                 "chain S=3, 1 request, faster backend >= 1.3x greedy", "registered step <= 1.02x plain step"):
        assert name in stated, f"target {name!r} missing from the summary"
    # the one table lists every record and the count of targets met
    total = sum(len(r["targets"]) for r in doc["records"])
    assert f"of {total} met" in proc.stdout
    assert (out / "bench_engine.json").exists() and (out / "bench_ranks.log").exists()
