"""SGLang drop-in: RuntimeArgs from SGLang's configuration (`config`) and stable chain buffers
for SGLang's draft workers (`adapter`)."""

from __future__ import annotations

from .adapter import SGLangChainHandle, install_chain_buffers
from .config import graph_config_from_sglang, runtime_args_from_sglang, sglang_chain_capacity

__all__ = [
    "SGLangChainHandle",
    "graph_config_from_sglang",
    "install_chain_buffers",
    "runtime_args_from_sglang",
    "sglang_chain_capacity",
]
