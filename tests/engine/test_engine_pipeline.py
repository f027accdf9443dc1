"""The engine's step as one pipeline: acceptance on the device against a plain walk, one host read
per step, no validation sync in build_tree, the ``served`` range names what ran, and one
acceptance-length definition with a schedule that has an S=0 band."""

from __future__ import annotations

import pytest
import torch
from engine_support import models, prompts, reference
from hypothesis import given, settings
from hypothesis import strategies as st

import draftgraph.runtime.engine.pipeline as pipeline_mod
from draftgraph.graphs.spans import trace_spans
from draftgraph.graphs.sync_audit import count_host_syncs, no_host_sync
from draftgraph.runtime import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig, VerifyTree
from draftgraph.runtime.engine import AcceptanceWatch, SpecDecodeEngine, accept

MAX_NEW = 24


def _walk(parents: list[int], tokens: list[int], pred: list[int]) -> tuple[list[int], list[int]]:
    """Greedy acceptance written out for one request, from first-child / next-sibling lists."""
    n = len(parents)
    first = [next((c for c in range(n) if parents[c] == j), -1) for j in range(n)]
    sib = [next((c for c in range(j + 1, n) if parents[c] == parents[j]), -1) if parents[j] >= 0 else -1
           for j in range(n)]
    node, path = 0, [0]
    while True:
        c = first[node]
        while c != -1 and tokens[c] != pred[node]:
            c = sib[c]
        if c == -1:
            break
        path.append(c)
        node = c
    return path, [tokens[c] for c in path[1:]] + [pred[node]]


@st.composite
def _trees(draw):
    b = draw(st.integers(1, 4))
    n = draw(st.integers(1, 8))
    vocab = draw(st.integers(1, 3))  # few tokens: siblings share tokens, matches are frequent
    rows = []
    for _ in range(b):
        parents = [-1] + [draw(st.integers(-1, j - 1)) for j in range(1, n)]  # -1: not selected
        tokens = [draw(st.integers(0, vocab - 1)) for _ in range(n)]
        pred = [draw(st.integers(0, vocab - 1)) for _ in range(n)]
        rows.append((parents, tokens, pred))
    return rows


def _depth(parents: list[int]) -> int:
    def d(j: int) -> int:
        return 0 if parents[j] < 0 else 1 + d(parents[j])
    return max(d(j) for j in range(len(parents)))


@settings(max_examples=200, deadline=None)
@given(_trees())
def test_device_acceptance_equals_the_walk(rows) -> None:
    b, n = len(rows), len(rows[0][0])
    parents = torch.tensor([r[0] for r in rows])
    tokens = torch.tensor([r[1] for r in rows])
    pred = torch.tensor([r[2] for r in rows])
    unused = torch.zeros(b, n, dtype=torch.long)
    tree = VerifyTree(tokens=tokens.flatten(), positions=unused.flatten(), parents=parents,
                      tree_mask=torch.ones(b, n, n, dtype=torch.bool), retrieve_index=unused,
                      retrieve_next_token=unused, retrieve_next_sibling=unused)
    depth = max(_depth(r[0]) for r in rows)
    acc = accept(tree, pred, depth)
    want = [_walk(*r) for r in rows]
    assert acc.paths == [w[0] for w in want]
    assert acc.committed == [w[1] for w in want]
    assert acc.length.tolist() == [len(w[0]) for w in want]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.integers(1, 3), st.data())
def test_chain_acceptance_equals_the_walk(b, s, vocab, data) -> None:
    n = s + 1
    rows = [([-1] + list(range(n - 1)), data.draw(st.lists(st.integers(0, vocab - 1), min_size=n, max_size=n)),
             data.draw(st.lists(st.integers(0, vocab - 1), min_size=n, max_size=n))) for _ in range(b)]
    unused = torch.zeros(b, n, dtype=torch.long)
    tree = VerifyTree(tokens=torch.tensor([r[1] for r in rows]).flatten(), positions=unused.flatten(),
                      parents=torch.tensor([r[0] for r in rows]), tree_mask=torch.ones(b, n, n, dtype=torch.bool),
                      retrieve_index=unused, retrieve_next_token=unused, retrieve_next_sibling=unused)
    pred = torch.tensor([r[2] for r in rows])
    fast, general = accept(tree, pred, s, chain=True), accept(tree, pred, s)
    want = [_walk(*r) for r in rows]
    assert fast.paths == general.paths == [w[0] for w in want]
    assert fast.committed == general.committed == [w[1] for w in want]
    assert torch.equal(fast.path, general.path) and torch.equal(fast.length, general.length)


def _engine(backend: str = "eager", bs=(4,), spec=None, **kw) -> SpecDecodeEngine:
    target, head = models("eagle")
    args = RuntimeArgs(spec or SpeculativeConfig(3, 1), CudaGraphConfig(PhaseGraphConfig(bs=list(bs))),
                       max_running_requests=8)
    return SpecDecodeEngine(args, target, head, backend=backend, capture="blocking", **kw)


@pytest.mark.parametrize("backend, phases", [("eager", None), ("trace", None), ("trace", ("verify", "extend"))],
                         ids=["eager", "trace", "trace-phases"])
