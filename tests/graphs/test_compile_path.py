"""The compile backend's path without inductor (the fast tier): a custom ``compile_fn`` runs where
inductor would, so recording, the bitwise check, the runner record and the fallback are covered
in seconds; inductor's own compiles are in the slow tier (tests/graphs/test_compile_backend.py)."""

from __future__ import annotations

import torch

from draftgraph.graphs.backends import backend_class
from draftgraph.graphs.compile.backend import CompileBackend
from draftgraph.graphs.compile.records import CompiledRunner


def _step(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (torch.tanh(x) * 2 + 1,)


def test_a_compiled_size_replays_through_its_runner_record():
    calls = []

    def as_is(gm, inputs):  # "compiles" to the graph itself: bitwise equal by construction
        calls.append(len(inputs))
        return gm

    backend = CompileBackend(4, compile_fn=as_is)
    x = torch.linspace(-1, 1, 12).reshape(4, 3)
    graph = backend.capture(4, _step, (x,))
    assert calls == [1] and backend.compiles == 1 and graph.compiles == 1 and backend.fallbacks == 0
    assert isinstance(graph.runner, CompiledRunner) and graph.engine == "inductor"
    assert not graph.runner.symbolic and graph.runner.raw is None  # a custom compile: never stored
    assert torch.equal(graph.replay()[0], torch.tanh(x) * 2 + 1)
    assert backend.symbolic_sizes == [] and backend.compiles_ahead(3) == 3  # custom: per size


def test_a_compiled_size_that_differs_keeps_the_fx_replay():
    def off(gm, inputs):
        return lambda *a: [o + 1 for o in gm(*a)]

    backend = CompileBackend(4, compile_fn=off)
    x = torch.ones(4, 3)
    graph = backend.capture(4, _step, (x,))
    assert backend.fallbacks == 1 and graph.engine == "fx" and "output 0: values differ" in graph.fallback_reason
    assert torch.equal(graph.replay()[0], torch.tanh(x) * 2 + 1)


def test_the_manager_reads_capabilities_not_names():
    assert backend_class("compile").compiles_code and backend_class("compile") is CompileBackend
    assert [backend_class(n).compiles_code for n in ("cuda", "trace", "eager")] == [False, False, False]
    assert backend_class("trace").expected_compiles(5) == 0
