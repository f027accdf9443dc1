"""Running one batch of a manager's step: replaying a prepared `ReplayPlan`, or the step eagerly.

A `ReplayPlan` is prepared on a batch size's first lookup (the load plan with its views and
checks, the graph, the size's usage counter, the output views cut to b rows), so a replay only
loads the rows, counts itself once (in the `SizeUsage` of its padded size), replays and hands
back the prepared views. No run records autograd history, whatever the caller's grad mode.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from .core.protocol import CapturedGraph, flatten_outputs
from .debug import DebugConfig, check_data_ptrs, compare_outputs
from .graph_set import GraphSet
from .spans import span
from .static import LoadPlan, StaticInputs
from .stats import ReplayCounters, SizeUsage

__all__ = ["ReplayPlan", "Replayer", "StepOutput"]

StepOutput = Tensor | tuple[Tensor, ...]


class ReplayPlan:
    """The manager's answer "replay b rows at size ``padded``", prepared on b's first lookup
    (see the module docstring); pass it back to `GraphCaptureManager.replay`.

    ``result`` is the step's structure over the graph's fixed outputs cut to b rows: the same
    view objects for every run of b, in memory the next replay overwrites.
    """

    __slots__ = ("graph", "load", "pad_rows", "result", "usage")

    def __init__(self, load: LoadPlan, graph: CapturedGraph, usage: SizeUsage, single: bool) -> None:
        self.load = load
        self.graph = graph
        self.usage = usage
        self.pad_rows = load.padded - load.b
        b = load.b
        cut = tuple([o[:b] for o in graph.outputs])
        self.result: StepOutput = cut[0] if single else cut

    @property
    def b(self) -> int:
        """Rows of the batch."""
        return self.load.b

    @property
    def padded(self) -> int:
        """The captured size that replays them."""
        return self.load.padded

    def cloned(self) -> StepOutput:
        """Copies of ``result`` (for ``run(clone=True)``)."""
        result = self.result
        if isinstance(result, Tensor):
            return result.clone()
        return tuple([o.clone() for o in result])


class Replayer:
    """Runs batches of one manager's step and counts each run once in ``counters``: a plan's
    graph (with the debug checks ``debug`` asks for: static inputs not moved since ``graphs``
    captured; every Nth replay compared with the eager step) or the step itself."""

    __slots__ = ("_counters", "_debug", "_graphs", "_static", "_step")

    def __init__(self, step: Callable[..., StepOutput], static: StaticInputs, counters: ReplayCounters,
                 debug: DebugConfig, graphs: GraphSet) -> None:
        self._step = step
        self._static = static
        self._counters = counters
        self._debug = debug
        self._graphs = graphs

    def replay(self, plan: ReplayPlan, tensors: tuple[Tensor, ...], clone: bool) -> StepOutput:
        """Load the checked batch, replay (with debug checks), count it; the prepared b-row outputs.
        Never records autograd history, whatever the caller's grad mode: a batch that requires
        grad would otherwise make the static inputs record it (and later loads fail)."""
        if torch.is_grad_enabled():
            with torch.no_grad():
                return self._replay_loaded(plan, tensors, clone)
        return self._replay_loaded(plan, tensors, clone)

    def _replay_loaded(self, plan: ReplayPlan, tensors: tuple[Tensor, ...], clone: bool) -> StepOutput:
        """`replay` with grad off."""
        load = plan.load
        with span("replay", bs=load.b, padded=load.padded):
            load.load(tensors)
            usage = plan.usage
            usage.replays += 1
            usage.pad_rows += plan.pad_rows
            if self._debug.enabled:
                self._debug_replay(plan)
            else:
                plan.graph.replay()
            return plan.cloned() if clone else plan.result

    def _debug_replay(self, plan: ReplayPlan) -> None:
        """Replay with the debug checks: static inputs not moved; every Nth, graph == eager."""
        check_data_ptrs(self._graphs.captured_ptrs, self._static.data_ptrs())
        if not self._debug.compare_due(self._counters.replays):
            plan.graph.replay()
            return
        padded = plan.load.padded
        clones = self._static.clones(padded)
        outs = plan.graph.replay()
        eager, _ = flatten_outputs(self._step(**clones))
        self._counters.debug_checks += 1
        compare_outputs(outs, eager, padded)

    def eager(self, inputs: Mapping[str, Tensor], b: int, fallback: bool) -> StepOutput:
        """Run the step on ``inputs`` as given, counted as an eager fallback (no graph serves b)
        or, with ``fallback=False``, as an eager backend's run."""
        if fallback:
            self._counters.eager_fallbacks += 1
            name = "eager_fallback"
        else:
            self._counters.eager_runs += 1
            name = "eager_run"
        with span(name, bs=b), torch.no_grad():  # as a replay: no autograd history
            return self._step(**inputs)
