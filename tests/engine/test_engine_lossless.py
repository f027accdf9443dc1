"""The engine emits exactly greedy decoding's tokens: chains, dynamic and static trees, the
multi-layer draft; graphs and eager; with a switch and a reload mid-generation."""

from __future__ import annotations

import functools

import pytest
from engine_support import MAX_NEW, engine_args, models, prompts, reference

from draftgraph.runtime import SpeculativeConfig
from draftgraph.runtime.engine import SpecDecodeEngine

_args = functools.partial(engine_args, running=6)  # graphs up to 4, six request slots


def _run(engine: SpecDecodeEngine) -> list[list[int]]:
    return engine.generate([list(p) for p in prompts()], MAX_NEW)


SLOW = pytest.mark.slow  # the slow tier: the rest of the grid (the fast tier keeps a chain, a
# dynamic and a static tree on both backends)
CASES = [
    pytest.param(SpeculativeConfig(1, 1), "eager", marks=SLOW),
    pytest.param(SpeculativeConfig(2, 1), "eager", marks=SLOW),
    (SpeculativeConfig(3, 1), "eager"),
    pytest.param(SpeculativeConfig(4, 1), "eager", marks=SLOW),
    pytest.param(SpeculativeConfig(5, 1), "eager", marks=SLOW),
    (SpeculativeConfig(3, 1), "trace"),
    pytest.param(SpeculativeConfig(5, 1), "trace", marks=SLOW),
    (SpeculativeConfig(3, 2, 6), "eager"),
    (SpeculativeConfig(3, 2, 6), "trace"),
    pytest.param(SpeculativeConfig(2, 3, 8), "eager", marks=SLOW),
    pytest.param(SpeculativeConfig(3, 4, 10), "eager", marks=SLOW),
    (SpeculativeConfig(3, 2, tree_choices=((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))), "eager"),
    (SpeculativeConfig(3, 2, tree_choices=((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))), "trace"),
    pytest.param(SpeculativeConfig(2, 3, tree_choices=((0,), (1,), (2,), (0, 0), (1, 0))), "eager", marks=SLOW),
]

@pytest.mark.parametrize("spec,backend", CASES, ids=lambda v: str(getattr(v, "key", v)))
def test_eagle_engine_equals_greedy(spec, backend):
    target, head = models("eagle")
    # blocking: the graph figures below must not depend on how fast a capture thread runs
    engine = SpecDecodeEngine(_args(spec), target, head, backend=backend, capture="blocking")
    assert _run(engine) == reference()
    st = engine.stats()
    assert st["tokens_generated"] == 16 * MAX_NEW
    assert 1.0 <= st["accept_length_mean"] <= spec.num_steps + 1
    if backend != "eager":
        assert st["graph_replays"] > 0
        assert st["eager_fallbacks"] > 0  # b = 5, 6 are above the largest captured size (4)
    assert len(st["batch_sizes"]) > 1  # requests joined and left


@pytest.mark.parametrize("backend", ["eager", "auto"])
def test_multi_layer_engine_equals_greedy(backend):
    target, draft = models("multi_layer")
    engine = SpecDecodeEngine(_args(SpeculativeConfig(3, 1)), target, draft, backend=backend)
    assert _run(engine) == reference()
    assert engine.stats()["fast_path_hits"] > 0


def test_switch_and_reload_mid_generation():
    target, head = models("eagle")
    # S=4 is no candidate: the controller must switch away from it at the first step
    engine = SpecDecodeEngine(_args(SpeculativeConfig(4, 1)), target, head, backend="trace",
                              adaptive_steps=(1, 2, 3), capture="blocking")
    ids = [engine.add_request(list(p), MAX_NEW) for p in prompts()]
    for _ in range(6):
        engine.step()
    engine.request_reload(_args(SpeculativeConfig(3, 2, 5)))
    for _ in range(4):
        engine.step()
    engine.request_reload(_args(SpeculativeConfig(2, 2, tree_choices=((0,), (1,), (0, 0)))))
    while engine.has_work():
        engine.step()
    assert [engine.result(i) for i in ids] == reference()
    st = engine.stats()
    assert [r["ok"] for r in st["reloads"]["recent"]] == [True, True]
    assert st["reloads"]["applied"] == st["reloads"]["requested"] == 2
    assert st["worker"]["switches"] >= 1
    assert st["spec"][1] == 2


def test_failed_reload_keeps_serving():
    target, head = models("eagle")
    engine = SpecDecodeEngine(_args(SpeculativeConfig(2, 1)), target, head, backend="eager")
    with pytest.raises(ValueError, match="num_draft_tokens"):
        engine.request_reload(_args(SpeculativeConfig(40, 1)))
    assert _run(engine) == reference()
