"""The whole step in graphs: target verify and draft extend captured per runtime state (trace
backend: the CPU's capture semantics), per size, width and KV window tier; lossless; swapped with
the state; a failed phase serves eager and the others keep their graphs."""

from __future__ import annotations

import pytest
import torch
from engine_support import MAX_NEW, engine_args, models, prompts, reference

from draftgraph.graphs import record_spans
from draftgraph.graphs.compile.inductor import compiler_available
from draftgraph.graphs.core import backend_trace
from draftgraph.runtime import SpeculativeConfig
from draftgraph.runtime.compile_store import CompileStore
from draftgraph.runtime.engine import SpecDecodeEngine
from draftgraph.runtime.engine.limits import MAX_VERIFY_WIDTH
from draftgraph.runtime.engine.phases import EnginePhases, default_tiers
from draftgraph.runtime.models.greedy import greedy_generate
from draftgraph.runtime.worker import stored_steps
from draftgraph.runtime.worker.host_phases import GraphStep

PHASES = ("verify", "extend")
TREE = SpeculativeConfig(3, 2, 6)  # N = 6 tree tokens, S + 1 = 4 accepted rows at most
TIERS = (128, 512)  # two windows keep the captures few; the default adds 256


def _engine(spec: SpeculativeConfig, **kw) -> SpecDecodeEngine:
    target, head = models("eagle")
    return SpecDecodeEngine(engine_args(spec, bs=(2, 4), running=6), target, head, backend="trace",
                            capture="blocking", graph_phases=PHASES, kv_tiers=TIERS, **kw)


def _run(engine: SpecDecodeEngine) -> list[list[int]]:
    return engine.generate([list(p) for p in prompts()], MAX_NEW)


def test_default_tiers_end_at_the_cache_length():
    assert default_tiers(512) == (128, 256, 512)
    assert default_tiers(200) == (200,)
    target, head = models("eagle")
    with pytest.raises(ValueError, match="tiers=.*end at the cache length 512"):
        EnginePhases(target, target.new_cache(2), None, (128, 256))
    with pytest.raises(TypeError, match="tiers=.*not an int"):
        EnginePhases(target, target.new_cache(2), None, (128.0, 512))
    with pytest.raises(ValueError, match="phases=.*unknown"):
        EnginePhases(target, target.new_cache(2), None, (512,), ("verify", "prefill"))


def test_each_phase_captured_per_size_width_and_tier_and_lossless():
    engine = _engine(TREE)
    try:
        phases = engine.worker.state.phases
        assert set(phases.names) == {"verify@128", "verify@512", "extend@128", "extend@512"}
        for name, manager in phases.managers.items():
            assert manager.captured_sizes == (2, 4), name
            inputs = manager.static_inputs
            if name.startswith("verify"):
                assert inputs["tokens"].shape == (4, 6)  # width N
                assert inputs["tree_mask"].shape == (4, 6, 6)
            else:
                assert inputs["path"].shape == (4, 4)  # width S + 1
                assert inputs["hidden"].shape[:2] == (4, 6)
        with record_spans() as spans:
            assert _run(engine) == reference()
        ran = [a for name, a in spans if name == "phase"]
        assert {"phase": "verify@128", "bs": 4, "mode": "graph", "padded": 4} in ran
        assert any(a["phase"] == "extend@128" and a["mode"] == "graph" for a in ran)
        for a in ran:  # a graph replays at the smallest captured size that holds the batch
            if a["mode"] == "graph":
                assert a["padded"] == (2 if a["bs"] <= 2 else 4), a
        assert any(a["mode"] == "eager" and a["reason"] == "above_max" and a["bs"] > 4 for a in ran)
        figures = phases.describe()
        assert figures["verify@128"]["replays"] > 0
        assert figures["extend@128"]["replays"] > 0
        st = engine.stats()["phases"]
        assert st["verify"]["graphs"] == st["extend"]["graphs"] == 4
        assert st["verify"]["replays"] == figures["verify@128"]["replays"] + figures["verify@512"]["replays"]
        # b = 5, 6 are above the largest size: eager, counted by reason
        assert st["verify"]["eager_steps_by_reason"].get("above_max", 0) > 0
        assert st["verify"]["capture_s"] > 0
    finally:
        engine.close()


