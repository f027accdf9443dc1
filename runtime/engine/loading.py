"""The models and tokenizer a command serves: the embedded defaults, or a transformers
checkpoint (``--target``) with a published EAGLE head (``--draft DIR``).

One function for every command that loads them (`generate`, `serve`), so they load the same way.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_text_models", "model_source"]


def load_text_models(target: str | None, draft: str, dtype: str = "float64", max_len: int | None = None,
                     seed: int = 0) -> tuple[Any, Any, Any]:
    """(target, draft, tokenizer): ``target`` None serves the embedded default target with the
    embedded ``draft`` kind and the byte tokenizer; otherwise the checkpoint ``target`` with the
    head folder ``draft`` and its own tokenizer. ValueError naming the flag for a bad pairing."""
    from ..models import default_models, default_tokenizer
    from ..models.defaults import DRAFT_KINDS

    if target is None:
        if draft not in DRAFT_KINDS:
            raise ValueError(f"--draft={draft!r}: without --target it must be one of {list(DRAFT_KINDS)}")
        tgt, drf = default_models(seed=seed, draft=draft)
        return tgt, drf, default_tokenizer()
    from ..models.hf_models import load_models
    from ..models.hf_text import load_tokenizer

    if draft in DRAFT_KINDS:
        raise ValueError(f"--target={target!r}: needs --draft DIR (a published EAGLE head's folder)")
    tgt, drf = load_models(target, draft, dtype, max_len=max_len)
    return tgt, drf, load_tokenizer(target, tgt.vocab_size)


def model_source(target: str | None, draft: str, seed: int = 0) -> dict[str, str]:
    """Where the served models come from, for reports: the default checkpoints' folders (the
    multi-layer draft has none: "embedded") or the given checkpoint and head."""
    if target is not None:
        return {"target": str(target), "draft": str(draft)}
    from ..models import default_checkpoints

    target_dir, head_dir = default_checkpoints(seed=seed)
    return {"target": str(target_dir), "draft": str(head_dir) if draft == "eagle" else "embedded"}
