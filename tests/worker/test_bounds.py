"""Nothing allocates without a bound, and no reload file stops a server (issue 25):
SpeculativeConfig's documented maxima, the state-bytes budget checked before a worker builds a
state, and damaged runtime args files (a ValueError naming the file; SIGHUP and `simulate`'s
reload report it and keep serving)."""

from __future__ import annotations

import json
import logging
import os
import resource
import signal

import pytest
import torch

from draftgraph.runtime import (
    CudaGraphConfig,
    EagleDraftWorker,
    PhaseGraphConfig,
    RuntimeArgs,
    SpeculativeConfig,
    install_reload_signal,
    load_runtime_args,
)
from draftgraph.runtime.bounds import DEFAULT_MAX_STATE_BYTES, MAX_NUM_DRAFT_TOKENS, MAX_NUM_STEPS, MAX_TOPK
from draftgraph.runtime.config import chain_capacity
from draftgraph.runtime.testing import TinyDraftModel, make_draft_input
from draftgraph.runtime.worker.budget import estimate_state_bytes

MODEL = TinyDraftModel()


def _args(spec=None, bs=(1, 2, 4), mrr=8, **kw) -> RuntimeArgs:
    return RuntimeArgs(spec or SpeculativeConfig(3, 1), CudaGraphConfig(PhaseGraphConfig(bs=bs)),
                       max_running_requests=mrr, **kw)


def _serving() -> EagleDraftWorker:
    w = EagleDraftWorker(_args(), MODEL)
    w.capture_graphs("trace")
    return w


def _answer(w: EagleDraftWorker, b: int = 3) -> list[torch.Tensor]:
    return [t.clone() for t in w.draft_forward(make_draft_input(b, w.spec.topk, seed=b))]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def _maxrss_kb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


# ---- SpeculativeConfig maxima ------------------------------------------------------------------
def test_documented_maxima_are_accepted_and_one_past_is_refused():
    assert (MAX_NUM_STEPS, MAX_TOPK, MAX_NUM_DRAFT_TOKENS) == (64, 64, 1024)  # as documented
    SpeculativeConfig(MAX_NUM_STEPS, 1)
    SpeculativeConfig(2, MAX_TOPK, MAX_NUM_DRAFT_TOKENS)
    wide = tuple((r,) for r in range(16)) + tuple((r, c) for r in range(16) for c in range(16))
    SpeculativeConfig(2, 16, tree_choices=wide)  # 272 paths
    for make, frag in [
        (lambda: SpeculativeConfig(MAX_NUM_STEPS + 1, 1), "num_steps=65: must be <= MAX_NUM_STEPS=64"),
        (lambda: SpeculativeConfig(10**6, 1), "num_steps=1000000: must be <= MAX_NUM_STEPS=64"),
        (lambda: SpeculativeConfig(2, MAX_TOPK + 1, 8), "topk=65: must be <= MAX_TOPK=64"),
        (lambda: SpeculativeConfig(2, 64, MAX_NUM_DRAFT_TOKENS + 1),
         "num_draft_tokens=1025: must be <= MAX_NUM_DRAFT_TOKENS=1024"),
        (lambda: SpeculativeConfig(2, 64, tree_choices=tuple((r,) for r in range(64)) + tuple(
            (r, c) for r in range(64) for c in range(64))), "tree_choices has 4160 paths"),
    ]:
        with pytest.raises(ValueError, match=frag):
            make()


def test_override_of_a_million_steps_is_refused_at_once_and_the_worker_serves():
    w = _serving()
    before, state, rss = _answer(w), w.state, _maxrss_kb()
    for s in (10**6, 10_000):
        with pytest.raises(ValueError, match=f"num_steps={s}: must be <= MAX_NUM_STEPS"):
            with w.override_worker_state(s):
                pass
    assert _maxrss_kb() - rss < 20_000  # KB: nothing of the old 2.7 GB (S=10,000) was allocated
    assert w.state is state and _same(_answer(w), before)


