"""Verify-tree construction from organized draft results, vectorized over the batch (CPU and CUDA).

The rules are those of SGLang's ``build_tree_kernel_efficient`` (its CPU reference
``sgl-kernel/csrc/cpu/spec.cpp`` and its Triton kernel agree on them), on every input it accepts:

- Node 0 of request r is the root (the verified / bonus token); node j >= 1 holds the candidate
  ``c = top_scores_index[r, j-1]``. The row need not be sorted.
- ``slot = c // topk`` indexes parent_list. Slot 0 means the node hangs off the root:
  ``parent_list[:, 0]`` is never read, whatever it holds.
- Any other slot holds the parent's candidate index ``p = parent_list[r, slot]``; the parent is the
  first node of request r (its own N-1 selected entries, never another request's) holding p.
- A node whose parent was not selected stays out of the retrieval tree (it is nobody's child or
  sibling), and a root-ward walk stops at it.
- retrieve_index[r, j] = r*N + j; retrieve_next_token = the smallest linked child or -1;
  retrieve_next_sibling = the next larger linked child of the same parent or -1.
- Tree-mask row j >= 1: column 0 (the root) and the nodes of the root-ward walk j, parent(j), ..;
  the walk stops after a node that hangs off the root, after a node whose parent was not selected,
  or after ``num_steps`` nodes (a cycle is cut there). positions = seq_len + the walk's node count.
  Row 0: column 0 only, position seq_len.
- A parent_list without columns ([b, 0]: S == 1, or a depth-1 static tree) puts every node under
  the root (the kernel never reads it for S == 1, where every slot is 0).

One extension, needed by draftgraph's static layouts (DESIGN.md §8 writes -1 as the parent of a
depth-1 node): a negative parent value also means the root. SGLang's kernel would find no such
parent and leave the node out of the retrieval tree (its mask row and position are the same either
way); ``negative_is_root=False`` gives the kernel's handling. SGLang's organize never writes a
negative value outside slot 0, so on its outputs both agree.

Static layouts (a chain, a static tree: DESIGN.md §8) are decoded with topk == 1. Given the
draft result's ``layout`` (its topology's `VerifyConstants`, see `DraftResult`), `build_tree`
takes the constant route: parents, mask and retrieve arrays are row views of the topology's
constants and only tokens (one cat) and positions = seq_len + depth (one add) are computed; the
results equal the general route's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from draftgraph.runtime.topology.buffers import VerifyConstants
from draftgraph.runtime.validation import require_positive_int

__all__ = ["VerifyTree", "build_tree"]


@dataclass(frozen=True)
class VerifyTree:
    """The verify inputs of a batch of b requests with N tree nodes each.

    tokens [b*N] (root first), positions [b*N] = seq_len + depth, parents [b, N] node indices
    (-1 for the root and for a node whose parent was not selected, 0 for a node hanging off the
    root), tree_mask [b, N, N] bool (row i attends to column j iff j is the root, i, or on i's
    root-ward walk), retrieve_index [b, N] = flat token index, retrieve_next_token [b, N] = first
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
    *,
    layout: VerifyConstants | None = None,
    negative_is_root: bool = True,
) -> VerifyTree:
    """Build the verify tree: verified_id [b], parent_list [b, W] (W = 1+(S-1)k, or 0 for S == 1),
    top_scores_index / draft_tokens [b, N-1] (any order), seq_lens [b]; integer index tensors.

    ``validate=False`` (inside a captured region: no host sync, fixed shapes) returns what SGLang's
    kernel defines for every input it accepts, malformed trees included (module docstring); an
    index out of range is not such an input: the result is then unspecified, but nothing is read
    out of bounds. ``validate=True`` (one host sync) accepts every well-formed input (unsorted rows,
    any root slot value) and raises ValueError naming the request, the node and the rule for an
    index out of range, a parent that was not selected, a cycle, or a root-ward path longer than
    ``num_steps``.

    ``layout`` is the draft result's (`DraftResult.layout`): None decodes the tensors with ``topk``
    (a static layout passed without its layout needs topk=1, ``SpeculativeConfig.layout_topk``);
    a static topology's `VerifyConstants` set ``topk`` and ``num_steps`` to the layout's (1 and
    its depth) and, for b <= its capacity, take the constant route (parent_list and
    top_scores_index are not read: pass a result's own layout only; no host sync, whatever
    ``validate``). TypeError / ValueError for a layout that is not one, or not of N-1 nodes.
    """
    require_positive_int("topk", topk)
    require_positive_int("num_steps", num_steps)
    require_positive_int("num_draft_tokens", num_draft_tokens)
    b, m = _check_inputs(verified_id, parent_list, top_scores_index, draft_tokens, seq_lens,
                         num_draft_tokens)
    if layout is not None:
        _check_layout(layout, m)
        if b <= layout.capacity:  # row views of the constants; only tokens and positions computed
            return _assemble(verified_id, draft_tokens, seq_lens, layout.depth, *layout.view(b))
        # copies above the capacity: the general route, as the static layout it is
        topk, num_steps, negative_is_root = 1, layout.num_steps, True
    n = num_draft_tokens
    dev = top_scores_index.device
    nodes = torch.arange(n, device=dev)
    cand = top_scores_index.to(torch.long)
    parents, slot, at_root, parent_cand = _node_parents(parent_list, cand, nodes, topk,
                                                        negative_is_root)
    mask, steps = _walk(parents, nodes, num_steps, extra_round=validate)
    if validate:
        _validate(cand, parent_list, slot, at_root, parents, steps, topk, num_steps,
                  parent_cand)
        depth = steps
    elif num_steps > n:  # steps = min(walk, N) here: N nodes is a cut (endless) walk
        depth = torch.where(steps >= n, num_steps, steps)
    else:
        depth = steps
    next_token = _first_child(parents, nodes)
    next_sibling = _next_sibling(parents, nodes)
    retrieve_index = torch.arange(b * n, device=dev, dtype=torch.long).view(b, n)
    return _assemble(verified_id, draft_tokens, seq_lens, depth, parents, mask, retrieve_index,
                     next_token, next_sibling)


