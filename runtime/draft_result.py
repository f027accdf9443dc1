"""`DraftResult`: what one organized draft step returns, the same for every worker and path."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from .topology import VerifyConstants

__all__ = ["DraftResult"]


@dataclass(frozen=True, slots=True, eq=False)
class DraftResult:
    """An organized draft step, in the order SGLang's organize returns it, and its layout.

    - ``parent_list`` [b, 1 + (S-1)k] (a dynamic tree) or [b, N-1] / [b, S-1] (static
      layouts; width 0 for depth-1 trees): each candidate's parent slot.
    - ``top_scores_index`` [b, N-1]: the selected candidates, ascending.
    - ``draft_tokens`` [b, N-1]: their tokens.
    - ``layout``: None for the general EAGLE layout (decoded with the spec's topk), else the
      static topology's `VerifyConstants` (a chain or a static tree): `build_tree(...,
      layout=result.layout)` then takes the constant route. Set by the worker that drafted it.

    From a graph replay the tensors are views of graph memory, valid until the next step.
    Iterates over its three tensors, so ``parents, index, tokens = result`` (SGLang's form) and
    ``result[0]`` keep working; the layout is read by name only.
    """

    parent_list: torch.Tensor
    top_scores_index: torch.Tensor
    draft_tokens: torch.Tensor
    layout: VerifyConstants | None = None
    replayed_at: int | None = None
    eager_reason: str | None = None

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter((self.parent_list, self.top_scores_index, self.draft_tokens))

    def __len__(self) -> int:
        return 3

    def __getitem__(self, index: int | slice) -> torch.Tensor | tuple[torch.Tensor, ...]:
        return (self.parent_list, self.top_scores_index, self.draft_tokens)[index]
