"""`capture="auto"`: fill before serving on a CPU with few cores, background otherwise; the
compile pool a fill uses; a process that exits with units pending ends quickly and quietly."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from engine_support import engine_args, models, prompts

from draftgraph.graphs.compile.pool import CompilePool
from draftgraph.graphs.compile.worker import CompileWorker, CompileWorkerDied
from draftgraph.runtime import SpeculativeConfig
from draftgraph.runtime.engine import capture_choice
from draftgraph.runtime.engine.capture_choice import MIN_CORES_BESIDE, choose_capture


@pytest.mark.parametrize("backend", ["trace", "compile"])
def test_few_cpu_cores_fill_before_serving_and_many_capture_beside(backend):
    for cores in range(1, MIN_CORES_BESIDE):
        choice = choose_capture("auto", backend, cores)
        assert choice.mode == "fill" and f"{cores} usable cores" in choice.reason
        assert choice.compile_processes == cores  # one compile process per core while nothing serves
    for cores in (MIN_CORES_BESIDE, 16):
        assert choose_capture("auto", backend, cores).mode == "background"


def test_cuda_eager_and_explicit_modes_are_not_second_guessed():
    assert choose_capture("auto", "cuda", 2).mode == "background"  # units run between steps there
    assert choose_capture("auto", "eager", 2).mode == "none"
    for mode in ("background", "blocking"):
        choice = choose_capture(mode, "compile", 2)
        assert (choice.mode, choice.compile_processes) == (mode, 1) and "asked for" in choice.reason
    assert choose_capture("fill", "compile", 3).compile_processes == 3
    with pytest.raises(ValueError, match="cores=0"):
        choose_capture("auto", "trace", 0)


@pytest.mark.parametrize(("cores", "mode"), [(2, "fill"), (8, "background")])
def test_an_auto_engine_says_what_it_chose_and_a_fill_serves_every_step_from_graphs(monkeypatch, cores, mode):
    from draftgraph.runtime.engine import SpecDecodeEngine

    monkeypatch.setattr(capture_choice, "usable_cores", lambda: cores)
    target, head = models()
    engine = SpecDecodeEngine(engine_args(SpeculativeConfig(3, 1), bs=(1, 2, 4), running=4), target, head,
                              backend="trace", capture="auto")
    try:
        start = engine.startup()
        assert start["capture"] == mode and start["capture_choice"]["mode"] == mode
        assert start["capture_choice"]["cores"] == cores
        if mode == "fill":  # every unit done before the constructor returned: no step waits for one
            assert engine.worker.capture.ready() and start["graphs_ready_s"] is not None
            assert engine.worker.capture.compile_process.size == 1  # back to one process once serving starts
            outs = engine.generate([list(p) for p in prompts()[:4]], 12)
            st = engine.stats()
            assert st["eager_steps"] == 0 and st["graph_replays"] > 0
            eager = SpecDecodeEngine(engine_args(SpeculativeConfig(3, 1), bs=(1, 2, 4), running=4), target, head,
                                     backend="eager")
            assert outs == eager.generate([list(p) for p in prompts()[:4]], 12)
    finally:
        engine.close()


def test_the_pool_runs_compiles_side_by_side_up_to_its_size_and_shrinks(monkeypatch):
    running, most, lock = [0], [0], threading.Lock()
    gate = threading.Barrier(2, timeout=10)

    def fake_compile(self, gm, inputs, dynamic=0):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            gate.wait()  # both calls must be inside at once, or this times out (BrokenBarrierError)
        finally:
            with lock:
                running[0] -= 1
        return b"code"

    monkeypatch.setattr(CompileWorker, "compile", fake_compile)
    pool = CompilePool(size=2)
    out: list = []
    threads = [threading.Thread(target=lambda: out.append(pool.compile(None, ()))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert out == [b"code", b"code"] and most[0] == 2 and pool.most_at_once == 2
    pool.set_size(1)  # the idle extra process is let go
    assert pool.size == 1
    with pytest.raises(ValueError, match="size=0"):
        pool.set_size(0)
    pool.close()
    with pytest.raises(CompileWorkerDied, match="closed"):
        pool.compile(None, ())


def test_one_process_pool_waits_for_its_process(monkeypatch):
    inside = threading.Event()
    release = threading.Event()
    order: list[str] = []

    def fake_compile(self, gm, inputs, dynamic=0):
        order.append(f"start {gm}")
        inside.set()
        release.wait(10)
        order.append(f"end {gm}")
        return b""

    monkeypatch.setattr(CompileWorker, "compile", fake_compile)
    pool = CompilePool(size=1)
    first = threading.Thread(target=pool.compile, args=("a", ()))
    first.start()
    assert inside.wait(10)
    second = threading.Thread(target=pool.compile, args=("b", ()))
    second.start()
    time.sleep(0.3)
    assert order == ["start a"]  # the second waits for the one process
    release.set()
    first.join(10)
    second.join(10)
    assert order == ["start a", "end a", "start b", "end b"]


_EXITING = textwrap.dedent("""
    import sys, time
    from draftgraph.runtime import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
    from draftgraph.runtime.engine import SpecDecodeEngine
    from draftgraph.runtime.models import default_models
    args = RuntimeArgs(SpeculativeConfig(3, 1), CudaGraphConfig(PhaseGraphConfig(max_bs=8)), max_running_requests=8)
    target, draft = default_models()
    engine = SpecDecodeEngine(args, target, draft, backend=sys.argv[1], capture="background",
                              adaptive_steps=[1, 2, 3])
    time.sleep(float(sys.argv[2]))
    assert engine.worker.capture.queue.pending() > 0, "nothing pending: the test proves nothing"
    print("EXITING", time.monotonic(), flush=True)