def _check_inputs(verified_id: torch.Tensor, parent_list: torch.Tensor,
                  top_scores_index: torch.Tensor, draft_tokens: torch.Tensor,
                  seq_lens: torch.Tensor, n: int) -> tuple[int, int]:
    """Shapes and dtypes (metadata only, no host sync); returns (b, N-1)."""
    for name, t in (("parent_list", parent_list), ("top_scores_index", top_scores_index)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}={type(t).__name__}: must be a torch.Tensor")
        if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
            raise TypeError(f"{name} dtype {t.dtype}: must be an integer dtype (indices)")
    if top_scores_index.dim() != 2:
        raise ValueError(f"top_scores_index {tuple(top_scores_index.shape)}: must be [b, num_draft_tokens - 1]")
    b, m = top_scores_index.shape
    if m != n - 1 or draft_tokens.shape != (b, m):
        raise ValueError(
            f"top_scores_index {tuple(top_scores_index.shape)} / draft_tokens "
            f"{tuple(draft_tokens.shape)}: both must be [b, num_draft_tokens - 1] = [{b}, {n - 1}]"
        )
    if parent_list.dim() != 2 or parent_list.shape[0] != b:
        raise ValueError(f"parent_list {tuple(parent_list.shape)}: must be [b, width] with b = {b}")
    if verified_id.shape != (b,) or seq_lens.shape != (b,):
        raise ValueError(
            f"verified_id {tuple(verified_id.shape)} / seq_lens {tuple(seq_lens.shape)}: must be [{b}]"
        )
    return b, m


