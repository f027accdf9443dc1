"""The symbolic compile (the default, issue 30): one record and one inductor compile with a
symbolic batch dimension serve every captured size, bitwise equal to the per-size compile;
a size the symbolic code does not fit compiles on its own. Few, small compiles."""

from __future__ import annotations

import pytest
import torch

import draftgraph.graphs.compile.symbolic as compile_module
from draftgraph.graphs import GraphCaptureManager
from draftgraph.graphs.compile.inductor import compiler_available
from draftgraph.graphs.compile.symbolic import symbolic_default
from draftgraph.runtime import CudaGraphConfig, EagleDraftWorker, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.testing import TinyDraftModel, make_draft_input

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not compiler_available(), reason="no C++ compiler for inductor")]

SIZES = (1, 2, 4)
W = (torch.arange(12.0).reshape(4, 3) - 5) / 7


def _step():
    cache = torch.zeros(8, 3)

    def step(x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.softmax(x @ W, dim=-1)
        cache.index_add_(0, ids[:, 0] % 8, y)  # in-place write into a constant
        x.mul_(0.5)  # in-place write into a static input
        return y * 3, ids + 1

    return step, cache


def _manager(symbolic: bool, monkeypatch) -> tuple[GraphCaptureManager, torch.Tensor]:
    monkeypatch.setenv("DRAFTGRAPH_COMPILE_SYMBOLIC", "1" if symbolic else "0")
    step, cache = _step()
    m = GraphCaptureManager(step, {"x": torch.zeros(4, 4), "ids": torch.zeros(4, 2, dtype=torch.long)},
                            SIZES, backend="compile", pad_values={"ids": 7})
    m.capture()
    return m, cache


def test_the_switch_reads_0_or_1(monkeypatch):
    monkeypatch.setenv("DRAFTGRAPH_COMPILE_SYMBOLIC", "yes")
    with pytest.raises(ValueError, match="DRAFTGRAPH_COMPILE_SYMBOLIC"):
        symbolic_default()
    monkeypatch.delenv("DRAFTGRAPH_COMPILE_SYMBOLIC")
    assert symbolic_default() is True  # on by default (issue 30)
    monkeypatch.setenv("DRAFTGRAPH_COMPILE_SYMBOLIC", "0")
    assert symbolic_default() is False


def test_one_symbolic_compile_serves_every_size_bitwise_as_per_size(monkeypatch):
    calls = []
    real = compile_module.compile_symbolic
    monkeypatch.setattr(compile_module, "compile_symbolic", lambda *a: calls.append(1) or real(*a))
    sym, sym_cache = _manager(True, monkeypatch)
    per, per_cache = _manager(False, monkeypatch)
    backend = sym._backend  # noqa: SLF001  # the test reads the counters of the backend it made
    assert len(calls) == 1 and backend.symbolic_compiles == 1
    assert sorted(backend.symbolic_sizes) == list(SIZES) and backend.compile_s.keys() == set(SIZES)
    assert all(sym.stats.sizes[b].engine == "inductor" for b in SIZES)
    for b in (1, 2, 3, 4):  # 3 replays padded to 4
        x = torch.randn(b, 4, generator=torch.Generator().manual_seed(b))
        ids = torch.arange(2 * b).reshape(b, 2)
        got = sym.run({"x": x.clone(), "ids": ids.clone()})
        want = per.run({"x": x.clone(), "ids": ids.clone()})
        for a, e in zip(got, want):
            assert torch.equal(a, e), b
    assert torch.equal(sym_cache, per_cache)
    for name in ("x", "ids"):
        assert torch.equal(sym.static_inputs[name], per.static_inputs[name])


def test_a_failing_symbolic_record_compiles_per_size(monkeypatch):
    def broken(*_):
        raise RuntimeError("injected symbolic failure")

    monkeypatch.setattr(compile_module, "record_symbolic", broken)
    m, _ = _manager(True, monkeypatch)
    backend = m._backend  # noqa: SLF001
    assert backend.symbolic_compiles == 0 and backend.symbolic_sizes == []
    assert all(m.stats.sizes[b].engine == "inductor" for b in SIZES)


@pytest.mark.parametrize("k,n", [(1, None), (2, 6)])
def test_eagle_worker_symbolic_equals_eager(k, n, monkeypatch):
    monkeypatch.setenv("DRAFTGRAPH_COMPILE_SYMBOLIC", "1")
    args = RuntimeArgs(SpeculativeConfig(3, k, n), CudaGraphConfig(PhaseGraphConfig(bs=(1, 2, 4))))
    w = EagleDraftWorker(args, TinyDraftModel(vocab_size=64, hidden_size=32, seed=0))
    w.capture_graphs("compile")
    stats = w.state.graphs.stats
    assert all(stats.sizes[b].engine == "inductor" for b in (1, 2, 4))
    backend = w.state.graphs._backend  # noqa: SLF001  # the counters of the backend it made
    assert backend.symbolic_compiles == 1 and sorted(backend.symbolic_sizes) == [1, 2, 4]
    ref = EagleDraftWorker(args, TinyDraftModel(vocab_size=64, hidden_size=32, seed=0))
    for b in (1, 3, 4):
        inp = make_draft_input(b, k, seed=b)
        for a, e in zip(w.draft_forward(inp), ref.draft_forward(inp)):
            assert torch.equal(a, e), (k, b)


def _use_store(monkeypatch, folder):
    """A fresh store object on ``folder`` (as a new process would open it)."""
    from draftgraph.runtime.compile_store import CompileStore
    from draftgraph.runtime.worker import stored_steps

    store = CompileStore(folder)
    monkeypatch.setenv("DRAFTGRAPH_COMPILED", "1")
    monkeypatch.setattr(stored_steps, "default_compile_store", lambda: store)
    return store


def _background_worker(monkeypatch) -> EagleDraftWorker:
    monkeypatch.setenv("DRAFTGRAPH_COMPILE_SYMBOLIC", "1")
    monkeypatch.setenv("DRAFTGRAPH_COMPILE_PROCESS", "1")
    args = RuntimeArgs(SpeculativeConfig(3, 2, 6), CudaGraphConfig(PhaseGraphConfig(bs=(1, 2, 4))))
    w = EagleDraftWorker(args, TinyDraftModel(vocab_size=64, hidden_size=32, seed=0))
    w.capture_graphs("compile", background=True)
    assert w.capture.wait(600)
    return w


def test_the_symbolic_compile_runs_in_the_compile_process(tmp_path, monkeypatch):
    """The symbolic graph (with its size arithmetic) travels to the compile process, which
    compiles it once; this process loads it and every size replays it, equal to eager."""
    from draftgraph.runtime.worker.stored_steps import source_counts

    _use_store(monkeypatch, tmp_path / "store")
    calls = []
    monkeypatch.setattr(compile_module, "compile_symbolic", lambda *a: calls.append(1))  # never here
    w = _background_worker(monkeypatch)
    backend = w.state.graphs._backend  # noqa: SLF001  # the counters of the backend it made
    assert calls == [] and w.capture.compile_process.compiles == 1 and w.capture.compile_process.deaths == 0
    assert backend.symbolic_compiles == 1 and sorted(backend.symbolic_sizes) == [1, 2, 4]
    assert all(v.engine == "inductor" for v in w.state.graphs.stats.sizes.values())
    # the startup figures count that one compile, not one per size checked against it
    counts = source_counts([w.state])
    assert (counts["units_recorded"], counts["units_checked"], counts["units_compiled"]) == (3, 3, 1)
    ref = EagleDraftWorker(w.args, TinyDraftModel(vocab_size=64, hidden_size=32, seed=0))
    for b in (1, 3, 4):
        inp = make_draft_input(b, 2, seed=b)
        for a, e in zip(w.draft_forward(inp), ref.draft_forward(inp)):
            assert torch.equal(a, e), b
    w.capture.stop()


def test_a_compile_process_dying_in_the_symbolic_compile_leaves_that_size_eager(tmp_path, monkeypatch, caplog):
    """As for a per-size unit: the size whose symbolic compile died serves eager (counted, logged);
    the other sizes compile per size in a new compile process."""
    import logging

    from draftgraph.graphs.compile.worker import CompileWorker, CompileWorkerDied

    _use_store(monkeypatch, tmp_path / "store")
    real = CompileWorker.compile

    def dies_on_symbolic(self, gm, inputs, dynamic=0):
        if dynamic:
            raise CompileWorkerDied("the compile process died (exit -9)")
        return real(self, gm, inputs, dynamic)

    monkeypatch.setattr(CompileWorker, "compile", dies_on_symbolic)
    with caplog.at_level(logging.WARNING):
        w = _background_worker(monkeypatch)
    graphs = w.state.graphs
    backend = graphs._backend  # noqa: SLF001  # the counters of the backend it made
    assert len(graphs.failed_sizes) == 1 and sorted((*graphs.captured_sizes, *graphs.failed_sizes)) == [1, 2, 4]
    assert backend.symbolic_compiles == 0 and backend.symbolic_sizes == []
    assert w.capture.queue.units_failed == 1 and "died during the symbolic compile" in caplog.text
    assert w.capture.compile_process.compiles == 2  # the two other sizes, per size
    ref = EagleDraftWorker(w.args, TinyDraftModel(vocab_size=64, hidden_size=32, seed=0))
    for b in (1, 2, 4):
        inp = make_draft_input(b, 2, seed=b)
        for a, e in zip(w.draft_forward(inp), ref.draft_forward(inp)):
            torch.testing.assert_close(a, e, rtol=1e-6, atol=1e-6)
    w.capture.stop()


def _code_entries(folder):
    from draftgraph.runtime.compile_store import _UNIT_SECONDS_KEY

    return sorted(p for p in folder.glob("*.dgc") if p.stem != _UNIT_SECONDS_KEY)


def _no_recording(*_a, **_k):
    raise AssertionError("recorded a step that the store holds")


def _no_compile(*_a, **_k):
    raise AssertionError("compiled a step that the store holds")


def test_a_symbolic_key_leaves_out_the_size_and_never_equals_a_per_size_key():
    from draftgraph.graphs.compile.entry import ConstantTable, entry_key

    rows, table = torch.zeros(4, 3), ConstantTable({"w": torch.ones(3)})
    per = {b: entry_key("s", b, (rows[:b],), table, "compile") for b in (1, 2, 4)}
    sym = {b: entry_key("s", None, (rows[:b],), table, "compile") for b in (1, 2, 4)}
    assert len(set(per.values())) == 3 and len(set(sym.values())) == 1
    assert not set(per.values()) & set(sym.values())
    assert entry_key("s", None, (torch.zeros(4, 5)[:2],), table, "compile") != sym[2]  # another row width


def test_the_symbolic_code_is_stored_once_and_a_second_worker_replays_every_size_without_recording(
        tmp_path, monkeypatch):
    from draftgraph.graphs.compile.worker import CompileWorker
    from draftgraph.graphs.core import backend_trace

    folder = tmp_path / "store"
    _use_store(monkeypatch, folder)
    first = _background_worker(monkeypatch)
    first.capture.stop()
    assert len(_code_entries(folder)) == 1  # one artifact; each size's outputs in its manifest
    store = _use_store(monkeypatch, folder)  # a fresh store object, as a new process opens it
    monkeypatch.setattr(backend_trace, "record_graph", _no_recording)
    monkeypatch.setattr(compile_module, "compile_symbolic", _no_compile)
    monkeypatch.setattr(CompileWorker, "compile", _no_compile)
    second = _background_worker(monkeypatch)
    sizes = second.state.graphs.stats.sizes
    assert {b: (v.source, v.engine) for b, v in sizes.items()} == {b: ("loaded", "inductor") for b in (1, 2, 4)}
    backend = second.state.graphs._backend  # noqa: SLF001  # the counters of the backend it made
    assert backend.loaded == 3 and backend.symbolic_compiles == 0 and sorted(backend.symbolic_sizes) == [1, 2, 4]
    assert store.hits == 1 and second.capture.queue.units_run == 0  # one load serves the state
    for b in (1, 3, 4):
        inp = make_draft_input(b, 2, seed=b)
        for a, e in zip(second.draft_forward(inp), first.draft_forward(inp)):
            assert torch.equal(a, e), b
    twin = second.build_runtime_state(3, 6, topk=2)  # the same structure: the same entry, loaded again
    assert {b: v.source for b, v in twin.graphs.stats.sizes.items()} == {b: "loaded" for b in (1, 2, 4)}
    second.capture.stop()


def test_a_damaged_symbolic_entry_is_refused_and_compiled_again(tmp_path, monkeypatch, caplog):
    import logging

    folder = tmp_path / "store"
    _use_store(monkeypatch, folder)
    _background_worker(monkeypatch).capture.stop()
    (victim,) = _code_entries(folder)
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    victim.write_bytes(bytes(raw))
    store = _use_store(monkeypatch, folder)
    with caplog.at_level(logging.WARNING):
        w = _background_worker(monkeypatch)
    assert store.refused == 1 and str(victim) in caplog.text
    assert {v.source for v in w.state.graphs.stats.sizes.values()} == {"recorded"}
    assert w.capture.compile_process.compiles == 1 and victim.exists()  # compiled once more and stored again
    w.capture.stop()


def test_a_chain_step_that_drafts_nothing_is_stored_and_loaded(tmp_path, monkeypatch):
    """Chain S=1 drafts nothing (per size inductor saves no artifact for it): whichever code is
    stored (symbolic, or per size when inductor saved nothing), a second worker loads it."""
    from draftgraph.graphs.core import backend_trace

    monkeypatch.setenv("DRAFTGRAPH_COMPILE_SYMBOLIC", "1")
    args = RuntimeArgs(SpeculativeConfig(1, 1), CudaGraphConfig(PhaseGraphConfig(bs=(2,))))
    _use_store(monkeypatch, tmp_path / "store")
    first = EagleDraftWorker(args, TinyDraftModel(seed=0))
    first.capture_graphs("compile")
    _use_store(monkeypatch, tmp_path / "store")
    monkeypatch.setattr(backend_trace, "record_graph", _no_recording)
    second = EagleDraftWorker(args, TinyDraftModel(seed=0))
    second.capture_graphs("compile")
    assert {s: v.source for s, v in second.state.graphs.stats.sizes.items()} == {2: "loaded"}
    inp = make_draft_input(2, 1, seed=9)
    for g, w in zip(second.draft_forward(inp), first.draft_forward(inp)):
        assert torch.equal(g, w)


@pytest.mark.parametrize("symbolic,record_fails,after_first", [(True, False, 0), (False, False, 2), (True, True, 2)])
def test_pending_compiles_counts_the_one_symbolic_compile_then_only_checks(symbolic, record_fails, after_first,
                                                                            monkeypatch):
    """What an estimate of the pending units' time counts: 3 sizes pending, one compile ahead
    with the symbolic compile (none once it ran: the other 2 only check), 3 per size (2 after
    one), and per size again once the symbolic recording failed."""
    if record_fails:
        def broken(*_):
            raise RuntimeError("injected symbolic failure")

        monkeypatch.setattr(compile_module, "record_symbolic", broken)
    monkeypatch.setenv("DRAFTGRAPH_COMPILE_SYMBOLIC", "1" if symbolic else "0")
    step, _ = _step()
    m = GraphCaptureManager(step, {"x": torch.zeros(4, 4), "ids": torch.zeros(4, 2, dtype=torch.long)},
                            SIZES, backend="compile", pad_values={"ids": 7})
    assert m.pending_compiles == 0  # nothing pending before begin
    m.begin()
    assert m.pending_compiles == (1 if symbolic else 3)
    m.capture_size(1)
    assert m.pending_sizes == (2, 4) and m.pending_compiles == after_first
    assert m.stats.sizes[1].compiles == 1  # the first unit ran the compile either way
    m.release()


@pytest.mark.parametrize("closed,ahead", [(True, 1), (False, 2)])
def test_a_symbolic_compile_cut_off_by_a_close_still_counts_as_one_compile_ahead(closed, ahead):
    """A close is not the symbolic compile's failure: the sizes left still count one compile, not
    one each (a compile process that died sends the later sizes per size: one each)."""
    from draftgraph.graphs import GraphCaptureError
    from draftgraph.graphs.compile.backend import CompileBackend
    from draftgraph.graphs.compile.worker import CompileWorkerDied

    class Gone:
        def __init__(self) -> None:
            self.closed = closed

        def compile(self, gm, inputs, dynamic=0):
            raise CompileWorkerDied("the compile process is gone")

    step, _ = _step()
    static = (torch.zeros(4, 4), torch.zeros(4, 2, dtype=torch.long))
    backend = CompileBackend(4, compiler=Gone(), symbolic=True)
    backend.warmup(step, static)
    assert backend.compiles_ahead(3) == 1
    with pytest.raises(GraphCaptureError):
        backend.capture(1, step, tuple(t[:1] for t in static))
    assert backend.compiles_ahead(2) == ahead
    backend.release()


def test_a_symbolic_code_that_differs_compiles_that_size_on_its_own(monkeypatch):
    def off_by_one(gm, inputs):
        def run(*a):
            return [o + 1 if o.is_floating_point() else o for o in gm(*a)]
        return run

    monkeypatch.setattr(compile_module, "compile_symbolic", off_by_one)
    m, _ = _manager(True, monkeypatch)
    backend = m._backend  # noqa: SLF001  # the counters of the backend it made
    assert backend.symbolic_compiles == 1 and backend.symbolic_sizes == []
    assert all(m.stats.sizes[b].engine == "inductor" for b in SIZES)  # each compiled per size


def test_the_engines_phases_take_the_symbolic_route_and_stay_lossless(monkeypatch):
    """Verify and extend (every input has a batch dimension) compile once per phase and tier;
    each captured size replays that code, and the engine still equals greedy."""
    from engine_support import engine_args, models, prompts

    from draftgraph.runtime.engine import SpecDecodeEngine
    from draftgraph.runtime.models.greedy import greedy_generate

    monkeypatch.setenv("DRAFTGRAPH_COMPILE_SYMBOLIC", "1")
    target, head = models("eagle")
    engine = SpecDecodeEngine(engine_args(SpeculativeConfig(3, 1), bs=(2, 4), running=4), target, head,
                              backend="compile", capture="blocking", graph_phases=("verify", "extend"),
                              kv_tiers=(128, 512))
    try:
        managers = engine.worker.state.phases.managers
        assert set(managers) == {"verify@128", "verify@512", "extend@128", "extend@512"}
        for name, manager in managers.items():
            backend = manager._backend  # noqa: SLF001  # the counters of the backend it made
            assert backend.symbolic_compiles == 1 and sorted(backend.symbolic_sizes) == [2, 4], name
        prompts_ = [list(p) for p in prompts()[:4]]
        assert engine.generate(prompts_, 16) == greedy_generate(target, prompts_, 16)
        assert engine.stats()["phases"]["verify"]["replays"] > 0
    finally:
        engine.close()
