"""Embedded default models: byte tokenizer, a small Llama-style target, an EAGLE draft head,
a multi-layer (MTP-style) draft, first-use training with a cache, and the greedy reference; and
`load_models`, a user's transformers checkpoint with a published EAGLE head (docs/models.md).

`TinyDraftModel` / `make_draft_input` (the component's small test model and input maker) live in
`draftgraph.runtime.testing` and are re-exported here for existing imports.
"""

from __future__ import annotations

from ..testing import TinyDraftModel, make_draft_input
from .defaults import default_models, model_cache_dir
from .eagle_head import EagleDraftHead
from .greedy import greedy_generate
from .hf_models import load_models
from .multi_layer import MultiLayerDraft
from .target import TargetModel
from .tokenizer import ByteTokenizer, default_tokenizer

__all__ = [
    "ByteTokenizer",
    "EagleDraftHead",
    "MultiLayerDraft",
    "TargetModel",
    "TinyDraftModel",
    "default_models",
    "default_tokenizer",
    "greedy_generate",
    "load_models",
    "make_draft_input",
    "model_cache_dir",
]
