"""Compiled draft steps that load from the store: no recording, no compile, same outputs, live
weights; a damaged entry is rebuilt; identical graphs share one compile; a fresh process loads."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from draftgraph.graphs.compile.inductor import compiler_available
from draftgraph.graphs.core import backend_trace
from draftgraph.runtime import (
    CudaGraphConfig,
    EagleDraftWorker,
    PhaseGraphConfig,
    RuntimeArgs,
    SpeculativeConfig,
)
from draftgraph.runtime.compile_store import CompileStore
from draftgraph.runtime.testing import TinyDraftModel, make_draft_input
from draftgraph.runtime.worker import stored_steps

pytestmark = pytest.mark.skipif(not compiler_available(), reason="no C++ compiler for inductor")

SIZES = (1, 2)


@pytest.fixture(scope="module", autouse=True)
def _per_size():
    """Per-size entries, one per size (the symbolic entry, one per step: test_compile_symbolic.py)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("DRAFTGRAPH_COMPILE_SYMBOLIC", "0")
    yield
    mp.undo()


def _args() -> RuntimeArgs:
    return RuntimeArgs(SpeculativeConfig(3, 2, 6), CudaGraphConfig(PhaseGraphConfig(bs=SIZES)))


def _use_store(monkeypatch, folder: Path) -> CompileStore:
    """A fresh store object on ``folder`` (as a new process would open it)."""
    store = CompileStore(folder)
    monkeypatch.setenv("DRAFTGRAPH_COMPILED", "1")
    monkeypatch.setattr(stored_steps, "default_compile_store", lambda: store)
    return store


def _worker(backend: str, model: TinyDraftModel, background: bool = False) -> EagleDraftWorker:
    w = EagleDraftWorker(_args(), model)
    if backend != "eager":
        w.capture_graphs(backend, background=background)
        assert w.capture.wait(600)
    return w


def _sources(w: EagleDraftWorker) -> dict[int, str]:
    return {s: v.source for s, v in w.state.graphs.stats.sizes.items()}


def _outputs(w: EagleDraftWorker, b: int, seed: int) -> list[torch.Tensor]:
    return [t.clone() for t in w.draft_forward(make_draft_input(b, 2, seed=seed))]


def _code_entries(folder: Path) -> list[Path]:
    """The store's entries of compiled code (not its own unit-seconds entry), sorted."""
    from draftgraph.runtime.compile_store import _UNIT_SECONDS_KEY

    return sorted(p for p in folder.glob("*.dgc") if p.stem != _UNIT_SECONDS_KEY)


def _no_recording(*_a, **_k):
    raise AssertionError("recorded a step that the store holds")


@pytest.fixture(scope="module")
def stored_folder(tmp_path_factory) -> Path:
    """A store filled by one worker that recorded and compiled every size."""
    folder = tmp_path_factory.mktemp("compiled") / "store"
    mp = pytest.MonkeyPatch()
    try:
        _use_store(mp, folder)
        w = _worker("compile", TinyDraftModel(seed=0))
        assert _sources(w) == {1: "recorded", 2: "recorded"}
        assert all(v.engine == "inductor" for v in w.state.graphs.stats.sizes.values())
    finally:
        mp.undo()
    assert len(_code_entries(folder)) == len(SIZES)
    assert CompileStore(folder).unit_seconds() > 0  # each compiled unit noted its seconds
    return folder


@pytest.mark.slow  # the slow tier: inductor compiles (or the stored_folder fixture's)
def test_a_second_worker_loads_every_size_without_recording(stored_folder, monkeypatch):
    store = _use_store(monkeypatch, stored_folder)
    monkeypatch.setattr(backend_trace, "record_graph", _no_recording)
    w = _worker("compile", TinyDraftModel(seed=0), background=True)  # queued: loaded at once
    assert _sources(w) == {1: "loaded", 2: "loaded"}
    assert all(v.compile_s == 0.0 and v.engine == "inductor" for v in w.state.graphs.stats.sizes.values())
    assert store.hits == len(SIZES) and w.capture.queue.units_run == 0
    eager = _worker("eager", TinyDraftModel(seed=0))
    for b, seed in ((1, 3), (2, 4)):
        replays = w.counters.graph_replays
        got, want = _outputs(w, b, seed), _outputs(eager, b, seed)
        assert w.counters.graph_replays == replays + 1
        for g, e in zip(got, want):
            torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)


