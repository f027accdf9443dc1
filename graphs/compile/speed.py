"""The speed check of "auto": time a size's replay against the eager step, keep the faster.

`paired_seconds` times two callables in alternating pairs (a compile process or serving busy on
the other core slows both sides of a round alike); `time_against_eager` sets a graph's
``replay_s``, ``eager_s`` and ``prefer_eager`` (the replay is not faster: serve eager).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..core.backend_trace import TraceGraph
from ..core.cancel import CaptureCancelled, cancel_requested
from ..core.protocol import FlatStep
from .compare import copies, isolated_world, lift_constants
from .entry import StoredGraph
from .records import CompiledRunner

__all__ = ["paired_seconds", "time_against_eager"]

logger = logging.getLogger(__name__)


def paired_seconds(a: Callable[[], Any], b: Callable[[], Any], rounds: int = 9) -> tuple[float, float, float]:
    """(median seconds of ``a``, of ``b``, median of the per-round ratios a / b): one warm-up
    call each, then ``rounds`` rounds that call ``a`` and ``b`` back to back, the order
    alternating. A compile process or serving busy on the other core slows both sides of a
    round alike, so the ratio holds where two separate medians did not (measured: a cold fill
    served 37 of its 63 steps eager, "eager_faster", and stored that verdict; with pairs, 0)."""
    a()
    b()
    ta: list[float] = []
    tb: list[float] = []
    for i in range(rounds):
        if cancel_requested():  # the process is exiting: no verdict, and no more rounds
            raise CaptureCancelled("speed check cancelled")
        for fn, out in ((a, ta), (b, tb)) if i % 2 == 0 else ((b, tb), (a, ta)):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    ratios = sorted(x / max(y, 1e-12) for x, y in zip(ta, tb))
    return sorted(ta)[rounds // 2], sorted(tb)[rounds // 2], ratios[rounds // 2]


def _replay_on_copies(graph: TraceGraph | StoredGraph) -> Callable[[], Any]:
    """The graph's replay as it serves, over copies of its inputs (never the live rows)."""
    if isinstance(graph, StoredGraph):
        compiled, inputs = graph.compiled, copies(graph.inputs)
    elif isinstance(graph.runner, CompiledRunner):
        runner = graph.runner
        compiled = runner.compiled
        if runner.symbolic:  # a symbolic runner reads its own constants
            inputs = isolated_world((*graph.inputs, *runner.constants))[0]
        else:
            inputs = copies((*graph.inputs, *lift_constants(graph.module)[1]))
    else:
        compiled, constants = lift_constants(graph.module)
        inputs = copies((*graph.inputs, *constants))
    return lambda: compiled(*inputs)


def time_against_eager(graph: TraceGraph | StoredGraph, fn: FlatStep, eager_args: tuple[Tensor, ...]) -> None:
    """Median seconds of the replay (on copies of its inputs) and of the eager step (on
    ``eager_args``, stand-ins when capturing beside serving); ``graph.prefer_eager`` when
    the replay is not faster, so "auto" never serves a replay slower than eager."""
    replay = _replay_on_copies(graph)
    with torch.no_grad():
        graph.replay_s, graph.eager_s, ratio = paired_seconds(replay, lambda: fn(*eager_args))
    graph.prefer_eager = ratio >= 1.0
    if graph.prefer_eager:
        logger.info("compile backend: size %d serves eager (replay %.0f us >= eager %.0f us)",
                    graph.size, graph.replay_s * 1e6, graph.eager_s * 1e6)
