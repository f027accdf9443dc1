"""Draft weights refit in place under live graphs: checked first, copied at a step boundary,
never read stale, and a drafter that stops helping is noticed."""

from __future__ import annotations

import copy
import functools
import logging
import threading

import pytest
import torch
from engine_support import MAX_NEW, engine_args, models, prompts, reference, tiny_worker

from draftgraph.graphs.compile.inductor import compiler_available
from draftgraph.runtime import (
    EagleDraftWorker,
    SpeculativeConfig,
    StaleWeightsError,
)
from draftgraph.runtime.engine import AcceptanceWatch, SpecDecodeEngine
from draftgraph.runtime.testing import TinyDraftModel, make_draft_input

_args = functools.partial(engine_args, running=8)  # a chain of 3, graphs up to 4, eight request slots
TINY = SpeculativeConfig(3, 2, 6)  # the tiny workers' draft shape


def _random_like(sd: dict, seed: int = 1) -> dict:
    """Random floating weights of the same shapes; integer tensors (an EAGLE-3 head's ``d2t``
    id map) kept, so the head still drafts ids of the target's vocabulary."""
    gen = torch.Generator().manual_seed(seed)
    return {k: torch.randn(v.shape, generator=gen, dtype=v.dtype) * float(v.float().std() + 0.1)
            if v.is_floating_point() else v.clone() for k, v in sd.items()}


def _phase(engine: SpecDecodeEngine, n: int = 8) -> tuple[list[list[int]], float]:
    """Serve n prompts; (outputs, mean acceptance length of this phase)."""
    engine.reset_stats()
    outs = engine.generate([list(p) for p in prompts()[:n]], MAX_NEW)
    return outs, engine.stats()["accept_length_mean"]


@pytest.mark.parametrize("backend", ["eager", "trace"])
def test_random_weights_then_the_original_ones(backend):
    target, head = models()
    original = {k: v.clone() for k, v in head.state_dict().items()}
    # graphs up to 8: the 8 requests of a phase may run together to the end (they did for a head
    # trained on another Python's standard library), and a batch of 8 must replay too
    engine = SpecDecodeEngine(_args(max_bs=8), target, head, backend=backend, capture="blocking",
                              acceptance_watch=None)
    ptrs = [p.data_ptr() for p in engine.drafter.head.parameters()]
    outs, base = _phase(engine)
    assert outs == reference()[:8] and base > 2.0
    assert engine.update_draft_weights(_random_like(original)) == 1
    outs, low = _phase(engine)
    assert outs == reference()[:8] and low < 1.1  # lossless, the drafter no longer helps
    assert engine.update_draft_weights(original) == 2
    outs, back = _phase(engine)
    assert outs == reference()[:8] and back == base  # exactly the base figure again
    assert [p.data_ptr() for p in engine.drafter.head.parameters()] == ptrs  # in place
    w = engine.stats()["draft_weights"]
    assert w["version"] == w["updates"] == 2 and w["updated_at"] is not None and not w["pending"]
    if backend == "trace":
        assert engine.stats()["graph_replays"] > 0 and engine.worker.reloads.log.requested == 0


def test_the_passed_model_is_copied():
    target, shared = models()
    head = copy.deepcopy(shared)  # the cached models are shared by the tests: zero a copy
    engine = SpecDecodeEngine(_args(), target, head, backend="eager")
    assert engine.drafter.head is not head
    with torch.no_grad():
        for p in head.parameters():
            p.zero_()  # the caller's model: the engine serves its own copy
    outs, acc = _phase(engine, 4)
    assert outs == reference()[:4] and acc > 2.0


# the default EAGLE-3 head's keys (published layout)
O_PROJ, Q_PROJ = "midlayer.self_attn.o_proj.weight", "midlayer.self_attn.q_proj.weight"
UP_PROJ = "midlayer.mlp.up_proj.weight"
BAD = [
    ("missing", lambda sd: {k: v for k, v in sd.items() if k != "fc.weight"}, ValueError,
     "missing keys \\['fc.weight'\\]"),
    ("unknown", lambda sd: {**sd, "extra.weight": torch.zeros(2)}, ValueError,
     "unknown keys \\['extra.weight'\\]"),
    ("shape", lambda sd: {**sd, O_PROJ: sd[O_PROJ][:, :-1]}, ValueError,
     rf"state_dict\['{O_PROJ}'\] has shape"),
    ("dtype", lambda sd: {**sd, "fc.weight": sd["fc.weight"].float()}, TypeError,  # the head is float64
     "state_dict\\['fc.weight'\\] has dtype torch.float32"),
    ("nan", lambda sd: {**sd, UP_PROJ: sd[UP_PROJ].clone().fill_(float("nan"))}, ValueError,
     rf"state_dict\['{UP_PROJ}'\] holds NaN"),
    ("inf", lambda sd: {**sd, Q_PROJ: torch.full_like(sd[Q_PROJ], float("inf"))}, ValueError,
     rf"'{Q_PROJ}'\] holds NaN or inf"),
    ("device", lambda sd: {**sd, Q_PROJ: sd[Q_PROJ].to("meta")}, ValueError, rf"'{Q_PROJ}'\] is on meta"),
    ("not a tensor", lambda sd: {**sd, Q_PROJ: [1.0, 2.0]}, TypeError, rf"state_dict\['{Q_PROJ}'\]=list"),
    ("not a mapping", lambda sd: list(sd.items()), TypeError, "must be a mapping"),
    # issue 32: finite but beyond what the draft computes with; a sparse tensor
    ("huge", lambda sd: {**sd, Q_PROJ: torch.full_like(sd[Q_PROJ], 1e38)}, ValueError,
     rf"'{Q_PROJ}'\] holds a value of magnitude 1e\+38"),
    ("sparse", lambda sd: {**sd, Q_PROJ: sd[Q_PROJ].to_sparse()}, TypeError,
     rf"'{Q_PROJ}'\] is a torch.sparse_coo tensor"),
]


