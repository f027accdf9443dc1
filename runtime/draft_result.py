"""`DraftResult`: what one organized draft step returns, the same for every worker and path."""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["DraftResult"]


class DraftResult(NamedTuple):
    """An organized draft step, in the order SGLang's organize returns it.

    - ``parent_list`` [b, 1 + (S-1)k] (a dynamic tree) or [b, N-1] / [b, S-1] (static
      layouts; width 0 for depth-1 trees): each candidate's parent slot.
    - ``top_scores_index`` [b, N-1]: the selected candidates, ascending.
    - ``draft_tokens`` [b, N-1]: their tokens.

    From a graph replay the tensors are views of graph memory, valid until the next step.
    A tuple, so ``parents, index, tokens = result`` keeps working.
    """

    parent_list: torch.Tensor
    top_scores_index: torch.Tensor
    draft_tokens: torch.Tensor