def _check_layout(layout: object, m: int) -> None:
    """A layout is a VerifyConstants of N-1 = ``m`` nodes (a caller's mix-up, named)."""
    if not isinstance(layout, VerifyConstants):
        raise TypeError(f"layout={type(layout).__name__}: must be a VerifyConstants (a DraftResult's "
                        f"layout) or None")
    if layout.num_nodes != m:
        raise ValueError(f"layout has {layout.num_nodes} nodes: top_scores_index has {m} columns "
                         f"(N-1); pass the layout of the result these tensors come from")


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
    parent_list: torch.Tensor, cand: torch.Tensor, nodes: torch.Tensor, topk: int,
    negative_is_root: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Parent node of every node [b, N]: -1 for the root and for a node whose parent was not
    selected, 0 for a node hanging off the root. Also slot [b, N-1], at_root [b, N-1] and the
    parent candidates [b, N-1] (None when parent_list has no column) for validation."""
    m = cand.shape[1]
    width = parent_list.shape[1]
    slot = cand if topk == 1 else torch.div(cand, topk, rounding_mode="floor")
    if width == 0 or m == 0:  # no parent column (S == 1, a depth-1 static tree): all at depth 1
        node_parent = torch.zeros_like(cand)
        at_root = torch.ones_like(cand, dtype=torch.bool)
        parent_cand = None
    else:
        # slot 0 gathers the root entry too, but at_root discards it: it is never used.
        parent_cand = parent_list.gather(1, slot.clamp(0, width - 1))  # [b, N-1]
        at_root = slot <= 0
        if negative_is_root:
            at_root = at_root | (parent_cand < 0)
        # hit[r, i, j]: node j+1 holds node i+1's parent candidate (the request's own row only)
        hit = cand.unsqueeze(1) == parent_cand.unsqueeze(2)  # [b, N-1, N-1]
        first = torch.where(hit, nodes[1:], m + 1).amin(-1)
        node_parent = first.masked_fill(first > m, -1).masked_fill(at_root, 0)
    root_first = torch.nn.functional.pad(node_parent, (1, 0), value=-1)  # the root's parent: -1
    return root_first, slot, at_root, parent_cand


def _walk(parents: torch.Tensor, nodes: torch.Tensor, num_steps: int, extra_round: bool
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask [b, N, N], steps [b, N]) of the root-ward walks, by rounds of row propagation.

    mask row i: the root, then i, parent(i), .. up to num_steps nodes (N-1 distinct at most, so
    min(num_steps, N-1) nodes suffice). steps = min(walk length, rounds + 1) with
    rounds = min(num_steps - 1, N - 1), one more round (up to N - 1) with ``extra_round``.
    """
    b, n = parents.shape
    nxt = parents.clamp(min=0)  # the walk's next node; the root (0) ends it
    base = (nodes.unsqueeze(1) == nodes) | (nodes == 0)  # [N, N]: itself and the root column
    mask_rounds = max(min(num_steps, n - 1) - 1, 0)
    step_rounds = min(num_steps - (0 if extra_round else 1), n - 1)
    rows = nxt.unsqueeze(-1).expand(b, n, n)
    mask = base.expand(b, n, n)
    one = nodes.clamp(max=1)  # [N]: a walk from i >= 1 counts i itself
    steps = one.expand(b, n)
    for r in range(step_rounds):
        if r < mask_rounds:
            mask = base | torch.gather(mask, 1, rows)
        steps = one + torch.gather(steps, 1, nxt)
    if mask_rounds == 0:
        mask = mask.contiguous()
    if step_rounds == 0:
        steps = steps.contiguous()
    return mask, steps


def _first_child(parents: torch.Tensor, nodes: torch.Tensor) -> torch.Tensor:
    """Smallest linked child node index of every node [b, N], or -1."""
    b, n = parents.shape
    first = torch.full((b, n + 1), n, dtype=torch.long, device=parents.device)
    target = parents[:, 1:].remainder(n + 1)  # no parent (-1) -> the spare column n
    child = nodes[1:].unsqueeze(0).expand(b, n - 1)
    first = first.scatter_reduce(1, target, child, reduce="amin", include_self=True)[:, :n]
    return first.masked_fill(first == n, -1)