@pytest.mark.slow  # the slow tier: inductor compiles (or the stored_folder fixture's)
def test_a_loaded_step_reads_updated_weights(stored_folder, monkeypatch):
    _use_store(monkeypatch, stored_folder)
    monkeypatch.setattr(backend_trace, "record_graph", _no_recording)
    w = _worker("compile", TinyDraftModel(seed=0))
    assert _sources(w) == {1: "loaded", 2: "loaded"}
    before = _outputs(w, 2, 11)
    fresh = TinyDraftModel(seed=7)
    w.update_draft_weights(fresh.state_dict())
    got = _outputs(w, 2, 11)
    want = _outputs(_worker("eager", fresh), 2, 11)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)
    assert any(not torch.equal(g, b) for g, b in zip(got, before))  # the new weights mattered


@pytest.mark.slow  # the slow tier: inductor compiles (or the stored_folder fixture's)
def test_a_damaged_entry_is_named_refused_and_rebuilt(stored_folder, tmp_path, monkeypatch, caplog):
    folder = tmp_path / "store"
    folder.mkdir(mode=0o700)
    for path in _code_entries(stored_folder):
        (folder / path.name).write_bytes(path.read_bytes())
        os.chmod(folder / path.name, 0o600)
    store = _use_store(monkeypatch, folder)
    victim = _code_entries(folder)[0]
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    victim.write_bytes(bytes(raw))
    with caplog.at_level(logging.WARNING):
        w = _worker("compile", TinyDraftModel(seed=0))
    assert sorted(_sources(w).values()) == ["loaded", "recorded"]
    assert store.refused == 1 and str(victim) in caplog.text
    assert victim.exists() and len(_code_entries(folder)) == len(SIZES)  # rebuilt and stored again
    assert CompileStore(folder).get(victim.name.removesuffix(".dgc")) is not None


@pytest.mark.slow  # the slow tier: inductor compiles (or the stored_folder fixture's)
def test_a_changed_structure_misses(stored_folder, monkeypatch):
    _use_store(monkeypatch, stored_folder)
    w = EagleDraftWorker(RuntimeArgs(SpeculativeConfig(2, 2, 4), CudaGraphConfig(PhaseGraphConfig(bs=(1,)))),
                         TinyDraftModel(seed=0))
    manager = w.capture._new_manager(w.state, "compile", background=False)  # noqa: SLF001  # the worker's own manager, not captured
    manager.begin()
    assert manager.load_stored() == 0 and manager.pending_sizes == (1,)
    manager.release()


@pytest.mark.slow  # the slow tier: inductor compiles (or the stored_folder fixture's)
def test_identical_graphs_compile_once(stored_folder, tmp_path, monkeypatch):
    folder = tmp_path / "store"
    store = _use_store(monkeypatch, folder)
    w = _worker("compile", TinyDraftModel(seed=0))
    assert _sources(w) == {1: "recorded", 2: "recorded"}
    monkeypatch.setattr(backend_trace, "record_graph", _no_recording)
    twin = w.build_runtime_state(3, 6, topk=2)  # the same structure as the active state
    assert {s: v.source for s, v in twin.graphs.stats.sizes.items()} == {1: "shared", 2: "shared"}
    assert store.written == len(SIZES)


def _renamed_among_keys(src: Path, dst: Path, store: CompileStore) -> dict[str, str]:
    """Every code entry of ``src`` (per-size and symbolic, two structures) written into ``dst`` under
    another entry's key (a rotation), each signed for its new name as the same user could: the
    store's digest is intact. Returns new key -> the key it was made under."""
    keys = [p.stem for p in _code_entries(src)]
    source = CompileStore(src)
    moved = {}
    for i, key in enumerate(keys):
        other = keys[(i + 1) % len(keys)]
        store.put(other, source.get(key), count=False)
        moved[other] = key
    return moved