def test_lengths_up_to_the_cache_cross_every_tier_without_a_new_capture():
    """Windows (length + N) from the first token to the longest request admission allows cross
    every default tier boundary (128, 256, 512): each tier's graphs replay, none is captured
    again, no step falls back to eager, and the outputs are greedy's. One token more than the
    cache allows is refused at admission."""
    target, head = models("eagle")
    engine = SpecDecodeEngine(engine_args(SpeculativeConfig(3, 1), bs=(1,), running=1), target, head,
                              backend="trace", capture="blocking", graph_phases=PHASES)
    try:
        phases = engine.worker.state.phases
        assert set(phases.names) == {f"{p}@{lk}" for p in PHASES for lk in (128, 256, 512)}
        captures = {n: m.stats.captures for n, m in phases.managers.items()}
        text = [t for p in prompts() for t in p]  # the held-out prompts, back to back
        room = target.cfg.max_len - MAX_VERIFY_WIDTH  # admission keeps this much for a request
        # (prompt, new tokens): the first token; windows across 128; across 256; the last one admitted
        cases = [(1, 12), (118, 16), (246, 16), (room - 40, 40)]
        with record_spans() as spans:
            for n, new in cases:
                prompt = text[:n]
                assert engine.generate([prompt], new) == greedy_generate(target, [prompt], new), n
        ran = [a for name, a in spans if name == "phase"]
        assert ran and all(a["mode"] == "graph" for a in ran)  # every length served by a graph
        figures = phases.describe()
        for name in phases.names:
            assert figures[name]["replays"] > 0, name
        assert {n: m.stats.captures for n, m in phases.managers.items()} == captures  # none recaptured
        with pytest.raises(ValueError, match="max_len=512"):
            engine.add_request(text[:room - 40 + 1], 40)  # one position past the cache's room
        assert not engine.has_work()  # nothing half-admitted
    finally:
        engine.close()


@pytest.mark.slow
def test_a_switch_replays_the_verify_graph_of_the_new_width():
    engine = _engine(SpeculativeConfig(3, 1))
    try:
        worker = engine.worker
        s3 = worker.state
        s1 = worker.build_runtime_state(1, backend="trace")  # N = 2: verify graphs of width 2
        assert s1.phases.managers["verify@128"].static_inputs["tokens"].shape[1] == 2
        worker.apply_runtime_state(s1)
        assert _run(engine) == reference()
        before = {n: f["replays"] for n, f in s3.phases.describe().items()}
        assert s1.phases.describe()["verify@128"]["replays"] > 0
        worker.apply_runtime_state(s3)
        s1_after = {n: f["replays"] for n, f in s1.phases.describe().items()}
        assert _run(engine) == reference()
        assert s3.phases.describe()["verify@128"]["replays"] > before["verify@128"]
        assert {n: f["replays"] for n, f in s1.phases.describe().items()} == s1_after  # never the old width
    finally:
        engine.close()


@pytest.mark.slow
def test_reload_and_a_target_only_band_stay_lossless():
    target, head = models("eagle")
    # S = 0 from 5 requests on: plain target steps (width-1 graphs at 8) beside graphed speculative ones
    args = engine_args(SpeculativeConfig(3, 1), bs=(4, 8), running=6)
    engine = SpecDecodeEngine(args, target, head, backend="trace", capture="blocking", graph_phases=PHASES,
                              kv_tiers=TIERS, schedule="1:3,5:0")
    try:
        ids = [engine.add_request(list(p), MAX_NEW) for p in prompts()]
        for _ in range(5):
            engine.step()
        plain = engine.policy.targets[1]
        assert engine.worker.state is plain and plain.phases.describe()["verify@128"]["replays"] == 5
        engine.request_reload(engine_args(SpeculativeConfig(2, 1), bs=(4, 8), running=6, schedule=None))
        while engine.has_work():
            engine.step()
        assert [engine.result(i) for i in ids] == reference()
        assert engine.stats()["reloads"]["applied"] == 1
        assert plain.phases is None  # the reload released the state it replaced
        assert engine.policy.targets[1].phases.describe()["verify@128"]["replays"] > 0  # the new one's
    finally:
        engine.close()


def test_a_failed_phase_serves_eager_and_the_others_keep_their_graphs(monkeypatch):
    def broken(self, n, lk, rows):
        step = original(self, n, lk, rows)

        def fails(**inputs):
            raise RuntimeError("verify kernel unavailable")

        return GraphStep(fails, step.static_inputs, step.pad_values)

    original = EnginePhases._verify_step
    monkeypatch.setattr(EnginePhases, "_verify_step", broken)
    engine = _engine(SpeculativeConfig(3, 1))
    try:
        phases = engine.worker.state.phases
        assert set(phases.failed) == {"verify@128", "verify@512"}
        assert "verify kernel unavailable" in phases.failed["verify@128"]
        assert _run(engine) == reference()
        st = engine.stats()
        assert st["phases"]["verify"]["failed"] == 2
        assert st["phases"]["verify"]["replays"] == 0
        assert st["phases"]["verify"]["eager_steps_by_reason"]["capture_failed"] > 0
        assert st["phases"]["extend"]["replays"] > 0
        assert st["graph_replays"] > 0  # the draft step too
    finally:
        engine.close()