@pytest.mark.parametrize("case,make,exc,match", BAD, ids=[b[0] for b in BAD])
def test_a_bad_state_dict_changes_nothing(case, make, exc, match):
    target, head = models()
    engine = SpecDecodeEngine(_args(), target, head, backend="eager")
    before = {k: v.clone() for k, v in engine.drafter.head.state_dict().items()}
    with pytest.raises(exc, match=match):
        engine.update_draft_weights(make(_random_like(before)))
    assert not engine.stats()["draft_weights"]["pending"]
    engine.step()
    after = engine.drafter.head.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert engine.stats()["draft_weights"]["version"] == 0


def test_strict_false_with_no_shared_key_is_refused_naming_the_expected_keys():
    target, head = models()
    engine = SpecDecodeEngine(_args(), target, head, backend="eager")
    other = torch.nn.Linear(4, 4).state_dict()  # another model's state dict
    with pytest.raises(ValueError, match=r"none of its 2 keys is the draft's .*expects keys such as \['"):
        engine.update_draft_weights(other, strict=False)
    engine.step()
    assert engine.stats()["draft_weights"]["version"] == 0


def test_an_update_resets_the_drafts_carried_state():
    """A draft cache holding inf / NaN (what an update with a finite 1e38 left before issue 32)
    is cleared by the next update: acceptance is the base figure again, not 1.6-2.2."""
    target, head = models()
    original = {k: v.clone() for k, v in head.state_dict().items()}
    engine = SpecDecodeEngine(_args(), target, head, backend="eager", acceptance_watch=None)
    outs, base = _phase(engine)
    cache = engine.drafter.head.cache
    ptrs = [t.data_ptr() for t in (*cache.k, *cache.v)]
    for t in (*cache.k, *cache.v):
        t.view(-1)[::7] = float("inf")  # rows of every slot, as overflowing weights leave them
    assert engine.update_draft_weights(original) == 1
    outs, back = _phase(engine)
    assert outs == reference()[:8] and back == base
    assert all(bool(torch.isfinite(t).all()) for t in (*cache.k, *cache.v))
    assert [t.data_ptr() for t in (*cache.k, *cache.v)] == ptrs  # in place: graphs stay valid


def test_strict_false_updates_a_subset():
    target, head = models()
    engine = SpecDecodeEngine(_args(), target, head, backend="eager")
    new = torch.randn_like(engine.drafter.head.fc.weight)
    engine.update_draft_weights({"fc.weight": new}, strict=False)
    engine.step()
    assert torch.equal(engine.drafter.head.fc.weight, new)


def test_an_update_from_another_thread_while_8_requests_run():
    target, head = models()
    original = {k: v.clone() for k, v in head.state_dict().items()}
    engine = SpecDecodeEngine(_args(), target, head, backend="trace", capture="blocking")
    ids = [engine.add_request(list(p), MAX_NEW) for p in prompts()[:8]]
    steps = [0]
    errors: list[BaseException] = []
    go, applied = threading.Event(), threading.Event()

    def updater():
        try:
            go.wait(30)
            engine.update_draft_weights(_random_like(original))
            if not applied.wait(60):  # set by the serving thread once a step applied it
                raise AssertionError("the first update was never applied")
            engine.update_draft_weights(original)
        except BaseException as exc:  # reported below
            errors.append(exc)

    t = threading.Thread(target=updater)
    t.start()
    while engine.has_work():
        engine.step()
        steps[0] += 1
        if steps[0] == 2:
            go.set()
        if engine.stats()["draft_weights"]["version"] >= 1:
            applied.set()
    t.join(timeout=60)
    assert not t.is_alive() and not errors
    assert [engine.pop_result(i) for i in ids] == reference()[:8]
    engine.step()  # the second update lands at a boundary even if the requests ended first
    assert engine.stats()["draft_weights"]["version"] == 2


