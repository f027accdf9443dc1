"""The typed seam between the engine and its models: what the engine calls on a target
(`DraftTarget`) and on an EAGLE draft head (`DraftHead`), checked once when an engine is built.

A model missing a member is refused there with a TypeError naming the member (`check_members`),
instead of failing mid-step or being probed with ``hasattr`` at each use; a target and a head
that disagree on the hidden-state contract (the head reads features as wide as the target
returns) or on the vocabulary (the head's logits come over the target's vocabulary: an EAGLE-3
head maps its draft vocabulary through ``d2t`` inside its step) are refused with a ValueError
naming both values (`check_pair`). `HFTarget` and the EAGLE heads (`Eagle1Head`, `Eagle3Head`)
satisfy these structurally; any other model with the same members serves too.
"""

from __future__ import annotations

from typing import Any, Generic, Protocol, runtime_checkable

import torch
from torch import nn

from ..models.kv_cache import KVCache

__all__ = ["DraftHead", "DraftTarget", "check_members", "check_pair", "protocol_members"]


@runtime_checkable
class DraftTarget(Protocol):
    """A target as the engine calls it. ``cfg`` carries ``vocab_size`` and ``max_len`` (cache
    positions per request); ``hidden_size`` is the width of the features the draft reads."""

    cfg: Any
    hidden_size: int
    dtype: torch.dtype
    device: torch.device

    def forward(self, tokens: torch.Tensor, rope_pos: torch.Tensor, write_pos: torch.Tensor, slots: Any,
                mask: torch.Tensor, cache: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens / rope_pos / write_pos [B, T], slots [B], mask [B, T, Lk] -> (logits [B, T, V],
        hidden [B, T, hidden_size]); writes every token's K/V at (slot, write_pos) of ``cache``."""
        ...

    def new_cache(self, slots: int, max_len: int | None = None) -> KVCache:
        """A static K/V cache of ``slots`` slots (slot 0 is the dummy slot)."""
        ...

    def check_backend(self, backend: str) -> None:
        """Raise when the model cannot be captured under graph ``backend``."""
        ...

    def describe(self) -> dict[str, Any]:
        """The model's identity for logs and stats."""
        ...


@runtime_checkable
class DraftHead(Protocol):
    """An EAGLE draft head as the engine and its worker call it. ``cfg`` carries ``dim`` (the
    carried feature's width), ``max_len``, ``feature_width`` (the target features it reads) and
    ``vocab_size``; ``cache`` is the K/V cache `allocate_cache` made (graphs read its tensors)."""

    cfg: Any
    cache: Any
    dtype: torch.dtype
    device: torch.device
    vocab_size: int

    def forward(self, input_ids: torch.Tensor, rows: Any) -> tuple[torch.Tensor, Any]:
        """One draft token per row: input_ids [M] -> (logits [M, vocab_size] float32, next rows)."""
        ...

    def initial_state(self, feat: torch.Tensor, slots: torch.Tensor, seq_lens: torch.Tensor) -> Any:
        """Rows for each request's first draft token: feat [b, dim], slots [b], seq_lens [b]."""
        ...

    def extend(self, feats: torch.Tensor, next_tokens: torch.Tensor, positions: torch.Tensor,
               slots: torch.Tensor, write_slot: torch.Tensor, mask: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Over committed positions: feats [B, T, feature_width] -> (features [B, T, dim], logits)."""
        ...

    def allocate_cache(self, slots: int) -> Any:
        """Allocate ``cache`` once, before any capture."""
        ...

    def row_template(self, rows: int, device: torch.device | str) -> Any:
        """Zero rows [rows, ...]: the worker's static graph inputs."""
        ...

    def describe(self) -> dict[str, Any]:
        """The head's identity for logs and stats (its format among them)."""
        ...


def protocol_members(protocol: type) -> tuple[str, ...]:
    """The public names a Protocol declares (annotated attributes and methods), sorted."""
    names: set[str] = set()
    for klass in protocol.__mro__:
        if klass in (Protocol, Generic, object):
            continue
        names.update(getattr(klass, "__annotations__", {}))
        names.update(n for n, v in vars(klass).items() if callable(v))
    return tuple(sorted(n for n in names if not n.startswith("_")))


def _has(model: object, name: str) -> bool:
    """Whether ``model`` has member ``name``: a module's ``forward`` counts only when its class
    defines one (`nn.Module` alone has a placeholder that raises when called)."""
    if name == "forward" and isinstance(model, nn.Module):
        return type(model).forward is not nn.Module.forward
    try:
        getattr(model, name)
    except AttributeError:
        return False
    return True


def check_members(model: object, protocol: type, role: str) -> None:
    """TypeError naming the first member of ``protocol`` that ``model`` (the engine's ``role``)
    lacks, and every one it lacks."""
    missing = [n for n in protocol_members(protocol) if not _has(model, n)]
    if missing:
        raise TypeError(f"{role}={type(model).__name__}: lacks {missing[0]!r} of the {protocol.__name__} "
                        f"protocol (missing: {missing}; the protocol: {list(protocol_members(protocol))})")


def check_pair(target: DraftTarget, head: DraftHead) -> None:
    """ValueError when ``head`` cannot read ``target``: its feature width or its vocabulary
    differs from the target's."""
    width, hidden = head.cfg.feature_width, target.hidden_size
    if width != hidden:
        raise ValueError(f"draft cfg.feature_width={width}: the target's hidden_size is {hidden} (the head reads "
                         f"the target's features; load both with load_models, which matches them)")
    if head.vocab_size != target.cfg.vocab_size:
        raise ValueError(f"draft vocab_size={head.vocab_size}: the target's vocabulary is {target.cfg.vocab_size} "
                         f"(a head's logits come over the target's vocabulary)")
