"""Test oracles for `build_tree`: SGLang's tree-building rules as a plain Python loop per request,
the list of what `validate=True` must reject, and SGLang's own Triton kernel run on the CPU.

`reference_tree` follows the rules of SGLang's ``build_tree_kernel_efficient`` as its CPU version
(``sgl-kernel/csrc/cpu/spec.cpp``) states them, one request and one node at a time, with no
tensor code shared with `draftgraph.runtime.topology.verify_tree`:

- retrieval: nodes N-1 .. 1 in turn; a node whose slot (candidate // topk) is 0 is linked under the
  root, else under the first node of its own request holding parent_list[r, slot]; a node whose
  parent is not found is not linked. Linking i under p makes i the first child of p and the old
  first child i's next sibling.
- mask and positions: row t starts with column 0; the walk from t marks a node, then stops if the
  node's slot is 0 or its parent is not found, else moves to the parent; at most num_steps marks.
  position = seq_len + number of marks. Row 0 marks column 0 only.

With ``negative_is_root`` a negative parent value also means the root (draftgraph's extension for
static layouts); without it, the kernel's handling (parent not found).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch

__all__ = ["KernelTree", "reference_tree", "expected_error", "sglang_triton_tree"]


@dataclass(frozen=True)
class KernelTree:
    """Per request r: positions[r] [N] (absolute), mask[r] [N][N], retrieve_index[r],
    next_token[r], next_sibling[r] [N]; parents[r] [N] = the parent node each node is linked
    under (-1 for the root and an unlinked node), the meaning of VerifyTree.parents."""

    positions: list[list[int]]
    mask: list[list[list[bool]]]
    retrieve_index: list[list[int]]
    next_token: list[list[int]]
    next_sibling: list[list[int]]
    parents: list[list[int]]


def _parent_of(plist: list[int], sel: list[int], node: int, topk: int, negative_is_root: bool
               ) -> int | None:
    """The parent node of ``node`` (>= 1): 0 for the root, None when its parent is not selected.
    A parent_list without columns puts every node under the root (draftgraph's depth-1 layouts)."""
    slot = sel[node - 1] // topk
    if slot == 0 or not plist:
        return 0
    wanted = plist[slot]
    if negative_is_root and wanted < 0:
        return 0
    for q, c in enumerate(sel):  # this request's N-1 entries only
        if c == wanted:
            return q + 1
    return None


def reference_tree(parent_list: list[list[int]], selected: list[list[int]], seq_lens: list[int],
                   topk: int, num_steps: int, n: int, negative_is_root: bool = False) -> KernelTree:
    """The kernel's outputs for in-range inputs (every slot > 0 a valid parent_list column)."""
    out = KernelTree([], [], [], [], [], [])
    for r, (plist, sel, seq_len) in enumerate(zip(parent_list, selected, seq_lens)):
        assert len(sel) == n - 1

        def parent(node: int, plist: list[int] = plist, sel: list[int] = sel) -> int | None:
            return _parent_of(plist, sel, node, topk, negative_is_root)

        first = [-1] * n
        sibling = [-1] * n
        linked = [-1] * n
        for i in range(n - 1, 0, -1):
            p = parent(i)
            if p is None:
                continue
            linked[i] = p
            if first[p] != -1:
                sibling[i] = first[p]
            first[p] = i
        rows, positions = [], []
        for t in range(n):
            row = [False] * n
            row[0] = True
            marks = 0
            cur = t
            while t > 0 and marks < num_steps:
                marks += 1
                row[cur] = True
                p = parent(cur)
                if p is None or p == 0:
                    break
                cur = p
            rows.append(row)
            positions.append(seq_len + marks)
        out.positions.append(positions)
        out.mask.append(rows)
        out.retrieve_index.append([r * n + i for i in range(n)])
        out.next_token.append(first)
        out.next_sibling.append(sibling)
        out.parents.append(linked)
    return out


def expected_error(parent_list: list[list[int]], selected: list[list[int]], topk: int,
                   num_steps: int, negative_is_root: bool = True) -> tuple[str, int, int] | None:
    """What `build_tree(validate=True)` must report first, as (rule, request, node), or None.

    Rules in the order they are checked over the whole batch: "range" (a negative candidate or a
    parent slot past a parent_list that has columns), "missing" (parent not selected), then per node "cycle" or
    "deep" (a root-ward walk of more than num_steps nodes)."""
    for r, (plist, sel) in enumerate(zip(parent_list, selected)):
        width = len(plist)
        for j, c in enumerate(sel):
            if c < 0 or (width and c // topk >= width):
                return ("range", r, j + 1)
    for r, (plist, sel) in enumerate(zip(parent_list, selected)):
        for j in range(len(sel)):
            if _parent_of(plist, sel, j + 1, topk, negative_is_root) is None:
                return ("missing", r, j + 1)
    for r, (plist, sel) in enumerate(zip(parent_list, selected)):
        for j in range(len(sel)):
            seen = [j + 1]
            while True:
                p = _parent_of(plist, sel, seen[-1], topk, negative_is_root)
                if p == 0:
                    break
                if p in seen:
                    return ("cycle", r, j + 1)
                seen.append(p)
            if len(seen) > num_steps:
                return ("deep", r, j + 1)
    return None


def sglang_triton_tree(parent_list: torch.Tensor, selected: torch.Tensor, seq_lens: torch.Tensor,
                       topk: int, num_steps: int, n: int) -> KernelTree:
    """SGLang 0.5.23's own Triton ``build_tree_kernel_efficient`` run by Triton's CPU interpreter
    (QLEN_ONLY mask), or a skip when SGLang or Triton cannot run it here. In-range inputs only."""
    kernel = _triton_kernel()
    b = selected.shape[0]
    parent_list = parent_list.to(torch.long).contiguous()
    selected = selected.to(torch.long).contiguous()
    seq_lens = seq_lens.to(torch.long).contiguous()
    mask = torch.ones(b * n * n, dtype=torch.bool)
    positions = torch.zeros(b * n, dtype=torch.long)
    index, first, sibling = torch.full((3, b, n), -1, dtype=torch.long).unbind(0)
    kernel[(b,)](
        parent_list, selected, seq_lens, torch.cumsum(seq_lens, 0) - seq_lens, mask, positions,
        index, first, sibling, topk=topk, depth=num_steps, draft_token_num=n, tree_mask_mode=1,
        batch_size=b, parent_list_stride=max(parent_list.shape[1], 1),
        selected_index_stride=max(selected.shape[1], 1),
    )
    return KernelTree(
        positions=positions.view(b, n).tolist(),
        mask=mask.view(b, n, n).tolist(),
        retrieve_index=index.tolist(),
        next_token=first.tolist(),
        next_sibling=sibling.tolist(),
        parents=[],
    )


_KERNEL: list[object] = []


def _triton_kernel() -> object:
    """The interpreted Triton kernel (cached), or a skip."""
    if _KERNEL:
        return _KERNEL[0]
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from sglang.kernels.ops.speculative import spec_tree
            from triton.runtime.interpreter import InterpretedFunction
        kernel = InterpretedFunction(spec_tree.sgl_build_tree_kernel_efficient_triton.fn)
    except Exception as exc:  # ImportError, or an import-time failure of its dependencies
        if os.environ.get("DRAFTGRAPH_REQUIRE_SGLANG") == "1":
            raise
        pytest.skip(f"SGLang's Triton build_tree kernel cannot run here: {exc!r}")
    _KERNEL.append(kernel)
    return kernel