def test_a_replaced_parameter_is_refused_never_read_stale():
    target, head = models()
    engine = SpecDecodeEngine(_args(), target, head, backend="trace", capture="blocking")
    ids = [engine.add_request(list(p), MAX_NEW) for p in prompts()[:4]]
    engine.step()
    same = {k: v.clone() for k, v in engine.drafter.head.state_dict().items()}
    engine.drafter.head.load_state_dict(same, assign=True)  # new storage, same values
    with pytest.raises(StaleWeightsError, match=r"draft parameter '.*' was replaced .*update_draft_weights"):
        engine.step()
    engine.request_reload(engine.args)  # the way out it names: capture again
    while engine.has_work():
        engine.step()
    assert [engine.pop_result(i) for i in ids] == reference()[:4]
    assert engine.stats()["graph_replays"] > 0


def _outputs(w: EagleDraftWorker, b: int, seed: int) -> list[torch.Tensor]:
    return [t.clone() for t in w.draft_forward(make_draft_input(b, 2, seed=seed))]


@pytest.mark.parametrize("backend", [
    "trace", pytest.param("compile", marks=[pytest.mark.skipif(not compiler_available(),
                                                               reason="no C++ compiler for inductor"),
                                            pytest.mark.slow])])  # the slow tier: inductor compiles
def test_graphs_read_the_new_weights_after_an_update(backend):
    """No backend freezes weights into its code: after an in-place update a replay equals a
    fresh eager worker built on the new weights."""
    w = tiny_worker(TINY, bs=(2, 4), backend=backend, model=TinyDraftModel(seed=0))
    fresh_model = TinyDraftModel(seed=7)
    before = _outputs(w, 3, 11)
    assert w.update_draft_weights(fresh_model.state_dict()) == 1
    replays = w.counters.graph_replays
    got = _outputs(w, 3, 11)  # the update lands at the start of this step
    assert w.counters.graph_replays == replays + 1 and w.weights.version == 1
    want = _outputs(tiny_worker(TINY, bs=(2, 4), backend="eager", model=fresh_model), 3, 11)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)
    assert any(not torch.equal(g, b) for g, b in zip(got, before))  # the weights mattered


def test_worker_refuses_a_replaced_parameter_by_name():
    model = TinyDraftModel(seed=0)
    w = tiny_worker(TINY, bs=(2, 4), backend="trace", model=model)
    _outputs(w, 2, 1)
    model.mix = torch.nn.Parameter(model.mix.detach().clone(), requires_grad=False)
    with pytest.raises(StaleWeightsError, match="draft parameter 'mix' was replaced"):
        _outputs(w, 2, 1)
    eager = tiny_worker(TINY, bs=(2, 4), backend="eager", model=model)  # no graph: eager reads the module as it is now
    _outputs(eager, 2, 1)


@pytest.mark.slow  # the slow tier: two serving phases of 16 requests
def test_a_drafter_that_stops_helping_is_noticed_once(caplog):
    target, head = models()
    original = {k: v.clone() for k, v in head.state_dict().items()}
    engine = SpecDecodeEngine(_args(), target, head, backend="eager",
                              acceptance_watch=AcceptanceWatch(window_steps=8, min_accept_length=1.1))
    with caplog.at_level(logging.WARNING, logger="draftgraph.runtime.engine.acceptance"):
        _phase(engine, 16)
        assert engine.stats()["acceptance_watch"]["window_mean"] is not None  # the window filled
        assert engine.stats()["acceptance_watch"]["warnings"] == 0
        engine.update_draft_weights(_random_like(original))
        _phase(engine, 16)
    watch = engine.stats()["acceptance_watch"]
    assert watch["low"] and watch["warnings"] == 1 and watch["window_mean"] < 1.1
    assert watch["last_warning"]["weights_version"] == 1 and watch["last_warning"]["window_steps"] == 8
    lines = [r.getMessage() for r in caplog.records if "draft acceptance is low" in r.getMessage()]
    assert len(lines) == 1 and "over the last 8 steps" in lines[0] and "version 1" in lines[0]
    engine.update_draft_weights(original)
    _phase(engine, 16)
    assert not engine.stats()["acceptance_watch"]["low"]


@pytest.mark.parametrize("bad", [dict(window_steps=0), dict(min_accept_length=0.5),
                                 dict(window_steps=True), dict(min_accept_length="1.2")])
def test_acceptance_watch_validation(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        AcceptanceWatch(**bad)


def test_multi_layer_engine_updates_in_place():
    target, draft = models("multi_layer")
    engine = SpecDecodeEngine(_args(), target, draft, backend="eager")
    original = {k: v.clone() for k, v in draft.state_dict().items()}
    _, base = _phase(engine, 4)
    engine.update_draft_weights(_random_like(original))
    outs, low = _phase(engine, 4)
    assert outs == reference()[:4] and low < base
    engine.update_draft_weights(original)
    outs, back = _phase(engine, 4)
    assert outs == reference()[:4] and back == base
