"""Prometheus metrics (issue 18): every documented series is exported with its type, scraped
values equal the simulate report, counters only go up across reloads, a released state's series
go, scraping while another thread steps and reloads is safe, several sources share a registry."""

from __future__ import annotations

import gc
import pathlib
import re
import socket
import subprocess
import sys
import threading

import pytest
import torch

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from draftgraph.runtime import (  # noqa: E402
    CudaGraphConfig,
    DraftCounters,
    EagleDraftWorker,
    PhaseGraphConfig,
    RuntimeArgs,
    SpeculativeConfig,
)
from draftgraph.runtime.prometheus import (  # noqa: E402
    register_coordinator_metrics,
    register_sglang_metrics,
    register_worker_metrics,
)
from draftgraph.runtime.ranks.coordinator import CoordinatorStats  # noqa: E402
from draftgraph.runtime.testing import TinyDraftModel, make_draft_input  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL = TinyDraftModel(vocab_size=64, hidden_size=32, seed=0)
_ROW = re.compile(r"^\|\s*`(draftgraph_[a-z0-9_]+)`\s*\|\s*(counter|gauge)\s*\|")


def documented(page: str = "docs/metrics.md") -> dict[str, str]:
    """Series name -> type, from the tables of a page (docs/metrics.md: the page operators read)."""
    text = (ROOT / page).read_text()
    return {m.group(1): m.group(2) for line in text.splitlines() if (m := _ROW.match(line))}


def scrape(registry) -> dict[str, list]:
    """Family name -> samples (names as exposed: counters with `_total`)."""
    text = generate_latest(registry).decode()
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        out.setdefault(fam.name, []).extend(fam.samples)
    return out


def types(registry) -> dict[str, str]:
    text = generate_latest(registry).decode()
    return {(f.name + "_total" if f.type == "counter" else f.name): f.type
            for f in text_string_to_metric_families(text)}