@pytest.mark.slow
@pytest.mark.skipif(not compiler_available(), reason="no C++ compiler for inductor")
def test_compiled_phases_keep_their_code_and_load_from_the_store(tmp_path, monkeypatch):
    """The compile backend keeps a phase's compiled code only when it equals the FX replay to the
    bit (the verify's reductions run ATen's kernels); a second engine loads every phase unit."""
    store = CompileStore(tmp_path / "store")
    monkeypatch.setenv("DRAFTGRAPH_COMPILED", "1")
    monkeypatch.setattr(stored_steps, "default_compile_store", lambda: store)
    target, head = models("eagle")

    def build(capture: str) -> SpecDecodeEngine:
        return SpecDecodeEngine(engine_args(SpeculativeConfig(3, 1), bs=(2,), running=2), target, head,
                                backend="compile", capture=capture, graph_phases=PHASES, kv_tiers=TIERS)

    prompts_ = [list(p) for p in prompts()[:4]]
    want = greedy_generate(target, prompts_, 16)
    first = build("blocking")
    try:
        phases = first.worker.state.phases
        for name, manager in phases.managers.items():
            size = manager.stats.sizes[2]
            assert (size.engine, size.fallback, size.source) == ("inductor", None, "recorded"), name
        assert first.generate(prompts_, 16) == want
        assert first.stats()["phases"]["verify"]["replays"] > 0
    finally:
        first.close()
    assert len(_code_entries(tmp_path / "store")) == 1 + 4  # the draft step's size, 4 phase units
    monkeypatch.setattr(backend_trace, "record_graph", _no_recording)
    second = build("background")  # queued: stored units load at construction
    try:
        sources = {n: m.stats.sizes[2].source for n, m in second.worker.state.phases.managers.items()}
        # in this process the code compiled above is reused ("shared"); a fresh one loads it
        # from the store ("loaded": test_compiled_steps' fresh-process test, the same route)
        assert set(sources.values()) <= {"loaded", "shared"}, sources
        assert second.startup()["units_compiled"] == 0
        assert second.generate(prompts_, 16) == want
    finally:
        second.close()


def _no_recording(*_a, **_k):
    raise AssertionError("recorded a step that the store holds")


def _code_entries(folder):
    """The store's entries of compiled code (not its own unit-seconds entry)."""
    from draftgraph.runtime.compile_store import _UNIT_SECONDS_KEY

    return [p for p in folder.glob("*.dgc") if p.stem != _UNIT_SECONDS_KEY]


def test_the_multi_layer_draft_graphs_its_verify():
    """The multi-layer draft has no extend step (its carried feature is the target's hidden
    state): its states hold verify graphs only, and stay lossless."""
    target, draft = models("multi_layer")
    engine = SpecDecodeEngine(engine_args(SpeculativeConfig(3, 1), bs=(2, 4), running=6), target, draft,
                              backend="trace", capture="blocking", graph_phases=PHASES, kv_tiers=(512,))
    try:
        phases = engine.worker.state.phases
        assert set(phases.names) == {"verify@512"}
        assert _run(engine) == reference()
        st = engine.stats()["phases"]
        assert st["verify"]["replays"] > 0 and "extend" not in st
    finally:
        engine.close()


def test_a_phase_provider_must_be_callable(make_worker):
    worker = make_worker(backend=None)
    with pytest.raises(TypeError, match="provider=5: must be callable"):
        worker.capture.set_phase_provider(5)
    assert worker.capture.phase_provider is None  # nothing half-set


def _steps(spans) -> list[tuple[dict, list[dict]]]:
    """Per step: its ``served`` range and the ``phase`` ranges that follow it."""
    out: list[tuple[dict, list[dict]]] = []
    for name, attrs in spans:
        if name == "served":
            out.append((attrs, []))
        elif name == "phase" and out:
            out[-1][1].append(attrs)
    return out


