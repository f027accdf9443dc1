"""The accept policy: which token each verify node emits if the walk reaches it, and the walk.

Two implementations of one rule (DESIGN.md §19, docs/sampling.md): at each node of the verify
tree take the target's token y there (greedy: the argmax; sampled: a draw from the filtered
distribution keyed by (seed, position)), move to the child that carries y, or emit y and stop;
the last node's y is the bonus. Every emitted token is the target's own choice, so the output
is plain decoding's, token for token, whatever the draft. The drafts stay deterministic (argmax
chains, top-k trees): the rule needs no draft probabilities.

`SampledAccept.choose` gives greedy rows (temperature 0) the argmax, so a batch mixing greedy
and sampled requests runs one code path (and one captured verify graph); an all-greedy batch
outside graphs takes `GreedyAccept`, the argmax alone.
"""

from __future__ import annotations

import torch

from draftgraph.runtime import VerifyTree
from draftgraph.runtime.sampling import SamplingRows, choose_tokens

from .verify import Acceptance, accept

__all__ = ["AcceptPolicy", "GREEDY_ACCEPT", "GreedyAccept", "SAMPLED_ACCEPT", "SampledAccept", "accept_policy"]


class AcceptPolicy:
    """What a verify step emits: `choose` per node, then `accept` (the walk, shared)."""

    name = "policy"

    def choose(self, logits: torch.Tensor, positions: torch.Tensor, rows: SamplingRows) -> torch.Tensor:
        """The token of every node [b, N] from the target's logits [b, N, V]; ``positions`` [b, N]
        the nodes' positions (a node's token is drawn for position + 1); ``rows`` per-request
        parameters, each [b]."""
        raise NotImplementedError

    @staticmethod
    def accept(tree: VerifyTree, chosen: torch.Tensor, depth: int, chain: bool = False) -> Acceptance:
        """The walk over the tree with every node's chosen token [b, N] (`verify.accept`)."""
        return accept(tree, chosen, depth, chain=chain)


class GreedyAccept(AcceptPolicy):
    """Every row greedy: the argmax (today's match, bitwise)."""

    name = "greedy"

    def choose(self, logits: torch.Tensor, positions: torch.Tensor, rows: SamplingRows) -> torch.Tensor:
        return logits.argmax(-1)


class SampledAccept(AcceptPolicy):
    """Rows with temperature > 0 draw (`sampling.choose_tokens`), greedy rows take the argmax."""

    name = "sampled"

    def choose(self, logits: torch.Tensor, positions: torch.Tensor, rows: SamplingRows) -> torch.Tensor:
        return choose_tokens(logits, positions + 1, rows)


GREEDY_ACCEPT = GreedyAccept()
SAMPLED_ACCEPT = SampledAccept()


def accept_policy(sampled: bool) -> AcceptPolicy:
    """`SAMPLED_ACCEPT` when any row samples, else `GREEDY_ACCEPT`."""
    return SAMPLED_ACCEPT if sampled else GREEDY_ACCEPT