def value(samples: dict, family: str, **labels) -> float:
    """The one sample of ``family`` (without `_total`) whose labels include ``labels``."""
    found = [s.value for s in samples.get(family, []) if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (family, labels, samples.get(family))
    return found[0]


def args_for(s, n=None, bs=(1, 2, 4)):
    return RuntimeArgs(SpeculativeConfig(s, 1, n), CudaGraphConfig(PhaseGraphConfig(bs=bs)))


def worker(s=3):
    w = EagleDraftWorker(args_for(s), MODEL)
    w.capture_graphs("trace")
    return w


def drive(w, sizes, seed=0):
    for i, b in enumerate(sizes):
        w.draft_forward(make_draft_input(b, w.spec.topk, seed=seed + i))


# ---- the engine, its report and the docs ----------------------------------------------------------
@pytest.fixture(scope="module")
def simulated():
    from draftgraph.runtime.commands.simulate import SimulationConfig, run_simulation

    registry = CollectorRegistry()
    args = RuntimeArgs(SpeculativeConfig(3, 1), CudaGraphConfig(PhaseGraphConfig(max_bs=4)), max_running_requests=6)
    cfg = SimulationConfig(args=args, backend="trace", capture="blocking", requests=8, arrival=2.0,
                           adaptive_steps=(2, 3), greedy=False, progress=False, min_new=8, max_new=40)
    report = run_simulation(cfg, sighup=None, registry=registry)
    return registry, report


def phased_worker():
    """A worker whose states hold one host phase ("verify@8": a tiny step over x [rows, 4]),
    captured with trace at sizes 1, 2, 4; one replay at b=2 and one eager step above the largest."""
    from draftgraph.runtime.worker.host_phases import GraphStep

    def provider(spec, rows):
        return {"verify@8": GraphStep(lambda x: x * 2 + 1, {"x": torch.zeros(rows, 4)}, {"x": 0})}

    w = EagleDraftWorker(args_for(3), MODEL)
    w.capture.set_phase_provider(provider)
    w.capture_graphs("trace")
    phases = w.state.replayable_phases()
    manager, plan = phases.lookup("verify@8", 2)
    out = manager.replay_trusted(plan, (torch.ones(2, 4),))
    assert torch.equal(out, torch.full((2, 4), 3.0))
    miss = phases.lookup("verify@8", 5)
    assert miss.reason == "above_max"
    phases.count_eager("verify@8", miss.reason)
    return w


def test_phase_series_count_a_states_phases():
    registry = CollectorRegistry()
    w = phased_worker()
    with register_worker_metrics(w, registry):
        m = scrape(registry)
    assert value(m, "draftgraph_phase_graphs", phase="verify") == 3
    assert value(m, "draftgraph_phase_graph_replays", phase="verify") == 1
    assert value(m, "draftgraph_phase_eager_steps", phase="verify", reason="above_max") == 1
    assert value(m, "draftgraph_phase_eager_steps", phase="verify", reason="not_ready") == 0
    assert value(m, "draftgraph_phase_capture_seconds", phase="verify") > 0


def test_a_target_only_state_holds_the_phases_for_spec_none_and_is_labelled_s0():
    """`build_target_state`: no draft graphs, the provider's phases for spec None (a step that
    drafts nothing) at its sizes; active, the worker's series say S = 0 and label it apart."""
    from draftgraph.runtime.worker.host_phases import GraphStep

    asked = []

    def provider(spec, rows):
        asked.append(spec)
        width = 1 if spec is None else spec.num_draft_tokens
        return {"verify@8": GraphStep(lambda x: x + 1, {"x": torch.zeros(rows, width)}, {"x": 0})}

    w = EagleDraftWorker(args_for(3), MODEL)
    w.capture.set_phase_provider(provider)
    plain = w.build_target_state([2, 4], "trace")
    assert asked == [None] and plain.target_only and plain.graphs is None and not plain.has_graphs
    manager = plain.replayable_phases().managers["verify@8"]
    assert manager.captured_sizes == (2, 4) and manager.static_inputs["x"].shape == (4, 1)
    assert repr(plain) == "RuntimeState(S=0 target only, sizes=2)"
    w.apply_runtime_state(plain)
    registry = CollectorRegistry()
    with register_worker_metrics(w, registry):
        m = scrape(registry)
    assert value(m, "draftgraph_active_num_steps") == 0
    assert value(m, "draftgraph_active_num_draft_tokens") == 1
    assert value(m, "draftgraph_state_steps", num_steps="0", topology="target_only") == 0


def test_every_documented_series_is_exported_with_its_type(simulated):
    registry, _ = simulated
    coord = type("Coord", (), {"rank": 1, "stats": CoordinatorStats(polls=3)})()
    with register_coordinator_metrics(coord, registry, labels={"job": "ranks"}), \
            register_worker_metrics(phased_worker(), registry, labels={"job": "phases"}):
        got = types(registry)
    docs = documented()
    assert len(docs) >= 30
    assert {n: got.get(n) for n in docs} == docs
    assert set(got) <= set(docs), f"exported but not documented: {set(got) - set(docs)}"


def test_the_readme_points_at_the_series_it_no_longer_copies():
    """The README links the one list (docs/metrics.md) instead of a second copy that could drift."""
    readme = (ROOT / "README.md").read_text()
    assert "docs/metrics.md#series" in readme and documented("README.md") == {}
    assert "## Series" in (ROOT / "docs" / "metrics.md").read_text()


def test_scrape_equals_the_simulate_report(simulated):
    registry, report = simulated
    m = scrape(registry)
    assert report["graph_replays"] > 0 and report["accepted_tokens"] > 0
    assert value(m, "draftgraph_graph_replays") == report["graph_replays"]
    assert sum(s.value for s in m["draftgraph_eager_steps"]) == report["eager_steps"]
    assert value(m, "draftgraph_fast_path_hits") == report["fast_path_hits"]
    assert value(m, "draftgraph_spec_decode_accepted_tokens") == report["accepted_tokens"]
    assert value(m, "draftgraph_spec_decode_drafts") == report["drafts"]
    assert value(m, "draftgraph_tokens_generated") == report["tokens_generated"]
    assert value(m, "draftgraph_requests_finished") == report["requests"]
    per_pos = {int(s.labels["position"]): s.value for s in m["draftgraph_spec_decode_accepted_tokens_per_pos"]}
    assert per_pos == {int(k): v for k, v in report["accepted_per_pos"].items()}
    assert sum(per_pos.values()) == report["accepted_tokens"]
    # per position counts can only fall with depth (a later token needs the earlier ones)
    assert all(per_pos[i] >= per_pos[i + 1] for i in range(len(per_pos) - 1))
    assert value(m, "draftgraph_spec_decode_mean_acceptance_length") == pytest.approx(report["accept_length_mean"])
    assert {s.labels["stage"]: s.value for s in m["draftgraph_stage_seconds"]} == pytest.approx(report["stage_s"])
    assert value(m, "draftgraph_startup_seconds") == pytest.approx(report["startup_s"])
    assert value(m, "draftgraph_graphs_ready_seconds") == pytest.approx(report["graphs_ready_s"])


def test_graph_units_by_source_partition_the_live_units(simulated):
    registry, report = simulated
    m = scrape(registry)
    by = {s.labels["source"]: s.value for s in m["draftgraph_graph_units"]}
    live = sum(len(s["sizes_ready"]) for s in report["states"])
    assert live > 0 and sum(by.values()) == live
    # the trace backend records and never compiles; the store is off in tests
    assert by == {"compiled": 0, "recorded": live, "loaded": 0, "shared": 0}
    assert value(m, "draftgraph_compile_process_seconds") == 0  # no compile process ran
    assert value(m, "draftgraph_compile_process_compiles") == 0


def test_startup_figures_become_series():
    from draftgraph.runtime.engine.metrics import read_startup
    from draftgraph.runtime.prometheus import Samples

    out = Samples()
    # 3 of 5 recorded units checked against compiled code, from one symbolic compile
    startup = {"units_recorded": 5, "units_checked": 3, "units_compiled": 1, "units_loaded": 7, "units_shared": 1,
               "compile_process": {"compiles": 3, "deaths": 1, "compile_s": 12.5}}
    read_startup(startup, out, {"job": "a"})
    got = {(s.name, s.labels.get("source")): s.value for fam in out.families() for s in fam.samples}
    assert got == {("draftgraph_graph_units", "compiled"): 3, ("draftgraph_graph_units", "recorded"): 2,
                   ("draftgraph_graph_units", "loaded"): 7, ("draftgraph_graph_units", "shared"): 1,
                   ("draftgraph_compile_process_seconds_total", None): 12.5,
                   ("draftgraph_compile_process_compiles_total", None): 3,
                   ("draftgraph_compile_process_deaths_total", None): 1}
    assert all(s.labels["job"] == "a" for fam in out.families() for s in fam.samples)
    out = Samples()
    read_startup({**startup, "compile_process": None}, out, {})
    got = {s.name: s.value for fam in out.families() for s in fam.samples if "process" in s.name}
    assert got == {"draftgraph_compile_process_seconds_total": 0, "draftgraph_compile_process_compiles_total": 0,
                   "draftgraph_compile_process_deaths_total": 0}


# ---- reloads, released states, threads ------------------------------------------------------------
COUNTERS = ("draftgraph_graph_replays", "draftgraph_eager_steps", "draftgraph_fast_path_hits",
            "draftgraph_tree_path_calls", "draftgraph_state_switches", "draftgraph_reloads")


def worker_totals(m) -> dict:
    return {(f, tuple(sorted(s.labels.items()))): s.value for f in COUNTERS for s in m.get(f, [])}


def test_counters_only_go_up_across_reloads_and_released_states_go():
    w = worker(3)
    registry = CollectorRegistry()
    register_worker_metrics(w, registry)
    drive(w, [1, 2, 3, 4, 5])  # 5: above the largest size, eager
    before = scrape(registry)
    assert value(before, "draftgraph_state_steps", num_steps="3") == 5
    assert value(before, "draftgraph_eager_steps", reason="above_max") == 1
    w.reload(args_for(2))
    drive(w, [1, 2])
    gc.collect()
    after = scrape(registry)
    b, a = worker_totals(before), worker_totals(after)
    assert all(a[k] >= v for k, v in b.items()), {k: (v, a[k]) for k, v in b.items() if a[k] < v}
    assert value(after, "draftgraph_graph_replays") == 4 + 2  # the released state's replays stay
    assert value(after, "draftgraph_reloads", result="ok") == 1
    assert value(after, "draftgraph_generation") == 1
    assert value(after, "draftgraph_active_num_steps") == 2
    assert {s.labels["num_steps"] for s in after["draftgraph_state_steps"]} == {"2"}


def test_scraping_while_another_thread_steps_and_reloads():
    w = worker(3)
    registry = CollectorRegistry()
    register_worker_metrics(w, registry)
    stop, errors, scrapes = threading.Event(), [], []

    def scraper():
        last: dict = {}
        while not stop.is_set():
            try:
                m = scrape(registry)
                now = worker_totals(m)
                assert all(now[k] >= v for k, v in last.items() if k in now)
                steps = {tuple(sorted(s.labels.items())): s.value for s in m["draftgraph_state_steps"]}
                for fam in ("draftgraph_state_graph_replays", "draftgraph_state_eager_steps"):
                    assert {tuple(sorted(s.labels.items())) for s in m[fam]} == set(steps)
                rep = {tuple(sorted(s.labels.items())): s.value for s in m["draftgraph_state_graph_replays"]}
                eag = {tuple(sorted(s.labels.items())): s.value for s in m["draftgraph_state_eager_steps"]}
                assert all(steps[k] == rep[k] + eag[k] for k in steps)  # one snapshot per state
                last = now
                scrapes.append(1)
                stop.wait(0.001)  # let the serving thread run (the GIL)
            except Exception as exc:  # noqa: BLE001 (reported by the main thread)
                errors.append(exc)
                return

    t = threading.Thread(target=scraper, daemon=True)
    t.start()
    try:
        for i in range(4):
            drive(w, [1, 3, 4, 6], seed=10 * i)
            w.reload(args_for(2 + i % 2))
    finally:
        stop.set()
        t.join(timeout=30)
    assert not t.is_alive()
    assert not errors, errors
    assert scrapes


# ---- several sources, errors ----------------------------------------------------------------------
def test_two_workers_one_registry_and_unregister():
    a, b = worker(3), worker(2)
    registry = CollectorRegistry()
    ha = register_worker_metrics(a, registry, labels={"worker": "a"})
    hb = register_worker_metrics(b, registry, labels={"worker": "b"})
    drive(a, [1, 2, 4])
    drive(b, [2])
    m = scrape(registry)
    assert value(m, "draftgraph_graph_replays", worker="a") == 3
    assert value(m, "draftgraph_graph_replays", worker="b") == 1
    assert value(m, "draftgraph_active_num_steps", worker="b") == 2
    ha.unregister()
    ha.unregister()  # idempotent
    m = scrape(registry)
    assert {s.labels["worker"] for s in m["draftgraph_graph_replays"]} == {"b"}
    hb.unregister()
    assert scrape(registry) == {}
    register_worker_metrics(a, registry).unregister()  # registrable again


def test_registration_errors_name_the_problem():
    w = worker(2)
    registry = CollectorRegistry()
    with register_worker_metrics(w, registry, labels={"worker": "a"}):
        with pytest.raises(ValueError, match="already registered"):
            register_worker_metrics(w, registry, labels={"worker": "b"})
        with pytest.raises(ValueError, match="same labels"):
            register_worker_metrics(worker(3), registry, labels={"worker": "a"})
    with pytest.raises(ValueError, match="reserved"):
        register_worker_metrics(w, registry, labels={"num_steps": "1"})
    with pytest.raises(ValueError, match="labels key"):
        register_worker_metrics(w, registry, labels={"bad-name": "1"})
    with pytest.raises(TypeError, match="registry="):
        register_worker_metrics(w, registry={})
    with pytest.raises(TypeError, match="worker="):
        register_worker_metrics(object(), registry)


def test_sglang_handle_fast_path_counters():
    counters = DraftCounters(fast_path_hits=7, tree_path_calls=2, capacity_fallbacks=1, rebuilds=3)
    handle = type("Handle", (), {"counters": counters, "uninstall": lambda self: None})()
    registry = CollectorRegistry()
    with register_sglang_metrics(handle, registry, labels={"tp_rank": "0"}):
        m = scrape(registry)
    assert value(m, "draftgraph_fast_path_hits") == 7
    assert value(m, "draftgraph_tree_path_calls") == 2
    assert value(m, "draftgraph_capacity_fallbacks") == 1
    assert value(m, "draftgraph_topology_rebuilds") == 3


def test_engine_and_its_worker_are_one_registration():
    from engine_support import models

    from draftgraph.runtime.engine import SpecDecodeEngine
    from draftgraph.runtime.engine.metrics import register_engine_metrics

    target, head = models("eagle")
    engine = SpecDecodeEngine(args_for(2), target, head, backend="eager", capture="blocking")
    registry = CollectorRegistry()
    with register_engine_metrics(engine, registry):
        with pytest.raises(ValueError, match="already registered"):
            register_worker_metrics(engine.worker, registry)


# ---- the command ----------------------------------------------------------------------------------
def _run(*argv):
    return subprocess.run([sys.executable, "-m", "draftgraph.runtime", *argv],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_simulate_metrics_port_and_file(tmp_path):
    out = tmp_path / "final.prom"
    p = _run("simulate", "--requests", "3", "--json", "--no-greedy", "--backend", "eager", "--adaptive", "",
             "--metrics-port", "0", "--metrics-file", str(out))
    assert p.returncode == 0, p.stderr
    assert re.search(r"metrics at http://127\.0\.0\.1:\d+/metrics", p.stderr)
    import json

    report = json.loads(p.stdout)
    fams = {f.name: f for f in text_string_to_metric_families(out.read_text())}
    assert fams["draftgraph_tokens_generated"].samples[0].value == report["tokens_generated"]


def test_simulate_metrics_port_in_use_exits_2():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = _run("simulate", "--requests", "1", "--no-greedy", "--metrics-port", str(port))
    assert p.returncode == 2
    assert f"metrics port {port}" in p.stderr and "Traceback" not in p.stderr


def test_a_rank_coordinator_exports_polls_and_reload_decisions_with_its_rank():
    import torch.distributed as dist

    from draftgraph.runtime.ranks.coordinator import RankCoordinator

    if dist.is_initialized():
        pytest.skip("a process group exists already")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        w = worker(3)
        coordinator = RankCoordinator(w, poll_every=2, timeout_s=10.0)
        registry = CollectorRegistry()
        with register_coordinator_metrics(coordinator, registry):
            for _ in range(5):
                coordinator.step()
            coordinator.propose_reload(args_for(2))
            for _ in range(5):
                coordinator.step()
            m = scrape(registry)
    finally:
        dist.destroy_process_group()
    assert value(m, "draftgraph_coordinator_polls", rank="0") == 10 // 2  # one poll per poll_every steps
    assert w.generation == 1
    assert value(m, "draftgraph_coordinator_reloads", rank="0", result="committed") == 1
    assert value(m, "draftgraph_coordinator_reloads", rank="0", result="aborted") == 0
    assert value(m, "draftgraph_coordinator_reload_votes", rank="0") == 1
