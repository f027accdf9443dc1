"""Tree verify and greedy acceptance.

The target runs once over every request's N tree tokens. Node i's K/V is written at cache
position seq_len + i (not seq_len + depth: siblings share a depth); the mask lets node i see the
committed prefix and its own ancestors. After acceptance the accepted nodes' K/V move to
consecutive positions (the commit), so the cache again holds exactly the committed tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from draftgraph.runtime import VerifyTree

__all__ = ["Acceptance", "verify_mask", "accept_greedy"]


def verify_mask(tree: VerifyTree, seq_lens: torch.Tensor, lk: int) -> torch.Tensor:
    """[b, N, Lk] bool: key j < seq_len (prefix), or j == seq_len + c with c an ancestor-or-self."""
    b, n, _ = tree.tree_mask.shape
    rel = torch.arange(lk, device=seq_lens.device)[None] - seq_lens[:, None]  # [b, Lk]
    in_tree = (rel >= 0) & (rel < n)
    col = rel.clamp(0, n - 1).unsqueeze(1).expand(b, n, lk)
    tree_part = tree.tree_mask.gather(2, col) & in_tree.unsqueeze(1)
    return tree_part | (rel < 0).unsqueeze(1)


@dataclass(frozen=True)
class Acceptance:
    """Per request: accepted node indices (root first) and the tokens they commit (accepted
    drafts, then the bonus)."""

    paths: list[list[int]]
    tokens: list[list[int]]


def accept_greedy(tree: VerifyTree, target_argmax: torch.Tensor) -> Acceptance:
    """Walk from the root: at each node take the target's argmax, move to the child (first child,
    then its next siblings) holding that token, stop when none does; the last argmax is the bonus.

    target_argmax [b, N]: the target's greedy token after each node."""
    b, n = tree.parents.shape
    pred = target_argmax.tolist()
    toks = tree.tokens.view(b, n).tolist()
    first = tree.retrieve_next_token.tolist()
    sib = tree.retrieve_next_sibling.tolist()
    paths, out = [], []
    for i in range(b):
        node, path = 0, [0]
        p, t, f, s = pred[i], toks[i], first[i], sib[i]
        while True:
            want = p[node]
            c = f[node]
            while c != -1 and t[c] != want:
                c = s[c]
            if c == -1:
                break
            path.append(c)
            node = c
        paths.append(path)
        out.append([t[c] for c in path[1:]] + [p[node]])
    return Acceptance(paths, out)
