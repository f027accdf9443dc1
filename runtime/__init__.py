"""draftgraph.runtime: the speculative-decoding component of draftgraph.

The public API (`__all__`, sorted) is what a serving engine needs, by job:

- configuration: `RuntimeArgs`, `SpeculativeConfig`, `CudaGraphConfig`, `PhaseGraphConfig`,
  `ConfigTypeError`, `chain_capacity`, `parse_tree_choices`, `load_runtime_args`,
  `SpeculationSchedule`;
- draft workers: `EagleDraftWorker`, `MultiLayerEagleDraftWorker`, `EagleDraftWorkerBase`,
  `DraftInput`, `DraftResult`, `DraftCounters`;
- runtime states, reload, adaptive S: `RuntimeState`, `StateStats`, `ReloadError`,
  `RELOAD_POLICIES`, `install_reload_signal`, `AdaptiveStepController`;
- draft weights updated in place (`update_draft_weights`): `StaleWeightsError`;
- sampling (temperature, top-p, top-k, min-p, keyed seeds): `SamplingParams`;
- organize: `select_top_k_tokens`, `organize_draft_results`, `fast_topk`;
- topology and the verify tree: `StaticTopology`, `TopologyBuffers`, `VerifyTree`, `build_tree`;
- SGLang drop-in (`runtime.sglang`): `install_chain_buffers`, `runtime_args_from_sglang`;
- several ranks (`runtime.ranks`): `RankCoordinator`, `spawn_ranks`.

Everything else is importable from its own module (for example `runtime.topology.chain.ChainBuffers`,
`runtime.topology.buffers.TopologyBufferCache`, `runtime.tree_choices.check_tree_choices`,
`runtime.args_file.runtime_args_from_dict`, `runtime.ranks.launch.RankLaunchError`); the small
test model and input maker are in `runtime.testing`.

Importing the package loads nothing else (PEP 562: each name is imported on first use), so
``import draftgraph.runtime`` changes no process state and loads no torch; the ``draftgraph``
command's own set-up (SIGHUP held, torch's NumPy notice dropped) is in its entry,
`draftgraph.runtime.commands.entry.main`.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> the module (relative to this package) that defines it
_HOMES: dict[str, str] = {
    "AdaptiveStepController": "worker.adaptive",
    "ConfigTypeError": "validation",
    "CudaGraphConfig": "config",
    "DraftCounters": "worker.state",
    "DraftInput": "draft_io",
    "DraftResult": "draft_io",
    "EagleDraftWorker": "worker.eagle",
    "EagleDraftWorkerBase": "worker.base",
    "MultiLayerEagleDraftWorker": "worker.multi_layer",
    "PhaseGraphConfig": "config",
    "RELOAD_POLICIES": "worker.reload",
    "RankCoordinator": "ranks.coordinator",
    "ReloadError": "worker.reload_types",
    "RuntimeArgs": "config",
    "RuntimeState": "worker.state",
    "SamplingParams": "sampling.params",
    "SpeculationSchedule": "schedule",
    "SpeculativeConfig": "config",
    "StaleWeightsError": "worker.weights",
    "StateStats": "worker.state",
    "StaticTopology": "tree_choices",
    "TopologyBuffers": "topology.buffers",
    "VerifyTree": "topology.verify_tree",
    "build_tree": "topology.verify_tree",
    "chain_capacity": "config",
    "fast_topk": "topology.organize",
    "install_chain_buffers": "sglang.adapter",
    "install_reload_signal": "args_file",
    "load_runtime_args": "args_file",
    "organize_draft_results": "topology.organize",
    "parse_tree_choices": "tree_choices",
    "runtime_args_from_sglang": "sglang.config",
    "select_top_k_tokens": "topology.organize",
    "spawn_ranks": "ranks.launch",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'draftgraph.runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
