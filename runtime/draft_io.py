"""A draft step's input and output: `DraftInput` in (duck-typed: an SGLang EagleDraftInput works
too), `DraftResult` out (the same for every worker and path)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch

__all__ = ["DraftInput", "DraftLayout", "DraftResult", "checked_topk", "unpack_draft_input"]


class DraftLayout(Protocol):
    """A static topology's verify constants as a draft result carries them
    (`runtime.topology.buffers.VerifyConstants`; named here so this module, below the
    topology wing, imports nothing of it): what `build_tree` reads of a layout."""

    num_nodes: int
    num_steps: int
    capacity: int
    depth: torch.Tensor  # [1, N]

    def view(self, bs: int) -> tuple[torch.Tensor, ...]:
        """The first ``bs`` rows of the constants (node parents, mask, retrieve index, next
        token, next sibling)."""


@dataclass(frozen=True)
class DraftInput:
    """Top-k of the last target/draft forward and its hidden states.

    EagleDraftWorker: topk_p, topk_index [b, k], hidden_states [b, H] (or the draft model's
    named rows, a NamedTuple of tensors [b, ...]: `runtime.topology.draft_rows`).
    MultiLayerEagleDraftWorker (a chain drafted by S layers at once): topk_p, topk_index [b, S].
    """

    topk_p: torch.Tensor
    topk_index: torch.Tensor
    hidden_states: torch.Tensor | tuple[torch.Tensor, ...] | None = None


def unpack_draft_input(draft_input: Any) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """(topk_p, topk_index, hidden_states) of any object with those attributes, checked:
    topk_p and topk_index 2-D tensors of one shape [b, *] with b >= 1."""
    topk_p, topk_index, _ = checked_topk(draft_input)
    return topk_p, topk_index, getattr(draft_input, "hidden_states", None)


def checked_topk(draft_input: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Size]:
    """(topk_p, topk_index, their shape) for hot paths: two attribute reads, one shape read;
    anything unusual (an error, or a tensor subclass) goes to the full check."""
    try:
        topk_p = draft_input.topk_p
        topk_index = draft_input.topk_index
        b, _ = shape = topk_index.shape
        if type(topk_index) is torch.Tensor and type(topk_p) is torch.Tensor and topk_p.shape == shape and b:
            return topk_p, topk_index, shape
    except (AttributeError, TypeError, ValueError):
        pass
    return _full_check(draft_input)


def _full_check(draft_input: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Size]:
    """The same rules as `checked_topk`, with isinstance, raising an error that says what is wrong."""
    topk_p = getattr(draft_input, "topk_p", None)
    topk_index = getattr(draft_input, "topk_index", None)
    for name, t in (("topk_p", topk_p), ("topk_index", topk_index)):
        if t is None:
            raise TypeError(
                f"draft_input={type(draft_input).__name__}: needs attributes topk_p, topk_index, "
                f"hidden_states (no {name})"
            )
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise TypeError(f"draft_input.{name}={shape}: must be a 2-D tensor [b, *]")
    if topk_p.shape != topk_index.shape:
        raise ValueError(
            f"draft_input.topk_p {tuple(topk_p.shape)} and topk_index {tuple(topk_index.shape)}: "
            f"must have the same shape"
        )
    if topk_index.shape[0] == 0:
        raise ValueError("draft_input: batch size 0; a draft step needs at least one request")
    return topk_p, topk_index, topk_index.shape



@dataclass(frozen=True, slots=True, eq=False)
class DraftResult:
    """An organized draft step, in the order SGLang's organize returns it, and its layout.

    - ``parent_list`` [b, 1 + (S-1)k] (a dynamic tree) or [b, N-1] / [b, S-1] (static
      layouts; width 0 for depth-1 trees): each candidate's parent slot.
    - ``top_scores_index`` [b, N-1]: the selected candidates, ascending.
    - ``draft_tokens`` [b, N-1]: their tokens.
    - ``layout``: None for the general EAGLE layout (decoded with the spec's topk), else the
      static topology's `VerifyConstants` (a `DraftLayout`: a chain or a static tree): `build_tree(...,
      layout=result.layout)` then takes the constant route. Set by the worker that drafted it.

    From a graph replay the tensors are views of graph memory, valid until the next step.
    Iterates over its three tensors, so ``parents, index, tokens = result`` (SGLang's form) and
    ``result[0]`` keep working; the layout is read by name only.
    """

    parent_list: torch.Tensor
    top_scores_index: torch.Tensor
    draft_tokens: torch.Tensor
    layout: DraftLayout | None = None
    replayed_at: int | None = None
    eager_reason: str | None = None

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter((self.parent_list, self.top_scores_index, self.draft_tokens))

    def __len__(self) -> int:
        return 3

    def __getitem__(self, index: int | slice) -> torch.Tensor | tuple[torch.Tensor, ...]:
        return (self.parent_list, self.top_scores_index, self.draft_tokens)[index]
