"""draftgraph.runtime: speculative-decoding side of draftgraph.

Configuration, draft organize (tree path and the chain fast path), chain buffers, verify-tree
building, draft workers, runtime states, overrides and live reload.
"""

from __future__ import annotations

from .adaptive import AdaptiveStepController
from .args_file import install_reload_signal, load_runtime_args, runtime_args_from_dict
from .chain import ChainBufferCache, ChainBuffers, ChainKey
from .config import (
    CudaGraphConfig,
    PhaseGraphConfig,
    RuntimeArgs,
    SpeculativeConfig,
    chain_capacity,
    max_tree_candidates,
)
from .draft_input import DraftInput
from .eagle_worker import EagleDraftWorker
from .models import TinyDraftModel, make_draft_input
from .multi_layer_worker import MultiLayerEagleDraftWorker
from .organize import (
    fast_topk,
    organize_chain_steps,
    organize_draft_results,
    select_top_k_tokens,
)
from .ranks.launch import RankLaunchError, spawn_ranks
from .reload import RELOAD_POLICIES, ReloadError
from .sglang.adapter import install_chain_buffers
from .sglang.config import runtime_args_from_sglang
from .state import DraftCounters, RuntimeState, StateStats
from .topology import (
    TopologyBufferCache,
    TopologyBuffers,
    TopologyKey,
    VerifyConstants,
    static_layout_of,
)
from .tree import VerifyTree, build_tree
from .tree_choices import (
    DepthPlan,
    StaticTopology,
    chain_choices,
    check_tree_choices,
    parse_tree_choices,
)
from .validation import ConfigTypeError
from .worker_base import EagleDraftWorkerBase

__all__ = [
    "DepthPlan",
    "RankLaunchError",
    "StaticTopology",
    "TopologyBufferCache",
    "TopologyBuffers",
    "TopologyKey",
    "VerifyConstants",
    "chain_choices",
    "check_tree_choices",
    "install_chain_buffers",
    "parse_tree_choices",
    "runtime_args_from_sglang",
    "spawn_ranks",
    "static_layout_of",
    "AdaptiveStepController",
    "ChainBufferCache",
    "ChainBuffers",
    "ChainKey",
    "ConfigTypeError",
    "CudaGraphConfig",
    "DraftCounters",
    "DraftInput",
    "EagleDraftWorker",
    "EagleDraftWorkerBase",
    "MultiLayerEagleDraftWorker",
    "PhaseGraphConfig",
    "RELOAD_POLICIES",
    "ReloadError",
    "RuntimeArgs",
    "RuntimeState",
    "SpeculativeConfig",
    "StateStats",
    "TinyDraftModel",
    "VerifyTree",
    "build_tree",
    "chain_capacity",
    "fast_topk",
    "install_reload_signal",
    "load_runtime_args",
    "make_draft_input",
    "max_tree_candidates",
    "organize_chain_steps",
    "organize_draft_results",
    "runtime_args_from_dict",
    "select_top_k_tokens",
]