@pytest.mark.parametrize("spec", [SpeculativeConfig(3, 1), SpeculativeConfig(3, 2, 6)], ids=["chain", "tree"])
def test_a_steady_step_reads_the_device_once(spec, backend, phases) -> None:
    """b=4, every step steady (no admission, no request ending): the host syncs of each step,
    on the eager backend, with the draft replayed from graphs (trace), and with the verify and
    extend phases replayed too."""
    engine = _engine(backend=backend, spec=spec, **({"graph_phases": phases, "kv_tiers": (512,)} if phases else {}))
    for p in prompts()[:4]:
        engine.add_request(list(p), 40)
    engine.step()  # admission (a prefill reads its first token) and one step
    counts = []
    for _ in range(3):
        with count_host_syncs() as found:
            engine.step()
        counts.append(found)
    assert all(len(c) <= 2 for c in counts), counts  # the target of issue 31: at most 2
    assert all(c == ["Tensor.tolist"] for c in counts), counts  # today: acceptance's one read
    st = engine.stats()
    assert st["batch_sizes"] == {4: 4}  # every counted step ran the 4 requests
    if backend != "eager":  # the draft of the counted steps replayed its graph
        assert st["graph_replays"] >= 3 and not st["eager_steps_by_reason"], st["eager_steps_by_reason"]
    for phase in phases or ():  # and so did each phase asked for
        assert st["phases"][phase]["replays"] >= 3 and not st["phases"][phase]["eager_steps_by_reason"], st["phases"]


def test_the_serving_path_builds_the_tree_without_a_validation_sync(monkeypatch) -> None:
    real, calls = pipeline_mod.build_tree, []

    def checked(*args, **kwargs):
        calls.append(kwargs.get("validate"))
        with no_host_sync(cuda=False):
            return real(*args, **kwargs)

    monkeypatch.setattr(pipeline_mod, "build_tree", checked)
    engine = _engine(spec=SpeculativeConfig(3, 2, 6))
    assert engine.generate([list(p) for p in prompts()[:4]], MAX_NEW) == reference()[:4]
    assert calls and set(calls) == {False}


def test_the_served_range_names_what_ran(tmp_path) -> None:
    """Graphs captured for sizes 1 and 2 only: 4 requests run eager (above_max), then 2 replay."""
    engine = _engine(backend="trace", bs=(1, 2))
    ids = [engine.add_request(list(p), n) for p, n in zip(prompts()[:4], (4, 4, MAX_NEW, MAX_NEW))]
    with trace_spans() as events:
        while engine.has_work():
            engine.step()
    served = [e["name"] for e in events if e["name"].startswith("served[")]
    assert served[0] == "served[bs=4,S=3,topk=1,N=4,mode=eager,reason=above_max]"
    assert "served[bs=2,S=3,topk=1,N=4,mode=graph,padded=2]" in served
    steps = [e for e in events if e["name"].startswith("step[")]
    assert len(served) == len(steps)  # one per step that served requests
    assert [engine.pop_result(i) for i in ids] == [r[:n] for r, n in zip(reference()[:4], (4, 4, MAX_NEW, MAX_NEW))]


def test_one_acceptance_length_with_an_s0_band(monkeypatch) -> None:
    """A schedule with an S=0 band: stats(), the metric and the watch give the same acceptance
    length, the mean over the steps that drafted of the tokens committed per request (the
    S=0 steps, which commit one token per request, are not counted)."""
    prometheus = pytest.importorskip("prometheus_client")
    from draftgraph.runtime.engine.metrics import register_engine_metrics

    real, seen = pipeline_mod.StepPipeline.step, []

    def recording(self, reqs, worker, num_steps):
        acc = real(self, reqs, worker, num_steps)
        seen.append((num_steps, acc.lengths))
        return acc

    monkeypatch.setattr(pipeline_mod.StepPipeline, "step", recording)
    engine = _engine(schedule="1:3,4:0", acceptance_watch=AcceptanceWatch(window_steps=2, min_accept_length=1.0))
    registry = prometheus.CollectorRegistry()
    register_engine_metrics(engine, registry)
    new = [MAX_NEW] * 2 + [6] * 6  # 8 requests (S=0) until six end, then 2 (S=3)
    ids = [engine.add_request(list(p), n) for p, n in zip(prompts()[:8], new)]
    while engine.has_work():
        engine.step()
    assert [engine.pop_result(i) for i in ids] == [r[:n] for r, n in zip(reference()[:8], new)]
    drafted = [lens for s, lens in seen if s > 0]
    assert drafted and any(s == 0 for s, _ in seen)  # both bands served
    want = sum(sum(lens) for lens in drafted) / sum(len(lens) for lens in drafted)
    st_ = engine.stats()
    assert st_["accept_length_mean"] == pytest.approx(want)
    metric = registry.get_sample_value("draftgraph_spec_decode_mean_acceptance_length")
    assert metric == pytest.approx(want)
    window = [sum(lens) / len(lens) for lens in drafted[-2:]]
    assert st_["acceptance_watch"]["window_mean"] == pytest.approx(sum(window) / 2)