def _next_sibling(parents: torch.Tensor, nodes: torch.Tensor) -> torch.Tensor:
    """Next larger node index with the same parent [b, N], or -1 (also for unlinked nodes)."""
    n = parents.shape[1]
    key = torch.where(parents < 0, -1 - nodes, parents)  # unlinked nodes: distinct negative keys
    same = key.unsqueeze(2) == key.unsqueeze(1)  # [b, N, N]
    later = nodes.unsqueeze(0) > nodes.unsqueeze(1)  # [N, N]: column after row
    cand = torch.where(same & later, nodes, n).amin(-1)
    return cand.masked_fill(cand == n, -1)


def _validate(cand: torch.Tensor, parent_list: torch.Tensor, slot: torch.Tensor,
              at_root: torch.Tensor, parents: torch.Tensor, steps: torch.Tensor, topk: int,
              num_steps: int, parent_cand: torch.Tensor | None) -> None:
    """Raise ValueError for the first malformed node; one host sync when all is well."""
    m = cand.shape[1]
    width = parent_list.shape[1]
    out_of_range = (cand < 0) | (slot >= width) if width else cand < 0
    missing = ~at_root & (parents[:, 1:] < 0)
    too_long = steps[:, 1:] > min(num_steps, m)  # steps = min(walk, min(num_steps, N-1) + 1)
    if not bool((out_of_range | missing | too_long).any()):
        return
    r, j = _first(out_of_range)
    if r >= 0:
        c = int(cand[r, j])
        rule = (f"and its parent slot (index // topk = {c // topk}) must be < parent_list width "
                f"{width}" if c >= 0 else "(parent_list has no column)" if not width else "")
        raise ValueError(
            f"top_scores_index[{r}, {j}] = {c} (request {r}, node {j + 1}): out of range; a "
            f"candidate index must be >= 0 {rule}".rstrip()
        )
    r, j = _first(missing)
    if r >= 0:
        s = int(slot[r, j])
        p = int(parent_cand[r, j]) if parent_cand is not None else -1
        raise ValueError(
            f"top_scores_index[{r}, {j}] = {int(cand[r, j])} (request {r}, node {j + 1}): its parent "
            f"candidate parent_list[{r}, {s}] = {p} was not selected (not in top_scores_index[{r}]); "
            f"every selected candidate's parent must be selected"
        )
    r, j = _first(too_long)
    path = _root_path(parents[r].tolist(), j + 1)
    if path[-1] in path[:-1]:
        raise ValueError(
            f"top_scores_index[{r}, {j}] = {int(cand[r, j])} (request {r}, node {j + 1}): its "
            f"root-ward walk {path} is a cycle that never reaches the root; parents must form a tree"
        )
    raise ValueError(
        f"top_scores_index[{r}, {j}] = {int(cand[r, j])} (request {r}, node {j + 1}): its "
        f"root-ward walk {path} has {len(path)} nodes; a node is at most num_steps = {num_steps} "
        f"deep"
    )


def _first(flags: torch.Tensor) -> tuple[int, int]:
    """(row, column) of the first True in row-major order, or (-1, -1)."""
    hits = flags.nonzero()
    return (int(hits[0, 0]), int(hits[0, 1])) if hits.shape[0] else (-1, -1)


def _root_path(parents: list[int], node: int) -> list[int]:
    """The nodes of node's root-ward walk (root excluded), ending at the first repeat if any."""
    path = [node]
    while parents[path[-1]] > 0 and parents[path[-1]] not in path:
        path.append(parents[path[-1]])
    if parents[path[-1]] > 0:
        path.append(parents[path[-1]])
    return path