def test_a_plain_target_band_replays_its_width_1_graphs_and_never_the_other_width():
    """A schedule band at S = 0 has a target-only state whose verify graph is width 1 (its
    extend is held for the head's next draft, `held_extends`: no extend graph); its steps replay
    it (padded to the band's size), the drafting band's steps replay their own width-N graphs,
    across switches both ways, and every output is the greedy one."""
    target, head = models("eagle")
    # bands: 1-2 requests draft S = 3 (graphs at 2), 3+ plain target steps (graphs at 4)
    engine = SpecDecodeEngine(engine_args(SpeculativeConfig(3, 1), bs=(2, 4), running=6), target, head,
                              backend="trace", capture="blocking", graph_phases=PHASES, kv_tiers=(512,),
                              schedule="1:3,3:0")
    try:
        plain = engine.policy.targets[1]
        drafting = engine.policy.controllers[0].states[3]
        assert plain.target_only and plain.capture_sizes == (4,) and plain.graphs is None
        assert plain.phases.managers["verify@512"].static_inputs["tokens"].shape == (4, 1)
        assert set(plain.phases.managers) == {"verify@512"}  # the plain steps' extend is held
        assert drafting.phases.managers["verify@512"].static_inputs["tokens"].shape == (2, 4)
        assert [(s["num_steps"], s["num_draft_tokens"]) for s in engine.startup()["states"]
                if s.get("target_only")] == [(0, 1)]
        ps = [list(p) for p in prompts()[:6]]
        news = [6, 30, 10, 14, 18, 22]
        with record_spans() as spans:
            ids = [engine.add_request(ps[i], news[i]) for i in range(2)]
            for _ in range(3):  # two requests: S = 3
                engine.step()
            ids += [engine.add_request(ps[i], news[i]) for i in range(2, 6)]
            while engine.has_work():  # 5, then fewer: S = 0, then S = 3 again
                engine.step()
        want = [greedy_generate(target, [p], n)[0] for p, n in zip(ps, news)]
        assert [engine.pop_result(i) for i in ids] == want
        steps = _steps(spans)
        s0 = [(served, ran) for served, ran in steps if served["S"] == 0]
        s3 = [(served, ran) for served, ran in steps if served["S"] == 3]
        assert s0 and s3 and steps[0][0]["S"] == 3 and steps[-1][0]["S"] == 3  # both ways
        for served, ran in s0:
            assert [a["phase"] for a in ran] == ["verify@512"] or served["bs"] > 4
            for a in ran:
                if served["bs"] <= 4:
                    assert (a["mode"], a["padded"]) == ("graph", 4), (served, a)
                else:
                    assert (a["mode"], a["reason"]) == ("eager", "above_max"), (served, a)
        for _, ran in s3:
            assert all(a["mode"] == "graph" and a["padded"] == 2 for a in ran if a["phase"] == "verify@512")
        # each state's replays are its own band's steps: neither replayed the other's width
        plain_steps = sum(1 for served, _ in s0 if served["bs"] <= 4)
        draft_steps = sum(1 for served, _ in s3 if served["bs"] <= 2)
        assert plain_steps > 0 and any(served["bs"] > 4 for served, _ in s0)
        assert plain.phases.describe()["verify@512"]["replays"] == plain_steps
        assert drafting.phases.describe()["verify@512"]["replays"] == draft_steps
        st = engine.stats()["phases"]
        assert st["verify"]["replays"] == plain_steps + draft_steps
        assert st["verify"]["eager_steps_by_reason"]["above_max"] == len(s0) - plain_steps

        # without its target-only state, the S = 0 band's steps run with the drafting state
        # active: eager, never its width-N graphs
        engine.policy.targets[1] = None
        before = {"plain": plain.phases.describe()["verify@512"]["replays"],
                  "drafting": drafting.phases.describe()["verify@512"]["replays"]}
        with record_spans() as spans:
            assert engine.generate(ps[:4], 6) == [greedy_generate(target, [p], 6)[0] for p in ps[:4]]
        steps = _steps(spans)
        assert any(served["S"] == 0 for served, _ in steps)
        assert all(not ran for served, ran in steps if served["S"] == 0)  # no phase at all
        assert plain.phases.describe()["verify@512"]["replays"] == before["plain"]
        assert drafting.phases.describe()["verify@512"]["replays"] == before["drafting"] + sum(
            1 for served, _ in steps if served["S"] == 3)
    finally:
        engine.close()


def _drafted(engine: SpecDecodeEngine, ps: list[list[int]], new: int) -> tuple[list[list[int]], list]:
    """Serve ``ps``: (outputs, the draft tokens of every step, in order)."""
    drafts: list = []
    draft = engine.drafter.draft

    def recording(slots, batch):
        out = draft(slots, batch)
        drafts.append(out.draft_tokens.tolist())  # a replay's outputs are views: read them now
        return out

    engine.drafter.draft = recording
    try:
        return engine.generate(ps, new), drafts
    finally:
        del engine.drafter.draft