# ---- the state budget --------------------------------------------------------------------------
def test_the_estimate_covers_what_a_state_allocates():
    """The topology and static-input parts of the estimate equal the bytes a real state holds."""
    for spec in (SpeculativeConfig(3, 1), SpeculativeConfig(3, 2, tree_choices=((0,), (1,), (0, 0), (1, 0), (0, 0, 0))),
                 SpeculativeConfig(1, 1), SpeculativeConfig(3, 2, 6)):
        args = _args(spec, bs=(1, 2, 4, 8), mrr=12)
        w = EagleDraftWorker(args, MODEL)
        w.capture_graphs("trace")
        est = estimate_state_bytes(spec, chain_capacity(args), 8, MODEL.hidden_size * 4)
        buf = w.state.topology_buffers
        assert est.topology == (buf.nbytes if buf is not None else 0), spec
        static = w.state.graphs.static_inputs
        assert est.graph_inputs == sum(t.numel() * t.element_size() for t in static.values()), spec


@pytest.mark.parametrize("how", ["override", "build", "reload", "request_reload", "new worker"])
def test_over_budget_states_are_refused_before_anything_changes(how):
    w = _serving()
    before, state, rss = _answer(w), w.state, _maxrss_kb()
    huge_pool = _args(mrr=10**8)  # 10^8 topology rows: about 17 GiB for a chain of 3
    frag = r"needs about [\d,.]+ MiB .*over max_state_bytes=1073741824"
    with pytest.raises(ValueError, match=frag) as info:
        if how == "override":
            with w.override_worker_state(3, capture_bs=[10**7]):
                pass
        elif how == "build":
            w.build_runtime_state(3, capture_bs=[10**7])
        elif how == "reload":
            w.reload(huge_pool, policy="release_first")
        elif how == "request_reload":
            w.request_reload(huge_pool)
        else:
            EagleDraftWorker(huge_pool, MODEL)
    assert _maxrss_kb() - rss < 20_000
    assert "num_steps=3, topk=1, num_draft_tokens=4" in str(info.value)
    assert "max_running_requests" in str(info.value) and "raise max_state_bytes" in str(info.value)
    assert w.state is state and w.state.has_graphs and _same(_answer(w), before)
    assert w.counters.failed_reloads == 0  # refused before it started


def test_max_state_bytes_raises_and_lowers_the_bound():
    small = _args(max_state_bytes=1024)  # a chain of 3, 8 rows, graphs to 4: ~2 KB
    with pytest.raises(ValueError, match="over max_state_bytes=1024"):
        EagleDraftWorker(small, MODEL)
    w = EagleDraftWorker(small.replace(max_state_bytes=DEFAULT_MAX_STATE_BYTES), MODEL)
    with pytest.raises(ValueError, match="max_state_bytes"):
        w.reload(small)
    big = _args(mrr=3_000_000)  # chain of 3: ~550 MiB of topology rows; refused under 100 MiB
    with pytest.raises(ValueError, match="over max_state_bytes=104857600"):
        EagleDraftWorker(big.replace(max_state_bytes=100 * 2**20), MODEL)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_state_bytes"):
            _args(max_state_bytes=bad)


def test_the_engine_refuses_an_over_budget_reload_and_serves_on():
    from engine_support import MAX_NEW, models, prompts, reference

    from draftgraph.runtime.engine import SpecDecodeEngine
    target, head = models("eagle")
    engine = SpecDecodeEngine(_args(bs=(1, 2, 4), mrr=4), target, head, backend="eager")
    ids = [engine.add_request(list(p), MAX_NEW) for p in prompts()[:4]]
    engine.step()
    with pytest.raises(ValueError, match="max_state_bytes"):  # refused when requested
        engine.request_reload(_args(mrr=4, max_state_bytes=1024))
    assert engine.worker.slot.pending is None  # nothing left pending
    while engine.has_work():
        engine.step()
    assert [engine.pop_result(i) for i in ids] == reference()[:4]
    assert engine.worker.args.max_running_requests == 4 and engine.worker.generation == 0


