"""SGLang 0.5.23 on the CPU for the adapter tests: imports (or a skip), a tiny model, ServerArgs.

Importing SGLang's worker modules costs seconds; Python caches the modules, so each test module
asks for them once through a module-scoped fixture and the process pays once.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import types
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 2,
    "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 512,
    "torch_dtype": "float32",
}


def import_sglang(*names: str) -> types.SimpleNamespace:
    """The named sglang modules by last component, or a skip (an error with DRAFTGRAPH_REQUIRE_SGLANG=1)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mods = {n.rsplit(".", 1)[-1]: importlib.import_module(n) for n in names}
    except Exception as exc:  # ImportError, or an import-time failure of its dependencies
        if os.environ.get("DRAFTGRAPH_REQUIRE_SGLANG") == "1":
            raise
        pytest.skip(f"SGLang not importable (pip install --no-deps sglang==0.5.23 plus "
                    f"requirements-oracle.txt): {exc!r}")
    return types.SimpleNamespace(**mods)


def write_tiny_model(folder: os.PathLike[str] | str) -> str:
    """A model directory holding only a tiny Llama config.json (enough for resolve_once)."""
    path = os.fspath(folder)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(TINY_LLAMA, f)
    return path


def resolved_server_args(model_dir: str, steps: int = 3, resolve: bool = True, **kw: Any) -> Any:
    """SGLang's ServerArgs for a multi-layer chain (topk 1, N = S + 1) on the CPU, resolved."""
    from sglang.srt.server_args import ServerArgs

    sa = ServerArgs(model_path=model_dir, device="cpu", speculative_algorithm="EAGLE",
                    speculative_num_steps=steps, speculative_eagle_topk=1,
                    speculative_num_draft_tokens=steps + 1, speculative_draft_model_path=model_dir, **kw)
    if resolve:
        sa.resolve_once()
    return sa


@contextlib.contextmanager
def published(server_args: Any) -> Iterator[Any]:
    """SGLang's process-wide runtime context published for ``server_args``, cleared on exit."""
    from sglang.srt import runtime_context as rc

    rc.publish(server_args, role="scheduler")
    try:
        yield rc
    finally:
        rc.reset_context()
