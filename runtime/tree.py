"""Verify-tree construction from organized draft results, vectorized over the batch (CPU and CUDA).

Node 0 of each request is the root (the verified / bonus token); node j >= 1 is the candidate
``top_scores_index[:, j-1]``. Candidate c's parent slot is ``c // topk`` in parent_list; slot 0 is
the root, any other slot holds the parent's candidate index, which is also selected (its path
score is at least the child's) and, the indices being sorted, sits at a smaller node index.

Static layouts (a chain, a static tree: DESIGN.md §8) are decoded with topk == 1. When
parent_list and top_scores_index are the organize outputs of a topology's buffers (recognized
by their tag, see `draftgraph.runtime.topology`), `build_tree` takes the constant route: parents,
mask and retrieve arrays are row views of the topology's constants and only tokens (one cat)
and positions = seq_len + depth (one add) are computed; the results equal the general route's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .topology import static_layout_of

__all__ = ["VerifyTree", "build_tree"]


@dataclass(frozen=True)
class VerifyTree:
    """The verify inputs of a batch of b requests with N tree nodes each.

    tokens [b*N] (root first), positions [b*N] = seq_len + depth, parents [b, N] node indices
    (-1 for the root), tree_mask [b, N, N] bool (row i attends to column j iff j is i or an
    ancestor of i), retrieve_index [b, N] = flat token index, retrieve_next_token [b, N] = first
    child (smallest node index) or -1, retrieve_next_sibling [b, N] = next sibling (ascending) or -1.
    """

    tokens: torch.Tensor
    positions: torch.Tensor
    parents: torch.Tensor
    tree_mask: torch.Tensor
    retrieve_index: torch.Tensor
    retrieve_next_token: torch.Tensor
    retrieve_next_sibling: torch.Tensor


def build_tree(
    verified_id: torch.Tensor,
    parent_list: torch.Tensor,
    top_scores_index: torch.Tensor,
    draft_tokens: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    num_steps: int,
    num_draft_tokens: int,
    validate: bool = True,
) -> VerifyTree:
    """Build the verify tree: verified_id [b], parent_list [b, 1+(S-1)k or 0],
    top_scores_index / draft_tokens [b, N-1] (ascending indices), seq_lens [b].

    ``validate`` checks that every candidate's parent was selected (one host sync); pass False
    inside a captured region. Outputs of a static topology's buffers are recognized and take
    the constant route (``topk`` is then 1 whatever is passed: the static layout's); a static
    layout that is not recognized must be passed with topk=1 (``SpeculativeConfig.layout_topk``).
    """
    b, m = top_scores_index.shape
    n = num_draft_tokens
    if m != n - 1 or draft_tokens.shape != (b, m):
        raise ValueError(
            f"top_scores_index {tuple(top_scores_index.shape)} / draft_tokens "
            f"{tuple(draft_tokens.shape)}: both must be [b, num_draft_tokens - 1] = [{b}, {n - 1}]"
        )
    if verified_id.shape != (b,) or seq_lens.shape != (b,):
        raise ValueError(
            f"verified_id {tuple(verified_id.shape)} / seq_lens {tuple(seq_lens.shape)}: must be [{b}]"
        )
    layout = static_layout_of(parent_list, top_scores_index)
    if layout is not None and layout.num_nodes == m:
        if b <= layout.capacity:  # row views of the constants; only tokens and positions computed
            return _assemble(verified_id, draft_tokens, seq_lens, layout.depth, *layout.view(b))
        topk, num_steps = 1, layout.num_steps  # copies above the capacity: the general route
    dev = top_scores_index.device
    parents = _node_parents(parent_list, top_scores_index, topk, validate)  # [b, N]
    mask = _ancestor_mask(parents, min(num_steps, n - 1))  # [b, N, N]
    depth = mask.sum(-1) - 1  # [b, N]
    nodes = torch.arange(n, device=dev)
    next_token = _first_child(parents, nodes)
    next_sibling = _next_sibling(parents, nodes)
    retrieve_index = torch.arange(b * n, device=dev, dtype=torch.long).view(b, n)
    return _assemble(verified_id, draft_tokens, seq_lens, depth, parents, mask, retrieve_index,
                     next_token, next_sibling)


def _assemble(verified_id: torch.Tensor, draft_tokens: torch.Tensor, seq_lens: torch.Tensor,
              depth: torch.Tensor, parents: torch.Tensor, mask: torch.Tensor,
              retrieve_index: torch.Tensor, next_token: torch.Tensor, next_sibling: torch.Tensor
              ) -> VerifyTree:
    """The VerifyTree: tokens = root + drafts (one cat), positions = seq_len + depth (one add)."""
    tokens = torch.cat([verified_id.to(draft_tokens.dtype).unsqueeze(1), draft_tokens], dim=1)
    return VerifyTree(
        tokens=tokens.flatten(),
        positions=(_integral(seq_lens).unsqueeze(1) + depth).flatten(),
        parents=parents,
        tree_mask=mask,
        retrieve_index=retrieve_index,
        retrieve_next_token=next_token,
        retrieve_next_sibling=next_sibling,
    )


def _integral(seq_lens: torch.Tensor) -> torch.Tensor:
    """seq_lens as they are when integral (adding the int64 depth promotes them: no extra op),
    else converted to int64."""
    return seq_lens.to(torch.long) if seq_lens.is_floating_point() or seq_lens.is_complex() else seq_lens


def _node_parents(
    parent_list: torch.Tensor, top_scores_index: torch.Tensor, topk: int, validate: bool
) -> torch.Tensor:
    """Parent node index of every node [b, N]; the root's is -1."""
    b, m = top_scores_index.shape
    cand = top_scores_index.to(torch.long)
    slot = cand // topk  # [b, N-1]
    if parent_list.shape[1] == 0:
        parent_cand = torch.full_like(cand, -1)
    else:
        width = parent_list.shape[1]
        if validate and bool((slot >= width).any()):
            raise ValueError(
                f"top_scores_index // topk reaches slot {int(slot.max())}: parent_list has width {width}"
            )
        parent_cand = parent_list.to(torch.long).gather(1, slot.clamp(max=width - 1))
    pos = torch.searchsorted(cand.contiguous(), parent_cand.clamp(min=0).contiguous())
    pos = pos.clamp(max=m - 1)
    is_root_child = parent_cand < 0
    if validate:
        found = cand.gather(1, pos) == parent_cand
        if not bool((found | is_root_child).all()):
            raise ValueError("top_scores_index: a selected candidate's parent was not selected")
    node_parent = torch.where(is_root_child, torch.zeros_like(pos), pos + 1)
    root = torch.full((b, 1), -1, dtype=torch.long, device=cand.device)
    return torch.cat([root, node_parent], dim=1)


def _ancestor_mask(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """mask[b, i, j] = j is i or an ancestor of i, by max_depth rounds of row propagation."""
    b, n = parents.shape
    eye = torch.eye(n, dtype=torch.bool, device=parents.device).expand(b, n, n)
    rows = parents.clamp(min=0).unsqueeze(-1).expand(b, n, n)
    mask = eye.clone()
    for _ in range(max_depth):
        mask = eye | torch.gather(mask, 1, rows)
    return mask


def _first_child(parents: torch.Tensor, nodes: torch.Tensor) -> torch.Tensor:
    """Smallest child node index of every node [b, N], or -1."""
    b, n = parents.shape
    first = torch.full((b, n), n, dtype=torch.long, device=parents.device)
    child = nodes[1:].unsqueeze(0).expand(b, n - 1)
    first = first.scatter_reduce(1, parents[:, 1:], child, reduce="amin", include_self=True)
    return torch.where(first == n, torch.full_like(first, -1), first)


def _next_sibling(parents: torch.Tensor, nodes: torch.Tensor) -> torch.Tensor:
    """Next larger node index with the same parent [b, N], or -1."""
    n = parents.shape[1]
    same = parents.unsqueeze(2) == parents.unsqueeze(1)  # [b, N, N]
    later = nodes.unsqueeze(0) > nodes.unsqueeze(1)  # [N, N]: column after row
    cand = torch.where(same & later, nodes.expand(n, n), torch.full_like(nodes, n).expand(n, n))
    nxt = cand.min(dim=-1).values
    return torch.where(nxt == n, torch.full_like(nxt, -1), nxt)