# ---- reload files ------------------------------------------------------------------------------
def _damaged(tmp_path) -> dict[str, str]:
    """name -> path of a damaged or refused runtime args file."""
    out = {}

    def write(name: str, data: str | bytes) -> None:
        p = tmp_path / name
        (p.write_bytes if isinstance(data, bytes) else p.write_text)(data)
        out[name] = str(p)

    write("empty.json", "")
    write("truncated.json", '{"speculative": {"num_steps": 3,')
    write("binary.json", b"\xff\xfe\x00garbage\x80")
    write("list.json", "[1, 2, 3]")
    write("deep.json", "[" * 100_000 + "]" * 100_000)
    write("deep_value.json", '{"speculative": {"num_steps": 3, "topk": 2, "tree_choices": '
          + "[" * 50_000 + "]" * 50_000 + "}}")
    write("deep_object.json", '{"a":' * 50_000 + "1" + "}" * 50_000)
    write("huge_int.json", '{"speculative": {"num_steps": ' + "9" * 10_000 + ', "topk": 1}}')
    write("million_steps.json", json.dumps({"speculative": {"num_steps": 1_000_000, "topk": 1}}))
    write("nan.json", '{"speculative": {"num_steps": NaN, "topk": 1}}')
    write("deep.toml", "a = " + "[" * 50_000 + "]" * 50_000 + "\n")
    write("million_steps.toml", "[speculative]\nnum_steps = 1000000\ntopk = 1\n")
    write("bad.toml", "[speculative\nnum_steps = 3\n")
    (tmp_path / "a_directory.json").mkdir()
    out["a_directory.json"] = str(tmp_path / "a_directory.json")
    out["missing.json"] = str(tmp_path / "missing.json")
    return out


def test_every_damaged_file_is_a_value_error_naming_it(tmp_path):
    for name, path in _damaged(tmp_path).items():
        with pytest.raises(ValueError) as info:
            load_runtime_args(path)
        assert name in str(info.value), (name, info.value)
        if name.startswith("million_steps"):
            assert "num_steps=1000000: must be <= MAX_NUM_STEPS=64" in str(info.value)
        if name.startswith("deep"):
            assert "RecursionError" in str(info.value), name


def test_sighup_with_a_damaged_file_reports_and_serves(tmp_path, caplog):
    w = _serving()
    before = _answer(w)
    for name, path in _damaged(tmp_path).items():
        uninstall = install_reload_signal(w, path)
        try:
            with caplog.at_level(logging.ERROR, logger="draftgraph.runtime.args_file"):
                os.kill(os.getpid(), signal.SIGHUP)
            assert _same(_answer(w), before), name
        finally:
            uninstall()
        assert name in caplog.text, name
    assert w.slot.pending is None and w.generation == 0


def test_simulate_reload_from_a_damaged_file_reports_and_serves(tmp_path, capsys):
    from engine_support import MAX_NEW, models, prompts, reference

    from draftgraph.runtime.commands.simulate import _reload_from
    from draftgraph.runtime.engine import SpecDecodeEngine
    target, head = models("eagle")
    engine = SpecDecodeEngine(_args(mrr=4), target, head, backend="eager")
    ids = [engine.add_request(list(p), MAX_NEW) for p in prompts()[:4]]
    for name, path in _damaged(tmp_path).items():
        _reload_from(engine, path, "test")
        assert "reload rejected (test), still serving the previous state: runtime args file" in \
            capsys.readouterr().err, name
        engine.step()
    while engine.has_work():
        engine.step()
    assert [engine.pop_result(i) for i in ids] == reference()[:4]
    reloads = engine.stats()["reloads"]
    assert reloads["recent"] == [] and reloads["requested"] == reloads["applied"] == 0