def test_a_draft_refit_reaches_the_captured_extend_graphs():
    """`update_draft_weights` copies in place: the next steps' drafts, whose inputs come from the
    captured extend graphs and whose tokens from the captured draft step, are those of an eager
    engine refit with the same weights, and not the drafts of the weights before."""
    target, head = models("eagle")
    original = {k: v.clone() for k, v in head.state_dict().items()}
    gen = torch.Generator().manual_seed(3)
    # other weights altogether (noise of one std around the trained ones left some heads drafting
    # the very same tokens): random of the trained spread; d2t, the id map, stays
    refit = {k: torch.randn(v.shape, generator=gen, dtype=v.dtype) * float(v.float().std() + 0.1)
             if v.is_floating_point() else v for k, v in head.state_dict().items()}
    args = engine_args(SpeculativeConfig(3, 1), bs=(4,), running=4)
    graphed = SpecDecodeEngine(args, target, head, backend="trace", capture="blocking", graph_phases=PHASES,
                               kv_tiers=(512,), acceptance_watch=None)
    eager = SpecDecodeEngine(args, target, head, backend="eager", acceptance_watch=None)
    try:
        ps = [list(p) for p in prompts()[:4]]
        want = greedy_generate(target, ps, 16)
        outs, before = _drafted(graphed, ps, 16)
        assert outs == want
        assert graphed.update_draft_weights(refit) == 1
        assert eager.update_draft_weights(refit) == 1
        extend = graphed.worker.state.phases.managers["extend@512"]
        replays = extend.stats.replays
        outs, after = _drafted(graphed, ps, 16)
        assert outs == want
        assert extend.stats.replays > replays  # the extend graph served the refit steps
        eager_outs, eager_after = _drafted(eager, ps, 16)
        assert eager_outs == want
        assert after == eager_after  # the graphs drafted with the new weights, as eager did
        assert after != before  # and the new weights draft otherwise than the old ones
    finally:
        graphed.close()
        eager.close()
        with torch.no_grad():  # the head is shared by every test of this process
            head.load_state_dict(original)


def test_the_payoff_gate_serves_plain_steps_from_their_own_width_1_graphs():
    """Behind the gate (adaptive 0), a plain step serves from a target-only state's width-1
    verify graph, not an eager verify beside the graphs (its extend held); tokens stay greedy."""
    engine = _engine(SpeculativeConfig(2, 1), adaptive_steps=(0, 1, 2))
    try:
        plain = engine.policy.plain
        assert plain is not None and plain.state.target_only
        assert engine.generate([list(p) for p in prompts()], MAX_NEW) == reference()
        st = engine.stats()
        figures = plain.state.phases.describe()
        assert set(figures) == {"verify@128", "verify@512"}  # the plain steps' extend is held
        for name, manager in plain.state.phases.managers.items():
            assert manager.static_inputs["tokens"].shape[1] == 1, name
        replays = figures["verify@128"]["replays"] + figures["verify@512"]["replays"]
        assert st["payoff"]["plain_steps"] >= 3 and replays >= st["payoff"]["plain_steps"] - \
            st["phases"]["verify"]["eager_steps_by_reason"].get("above_max", 0)
        assert replays > 0
    finally:
        engine.close()


def test_on_the_cpu_the_verify_graph_returns_logits_and_the_step_policy_picks():
    """A host-replay backend's verify graph returns the logits [b, N, V] (no full-vocabulary sort
    inside it for an all-greedy batch); the step's policy picks after the replay, and tokens stay
    greedy. A device-replay backend's graph picks itself (`choose_in_graph`)."""
    engine = _engine(SpeculativeConfig(2, 1))
    try:
        phases = engine.pipeline.phases
        assert phases.choose_in_graph is False
        manager = engine.worker.state.phases.managers["verify@128"]
        static = manager.static_inputs
        logits, hidden = manager.run({k: v[:2].clone() for k, v in static.items()}, clone=True)
        assert logits.shape == (2, static["tokens"].shape[1], engine.pipeline.target.vocab_size)
        assert logits.dtype.is_floating_point and hidden.shape[:2] == logits.shape[:2]
        assert _run(engine) == reference()
        assert engine.stats()["phases"]["verify"]["replays"] > 0
        target = engine.pipeline.target
        for choose, dtype in ((True, torch.long), (False, target.dtype)):
            other = EnginePhases(target, target.new_cache(3), engine.drafter, (512,), ("verify",),
                                 choose_in_graph=choose)
            step = other(None, 2)["verify@512"]  # a plain step's width-1 verify (pad rows: slot 0)
            with torch.no_grad():
                first, _ = step.step(**{k: v.clone() for k, v in step.static_inputs.items()})
            assert first.dtype == dtype and first.shape[:2] == (2, 1), choose
    finally:
        engine.close()