""")


_INDUCTOR = pytest.mark.slow  # the slow tier: inductor compiles in the child (6-22 s each); trace stays fast


@pytest.mark.parametrize(("backend", "after_s", "store"), [
    ("trace", 0.0, "1"), pytest.param("compile", 0.5, "1", marks=_INDUCTOR),
    pytest.param("compile", 3.0, "1", marks=_INDUCTOR), pytest.param("compile", 2.0, "0", marks=_INDUCTOR)])
def test_a_process_ending_with_units_pending_exits_within_seconds_and_quietly(tmp_path, backend, after_s, store):
    """With the store (compiles in the compile process) and without it (compiles here)."""
    if backend == "compile":
        from draftgraph.graphs.compile.inductor import compiler_available
        if not compiler_available():
            pytest.skip("the compile backend needs a C++ compiler")
    env = dict(os.environ, DRAFTGRAPH_COMPILED=store, DRAFTGRAPH_COMPILED_DIR=str(tmp_path / "store"),
               TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    proc = subprocess.run([sys.executable, "-c", _EXITING, backend, str(after_s)], capture_output=True, text=True,
                          timeout=300, env=env)
    ended = time.monotonic()
    assert proc.returncode == 0, proc.stderr[-2000:]
    said = [line for line in proc.stdout.splitlines() if line.startswith("EXITING")]
    assert said, proc.stdout + proc.stderr[-2000:]
    exit_s = ended - float(said[0].split()[1])
    assert exit_s < 30.0, f"exit took {exit_s:.1f} s"  # cancelled: ~1.5 s here (loaded: more); before: 15-60 s
    for alarming in ("can't register atexit", "keeps the FX replay", "still running", "Traceback",
                     "terminate called", "compiling per size"):
        assert alarming not in proc.stderr, proc.stderr[-2000:]
    store = tmp_path / "store"
    if store.exists():  # whatever was stored is whole: no temp file left behind
        assert not [p for p in store.rglob("*") if p.name.startswith(".") or p.suffix == ".tmp"]
