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
- organize: `select_top_k_tokens`, `organize_draft_results`, `fast_topk`;
- topology and the verify tree: `StaticTopology`, `TopologyBuffers`, `VerifyTree`, `build_tree`;
- SGLang drop-in (`runtime.sglang`): `install_chain_buffers`, `runtime_args_from_sglang`;
- several ranks (`runtime.ranks`): `RankCoordinator`, `spawn_ranks`.

Everything else is importable from its own module (for example `runtime.chain.ChainBuffers`,
`runtime.topology.TopologyBufferCache`, `runtime.tree_choices.check_tree_choices`,
`runtime.args_file.runtime_args_from_dict`, `runtime.ranks.launch.RankLaunchError`); the small
test model and input maker are in `runtime.testing`.
"""

from __future__ import annotations

# first, before torch loads: the `draftgraph` console script's own set-up, nothing for any other
# program (see `console`)
from .console import prepare_console_script  # isort: skip

prepare_console_script()


from .adaptive import AdaptiveStepController  # runtime states
from .args_file import install_reload_signal, load_runtime_args  # configuration, reload
from .config import (  # configuration
    CudaGraphConfig,
    PhaseGraphConfig,
    RuntimeArgs,
    SpeculativeConfig,
    chain_capacity,
)
from .draft_input import DraftInput  # draft workers
from .draft_result import DraftResult  # draft workers
from .eagle_worker import EagleDraftWorker  # draft workers
from .multi_layer_worker import MultiLayerEagleDraftWorker  # draft workers
from .organize import fast_topk, organize_draft_results, select_top_k_tokens  # organize
from .ranks.coordinator import RankCoordinator  # several ranks
from .ranks.launch import spawn_ranks  # several ranks
from .reload import RELOAD_POLICIES, ReloadError  # runtime states, reload
from .schedule import SpeculationSchedule  # configuration
from .sglang.adapter import install_chain_buffers  # SGLang drop-in
from .sglang.config import runtime_args_from_sglang  # SGLang drop-in
from .state import DraftCounters, RuntimeState, StateStats  # runtime states
from .topology import TopologyBuffers  # topology
from .tree import VerifyTree, build_tree  # verify tree
from .tree_choices import StaticTopology, parse_tree_choices  # static trees
from .validation import ConfigTypeError  # configuration
from .weights import StaleWeightsError  # draft weights
from .worker_base import EagleDraftWorkerBase  # draft workers

__all__ = [
    "AdaptiveStepController",
    "ConfigTypeError",
    "CudaGraphConfig",
    "DraftCounters",
    "DraftInput",
    "DraftResult",
    "EagleDraftWorker",
    "EagleDraftWorkerBase",
    "MultiLayerEagleDraftWorker",
    "PhaseGraphConfig",
    "RELOAD_POLICIES",
    "RankCoordinator",
    "ReloadError",
    "RuntimeArgs",
    "RuntimeState",
    "SpeculationSchedule",
    "SpeculativeConfig",
    "StaleWeightsError",
    "StateStats",
    "StaticTopology",
    "TopologyBuffers",
    "VerifyTree",
    "build_tree",
    "chain_capacity",
    "fast_topk",
    "install_chain_buffers",
    "install_reload_signal",
    "load_runtime_args",
    "organize_draft_results",
    "parse_tree_choices",
    "runtime_args_from_sglang",
    "select_top_k_tokens",
    "spawn_ranks",
]