@pytest.mark.slow  # the slow tier: inductor compiles
@pytest.mark.parametrize("symbolic", ["0", "1"], ids=["per-size", "symbolic"])
def test_entries_renamed_among_their_keys_are_refused_and_compiled_again(tmp_path, monkeypatch, caplog, symbolic):
    """Issue 40: valid entries renamed among their keys were loaded and run as another
    structure's code (the run died: ``top_scores_index (1, 2) ... must be [1, 4]``). Each is
    refused before it runs, removed, compiled again; the outputs equal eager."""
    monkeypatch.setenv("DRAFTGRAPH_COMPILE_SYMBOLIC", symbolic)
    specs = [SpeculativeConfig(3, 2, 6), SpeculativeConfig(2, 2, 5)]  # the same sizes, another S
    good = tmp_path / "good"
    _use_store(monkeypatch, good)
    for spec in specs:
        w = EagleDraftWorker(RuntimeArgs(spec, CudaGraphConfig(PhaseGraphConfig(bs=SIZES))), TinyDraftModel(seed=0))
        w.capture_graphs("compile", background=False)
        w.capture.stop(60)
    assert len(_code_entries(good)) == (2 if symbolic == "1" else 2 * len(SIZES))
    bad = tmp_path / "bad"
    store = _use_store(monkeypatch, bad)
    moved = _renamed_among_keys(good, bad, store)
    with caplog.at_level(logging.WARNING):
        for spec in specs:
            w = EagleDraftWorker(RuntimeArgs(spec, CudaGraphConfig(PhaseGraphConfig(bs=SIZES))), TinyDraftModel(seed=0))
            w.capture_graphs("compile", background=False)
            assert set(_sources(w).values()) == {"recorded"}
            eager = EagleDraftWorker(RuntimeArgs(spec, CudaGraphConfig(PhaseGraphConfig(bs=SIZES))),
                                     TinyDraftModel(seed=0))
            for b, seed in ((1, 5), (2, 6)):
                for g, e in zip(_outputs(w, b, seed), _outputs(eager, b, seed)):
                    torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)
            w.capture.stop(60)
    assert store.refused == len(moved)
    assert caplog.text.count("made under key") == len(moved)
    again = CompileStore(bad)
    for key in moved:  # compiled again: each key holds its own code now
        assert again.get(key) is not None


@pytest.mark.slow
def test_a_fresh_process_loads_every_size(stored_folder):
    script = textwrap.dedent(f"""
        import json
        from draftgraph.graphs.core import backend_trace
        from draftgraph.runtime import CudaGraphConfig, EagleDraftWorker, PhaseGraphConfig, RuntimeArgs
        from draftgraph.runtime import SpeculativeConfig
        from draftgraph.runtime.testing import TinyDraftModel
        def no_recording(*a, **k):
            raise AssertionError("recorded")
        backend_trace.record_graph = no_recording
        w = EagleDraftWorker(RuntimeArgs(SpeculativeConfig(3, 2, 6), CudaGraphConfig(PhaseGraphConfig(bs={SIZES!r}))),
                             TinyDraftModel(seed=0))
        w.capture_graphs("compile", background=True)
        assert w.capture.wait(600)
        print(json.dumps({{s: v.source for s, v in w.state.graphs.stats.sizes.items()}}))
    """)
    env = {**os.environ, "DRAFTGRAPH_COMPILED": "1", "DRAFTGRAPH_COMPILED_DIR": str(stored_folder)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"1": "loaded", "2": "loaded"}


@pytest.mark.slow
def test_a_compile_process_that_dies_leaves_its_size_eager_and_serving_goes_on(tmp_path, monkeypatch, caplog):
    import signal
    import time

    _use_store(monkeypatch, tmp_path / "store")
    monkeypatch.setenv("DRAFTGRAPH_COMPILE_PROCESS", "1")
    w = EagleDraftWorker(_args(), TinyDraftModel(seed=0))
    process = w.capture.compile_process
    with caplog.at_level(logging.WARNING):
        w.capture_graphs("compile", background=True)  # the compile process starts with the first unit
        deadline = time.monotonic() + 120
        while process.pid() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(process.pid(), signal.SIGKILL)  # still importing torch: it cannot have answered
        assert w.capture.wait(600)
    stats = w.state.graphs
    assert len(stats.failed_sizes) == 1 and len(stats.captured_sizes) == 1
    assert process.deaths == 1 and process.compiles == 1 and w.capture.queue.units_failed == 1
    assert "compile process died" in caplog.text
    eager = _worker("eager", TinyDraftModel(seed=0))
    for b in SIZES:  # one size replays, the other serves eager ("capture_failed"); both are right
        for g, e in zip(_outputs(w, b, 5), _outputs(eager, b, 5)):
            torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)
    assert w.counters.eager_steps_by_reason.get("capture_failed") == 1
    w.capture.stop()


