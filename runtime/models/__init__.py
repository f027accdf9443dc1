"""Models: `load_models`, a user's transformers checkpoint (`HFTarget`) with a published EAGLE-1/2
or EAGLE-3 head (`Eagle1Head` / `Eagle3Head`, over `HFEagleHead`), docs/models.md; the embedded
defaults on the same road (a
transformers Llama target and an EAGLE-3 head over the byte tokenizer, trained at first use,
cached, written as checkpoints and loaded through `load_models`); the multi-layer (MTP-style)
draft and the greedy reference (and its sampled twin).

`TinyDraftModel` / `make_draft_input` (the component's small test model and input maker) live in
`draftgraph.runtime.testing` and are re-exported here for existing imports.
"""

from __future__ import annotations

from ..testing import TinyDraftModel, make_draft_input
from .defaults import default_checkpoints, default_models, model_cache_dir
from .eagle_heads import Eagle1Head, Eagle3Head, make_head
from .greedy import greedy_generate, sampled_generate
from .hf_eagle import HFEagleHead
from .hf_models import load_models
from .hf_target import HFTarget
from .multi_layer import MultiLayerDraft
from .tokenizer import ByteTokenizer, default_tokenizer

__all__ = [
    "ByteTokenizer",
    "Eagle1Head",
    "Eagle3Head",
    "HFEagleHead",
    "HFTarget",
    "MultiLayerDraft",
    "TinyDraftModel",
    "default_checkpoints",
    "default_models",
    "default_tokenizer",
    "greedy_generate",
    "load_models",
    "make_draft_input",
    "make_head",
    "model_cache_dir",
    "sampled_generate",
]
