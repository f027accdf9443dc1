"""Nothing a reload records outlives the state it belongs to (issue 40, point 4).

An adaptive controller switches the worker away from the state a reload built when that S is
not one of its candidates; the next reload then dropped that state without releasing it, and
FX kept the generated source of each of its graphs for the life of the process (measured on
the demo engine: 64 -> 152 entries, about 110 KB per applied reload). Growth is fitted as a
slope over many reloads (entries per reload), never read as an absolute figure.
"""

from __future__ import annotations

import gc
import linecache

import pytest
import torch.fx as fx
from engine_support import tiny_worker
from memory_support import slope

from draftgraph.runtime import RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.testing import make_draft_input
from draftgraph.runtime.worker.adaptive import AdaptiveStepController


def _fx_entries() -> int:
    cache = getattr(getattr(fx.graph_module, "_loader", None), "eval_cache", None)
    return len(cache) if isinstance(cache, dict) else 0


def _reload_cycle(worker, controller, s: int) -> None:
    """Reload to S (the state the reload builds), then let the controller switch away from it."""
    worker.reload(RuntimeArgs(SpeculativeConfig(s, 1), worker.args.cuda_graph_config,
                              max_running_requests=worker.args.max_running_requests))
    controller.step(0.0)  # rebuilds the candidates for the new generation, serves S=1
    worker.draft_forward(make_draft_input(1, 1, seed=s))


def test_the_state_a_controller_switched_away_from_is_released_at_the_next_reload():
    worker = tiny_worker(SpeculativeConfig(3, 1), bs=(1,))
    controller = AdaptiveStepController(worker, [1, 2], capture_bs=(1,), backend="trace")
    _reload_cycle(worker, controller, 3)
    built = [st for st in worker.live_states() if st.spec.num_steps == 3]
    assert len(built) == 1 and built[0] is not worker.state and built[0].graphs is not None
    _reload_cycle(worker, controller, 3)
    assert built[0].graphs is None  # released with its graphs, not left to the collector


@pytest.mark.slow  # the slow tier: a memory test (200 reloads and their slopes, ~23 s)
def test_fx_sources_stay_flat_over_200_reloads_on_the_trace_backend():
    worker = tiny_worker(SpeculativeConfig(3, 1), bs=(1,))
    controller = AdaptiveStepController(worker, [1, 2], capture_bs=(1,), backend="trace")
    entries, lines = [], []
    for i in range(200):
        _reload_cycle(worker, controller, 3 + i % 2)  # S=3 and S=4: never a candidate
        if i % 10 == 9:
            gc.collect()
            entries.append(_fx_entries())
            lines.append(len(linecache.cache))
    per_reload = slope(entries) / 10
    assert per_reload < 0.01, f"FX sources grow by {per_reload:.3f} entries per reload: {entries}"
    assert slope(lines) / 10 < 0.01, f"linecache grows per reload: {lines}"


def test_a_recorded_graph_dropped_unreleased_takes_its_fx_source_along():
    """Whatever path drops a recorded graph without `release`, its generated source goes with it."""
    import torch

    from draftgraph.graphs.core.backend_trace import TraceBackend

    gc.collect()
    before = _fx_entries()
    backend = TraceBackend(2)
    graph = backend.capture(2, lambda x: (torch.tanh(x) * 2,), (torch.ones(2, 3),))
    assert _fx_entries() > before
    del graph, backend
    gc.collect()
    assert _fx_entries() == before
