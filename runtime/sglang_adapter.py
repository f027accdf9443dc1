"""Documented import path for the SGLang drop-in; the code lives in `draftgraph.runtime.sglang`.

`install_chain_buffers` and its handle are in `draftgraph.runtime.sglang.adapter`;
`runtime_args_from_sglang`, `graph_config_from_sglang` and `sglang_chain_capacity` in
`draftgraph.runtime.sglang.config`.
"""

from __future__ import annotations

from .sglang.adapter import AdoptedChain, SGLangChainHandle, install_chain_buffers
from .sglang.config import graph_config_from_sglang, runtime_args_from_sglang, sglang_chain_capacity

__all__ = [
    "AdoptedChain",
    "SGLangChainHandle",
    "graph_config_from_sglang",
    "install_chain_buffers",
    "runtime_args_from_sglang",
    "sglang_chain_capacity",
]