def test_a_closed_compile_process_starts_no_new_one():
    """A unit that finishes recording after the capture stopped must not compile on."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from draftgraph.graphs.compile.worker import CompileWorker, CompileWorkerDied

    worker = CompileWorker()
    worker.close()
    gm = make_fx(lambda x: x + 1)(torch.ones(2))
    with pytest.raises(CompileWorkerDied, match="closed"):
        worker.compile(gm, (torch.ones(2),))
    assert worker.pid() is None and (worker.compiles, worker.deaths) == (0, 0)


@pytest.mark.slow
def test_code_from_the_compile_process_runs_here_for_a_graph_with_a_constant_only_op():
    """The default EAGLE head's step has ops of constants only (arange); the graph travels node
    for node (`graph_wire`), so the child's artifact takes the same arguments as the graph."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from draftgraph.graphs.compile.inductor import inductor_cache_dir, load_artifact
    from draftgraph.graphs.compile.worker import CompileWorker

    def step(x, cache):
        cache.add_(1)
        pos = torch.arange(x.shape[-1], dtype=x.dtype).unsqueeze(0)
        return x * 2 + pos, cache

    x, cache = torch.randn(3, 8), torch.zeros(5)
    gm = make_fx(step)(x, cache)
    worker = CompileWorker(str(inductor_cache_dir()))
    try:
        raw = worker.compile(gm, (x, cache))
    finally:
        worker.close()
    assert worker.compiles == 1 and worker.compile_s > 0
    compiled = load_artifact(raw)
    c1, c2 = cache.clone(), cache.clone()
    with torch.no_grad():
        want, got = gm(x, c1), compiled(x, c2)
    assert all(torch.equal(a, b) for a, b in zip(want, got)) and torch.equal(c1, c2)


@pytest.mark.slow  # the slow tier: inductor compiles (or the stored_folder fixture's)
def test_a_step_inductor_cannot_save_is_stored_as_its_recorded_graph(tmp_path, monkeypatch):
    """Chain S=1 drafts nothing (the input's top token is the draft): inductor saves no artifact
    for it, so the entry holds the recorded graph; a second worker loads it without recording."""
    args = RuntimeArgs(SpeculativeConfig(1, 1), CudaGraphConfig(PhaseGraphConfig(bs=(2,))))
    _use_store(monkeypatch, tmp_path / "store")
    first = EagleDraftWorker(args, TinyDraftModel(seed=0))
    first.capture_graphs("compile")
    assert {s: v.source for s, v in first.state.graphs.stats.sizes.items()} == {2: "recorded"}
    _use_store(monkeypatch, tmp_path / "store")
    monkeypatch.setattr(backend_trace, "record_graph", _no_recording)
    second = EagleDraftWorker(args, TinyDraftModel(seed=0))
    second.capture_graphs("compile")
    assert {s: (v.source, v.engine) for s, v in second.state.graphs.stats.sizes.items()} == {2: ("loaded", "fx")}
    want = [t.clone() for t in first.draft_forward(make_draft_input(2, 1, seed=9))]
    got = [t.clone() for t in second.draft_forward(make_draft_input(2, 1, seed=9))]
    assert second.counters.graph_replays == 1
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_the_code_key_covers_every_source_of_runtime_and_graphs():
    """The stored code's key hashes the models, the engine and graphs/ too, not only the worker's
    own folder (it once looked for graphs/ beside worker/ and hashed runtime/worker alone)."""
    root = Path(stored_steps.__file__).resolve().parents[2]
    names = {str(p.relative_to(root)) for p in stored_steps.code_sources()}
    for want in ("runtime/models/layers.py", "runtime/engine/engine.py", "runtime/worker/stored_steps.py",
                 "graphs/manager.py", "graphs/__init__.py"):
        assert want in names, want
    assert len(names) == len(list((root / "runtime").rglob("*.py"))) + len(list((root / "graphs").rglob("*.py")))
