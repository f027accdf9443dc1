"""Draft result organization: per-step top-k selection and the final cat/topk/sort/gather.

These are the general (tree) path. They match SGLang 0.5.23's ``select_top_k_tokens`` and
``organize_draft_results`` bitwise (same ops, same tie-breaking) and run inside a captured graph:
no host reads, shapes depend only on (b, k, S, N).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from draftgraph.runtime.topology.draft_rows import DraftRowsLike, map_rows, row_count

__all__ = [
    "fast_topk",
    "select_top_k_tokens",
    "organize_draft_results",
    "organize_chain_steps",
]

TreeInfo = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def fast_topk(values: torch.Tensor, topk: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k (values, indices) along ``dim``; k == 1 uses max, which is cheaper and keeps the dim."""
    if topk == 1:
        return torch.max(values, dim=dim, keepdim=True)
    return torch.topk(values, topk, dim=dim)


def select_top_k_tokens(
    i: int,
    topk_p: torch.Tensor,
    topk_index: torch.Tensor,
    hidden_states: DraftRowsLike | None,
    scores: torch.Tensor | None,
    topk: int,
) -> tuple[torch.Tensor, DraftRowsLike | None, torch.Tensor, TreeInfo]:
    """Choose the k beams of draft step ``i``; returns (input_ids, hidden_states, scores, tree_info).

    hidden_states: one tensor [rows, H] or named leaves of leading dim rows (`runtime.topology.draft_rows`:
    the same row selection applies to every leaf).

    i == 0: topk_p, topk_index [b, k]; input_ids [b*k]; hidden [b*k, H]; scores [b, k];
            tree_info = (scores [b, 1, k], tokens [b, k], parents [b, k+1] = -1, 0, .., k-1).
    i >= 1: topk_p, topk_index [b*k, k]; scores [b, k] are the beams' path scores; the k*k
            children are scored scores * topk_p and the best k (child c in [0, k*k)) become the
            beams; tree_info = (child scores [b, k, k], child tokens [b, k*k],
            parents [b, k] = c + k*k*(i-1) + k, the chosen children's candidate indices).
    """
    if i == 0:
        return _select_first(topk_p, topk_index, hidden_states, topk)
    return _select_later(i, topk_p, topk_index, hidden_states, scores, topk)


def _select_first(
    topk_p: torch.Tensor, topk_index: torch.Tensor, hidden_states: DraftRowsLike | None, topk: int
) -> tuple[torch.Tensor, DraftRowsLike | None, torch.Tensor, TreeInfo]:
    """Step 0: the root's k children are the beams."""
    b = topk_p.shape[0]
    if hidden_states is not None:
        hidden_states = map_rows(lambda t: t.repeat_interleave(topk, dim=0), hidden_states)  # [b*k, H]
    parents = torch.arange(-1, topk, dtype=torch.long, device=topk_index.device)
    tree_info = (topk_p.unsqueeze(1), topk_index, parents.expand(b, topk + 1))
    return topk_index.flatten(), hidden_states, topk_p, tree_info


def _select_later(
    i: int,
    topk_p: torch.Tensor,
    topk_index: torch.Tensor,
    hidden_states: DraftRowsLike | None,
    scores: torch.Tensor | None,
    topk: int,
) -> tuple[torch.Tensor, DraftRowsLike | None, torch.Tensor, TreeInfo]:
    """Step i >= 1: expand every beam by its k children, keep the best k paths."""
    if scores is None:
        raise ValueError(f"scores=None at step i={i}: steps i >= 1 need the beams' path scores")
    kk = topk * topk
    child_scores = scores.unsqueeze(2) * topk_p.view(-1, topk, topk)  # [b, k, k]
    best_p, best_c = fast_topk(child_scores.flatten(start_dim=1), topk, dim=-1)  # [b, k]
    child_tokens = topk_index.view(-1, kk)  # [b, k*k]
    input_ids = torch.gather(child_tokens, 1, best_c).flatten()  # [b*k]
    if hidden_states is not None and row_count(hidden_states) > 0:
        b = best_c.shape[0]
        beam_base = torch.arange(b, device=best_c.device).unsqueeze(1) * topk  # [b, 1]
        rows = (best_c // topk + beam_base).flatten()  # parent beam of each chosen child
        hidden_states = map_rows(lambda t: t[rows], hidden_states)
    tree_info = (child_scores, child_tokens, best_c + (kk * (i - 1) + topk))
    return input_ids, hidden_states, best_p, tree_info


def organize_draft_results(
    score_list: Sequence[torch.Tensor],
    token_list: Sequence[torch.Tensor],
    parents_list: Sequence[torch.Tensor],
    num_draft_token: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pick the best N-1 candidates of all steps; returns (parent_list, top_scores_index, draft_tokens).

    score_list: S tensors [b, 1 or k, k] -> candidates [b, k + (S-1)k^2]; token_list likewise [b, *].
    top_scores_index [b, N-1] ascending (a parent precedes its children); draft_tokens [b, N-1];
    parent_list [b, 1 + (S-1)k] = all parents but the last step's (S == 1: int64 [b, 0]).
    """
    scores = torch.cat(list(score_list), dim=1).flatten(1)  # [b, k + (S-1)k^2]
    tokens = torch.cat(list(token_list), dim=1)  # [b, k + (S-1)k^2]
    picked = torch.topk(scores, num_draft_token - 1, dim=-1).indices  # [b, N-1]
    top_scores_index = torch.sort(picked).values  # ascending index == ascending depth
    draft_tokens = torch.gather(tokens, 1, top_scores_index)  # [b, N-1]
    if len(parents_list) > 1:
        parent_list = torch.cat(list(parents_list[:-1]), dim=1)
    else:
        first = parents_list[0]
        parent_list = torch.empty(first.shape[0], 0, dtype=torch.long, device=first.device)
    return parent_list, top_scores_index, draft_tokens


def organize_chain_steps(
    topk_p: torch.Tensor,
    topk_index: torch.Tensor,
    hidden_states: torch.Tensor | None,
    num_steps: int,
    num_draft_tokens: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """General organize of a multi-layer chain draft: topk_p, topk_index [b, S], one token per step.

    This is what SGLang's multi-layer worker runs when its fast path does not apply; for a chain
    it returns parent_list [b, S or 0], top_scores_index [b, S] = 0..S-1 and topk_index itself.
    """
    _, _, _, (step_scores, step_tokens, first_parents) = select_top_k_tokens(
        0, topk_p, topk_index, hidden_states, None, 1
    )
    if num_steps == 1:
        return organize_draft_results([step_scores], [step_tokens], [first_parents], num_draft_tokens)
    score_list, token_list, parents_list = [], [], []
    b = topk_index.shape[0]
    for i in range(num_steps):
        score_list.append(step_scores[:, :, i].unsqueeze(-1))  # [b, 1, 1]
        token_list.append(step_tokens[:, i].unsqueeze(-1))  # [b, 1]
        if i == 0:
            parents_list.append(first_parents)  # [b, 2] = -1, 0
        else:
            parents_list.append(
                torch.full((b, 1), i, dtype=torch.long, device=topk_index.device)
            )
    return organize_draft_results(score_list, token_list, parents_list, num_draft_tokens)
