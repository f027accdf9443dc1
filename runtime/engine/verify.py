"""Tree verify, greedy acceptance and the K/V commit, on the device.

The target runs once over every request's N tree tokens. Node i's K/V is written at cache
position seq_len + i (not seq_len + depth: siblings share a depth); the mask lets node i see the
committed prefix and its own ancestors. Acceptance walks every request's tree at once, one depth
per round, with tensors; the host reads its result once (`Acceptance`). The commit then moves
the accepted nodes' K/V to consecutive positions, so the cache again holds exactly the
committed tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from draftgraph.runtime import VerifyTree

__all__ = ["Acceptance", "accept", "commit_kv", "root_only_tree", "tree_verify_mask", "verify_mask"]


def verify_mask(tree: VerifyTree, seq_lens: torch.Tensor, lk: int) -> torch.Tensor:
    """[b, N, Lk] bool: key j < seq_len (prefix), or j == seq_len + c with c an ancestor-or-self."""
    return tree_verify_mask(tree.tree_mask, seq_lens, lk)


def tree_verify_mask(tree_mask: torch.Tensor, seq_lens: torch.Tensor, lk: int) -> torch.Tensor:
    """`verify_mask` from the tree's mask [b, N, N] and the lengths [b] (tensors only: the verify
    graph builds its mask from its static rows, so a length is data, never a shape)."""
    b, n, _ = tree_mask.shape
    rel = torch.arange(lk, device=seq_lens.device)[None] - seq_lens[:, None]  # [b, Lk]
    in_tree = (rel >= 0) & (rel < n)
    col = rel.clamp(0, n - 1).unsqueeze(1).expand(b, n, lk)
    tree_part = tree_mask.gather(2, col) & in_tree.unsqueeze(1)
    return tree_part | (rel < 0).unsqueeze(1)


def root_only_tree(bonus: torch.Tensor, lens: torch.Tensor) -> VerifyTree:
    """The verify tree of a step without speculation: each request's bonus token alone (N=1)."""
    b = bonus.shape[0]
    none = torch.full((b, 1), -1, dtype=torch.long, device=bonus.device)
    return VerifyTree(tokens=bonus.clone(), positions=lens.clone(), parents=none,
                      tree_mask=torch.ones(b, 1, 1, dtype=torch.bool, device=bonus.device),
                      retrieve_index=torch.arange(b, device=bonus.device)[:, None],
                      retrieve_next_token=none, retrieve_next_sibling=none)


@dataclass(frozen=True)
class Acceptance:
    """One verify step's acceptance, on the device and as the host read it (once).

    Device: ``path`` [b, D+1] accepted node indices (root first; entries past ``length`` are 0),
    ``length`` [b] accepted nodes (root included, so 1..D+1), ``tokens`` [b, D+1] the tokens they
    commit (accepted drafts, then the bonus: the target's argmax at each accepted node).
    Host: ``paths`` / ``committed`` the same, cut at each request's length."""

    path: torch.Tensor
    length: torch.Tensor
    tokens: torch.Tensor
    paths: list[list[int]]
    committed: list[list[int]]

    @property
    def lengths(self) -> list[int]:
        return [len(p) for p in self.paths]


def accept(tree: VerifyTree, target_argmax: torch.Tensor, depth: int, chain: bool = False) -> Acceptance:
    """Greedy acceptance of every request at once: from the root, take the target's argmax at
    the current node and move to the child holding that token (the smallest node index among
    them: the first child, then its next siblings), stop when none does; the last argmax is the
    bonus. ``depth``: the deepest node (S; 0 for a root-only tree). target_argmax [b, N].
    ``chain``: the tree is a chain (node j at depth j, N = depth + 1): the accepted length is the
    run of leading matches, found in a few ops instead of one round per depth.

    One host read (the `Acceptance`'s lists); everything before it runs on the device."""
    b, n = tree.parents.shape
    toks = tree.tokens.view(b, n)
    if chain and depth:
        path = torch.arange(depth + 1, device=toks.device).expand(b, depth + 1)
        run = (toks[:, 1:] == target_argmax[:, :-1]).cumprod(1)  # [b, S]: 1 while every draft matched
        length = 1 + run.sum(1)
        path = path * (path < length[:, None])  # entries past the length are 0, as below
    else:
        path, length = _walk(tree.parents, toks, target_argmax, depth)
    tokens = target_argmax.gather(1, path)
    host = torch.cat([length[:, None], path, tokens], 1).tolist()  # the step's one host read
    w = depth + 1
    paths = [row[1:1 + row[0]] for row in host]
    committed = [row[1 + w:1 + w + row[0]] for row in host]
    return Acceptance(path, length, tokens, paths, committed)


def _walk(parents: torch.Tensor, toks: torch.Tensor, target_argmax: torch.Tensor, depth: int
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """The general tree's acceptance, one round per depth: (path [b, D+1], length [b])."""
    b = toks.shape[0]
    node = torch.zeros(b, dtype=torch.long, device=toks.device)
    alive = torch.ones(b, dtype=torch.bool, device=toks.device)
    cols = [node]
    for _ in range(depth):
        want = target_argmax.gather(1, node[:, None])  # [b, 1]
        match = (parents == node[:, None]) & (toks == want)  # children of node holding want
        found = match.any(1) & alive
        node = torch.where(found, match.to(torch.uint8).argmax(1), node)  # the first match
        alive = found
        cols.append(torch.where(found, node, 0))
    path = torch.stack(cols, 1)  # [b, D+1]
    length = 1 + (path[:, 1:] != 0).sum(1) if depth else torch.ones(b, dtype=torch.long, device=toks.device)
    return path, length


def commit_kv(cache: object, slots: torch.Tensor, lens: torch.Tensor, acc: Acceptance) -> None:
    """Move the accepted nodes' K/V to consecutive positions (seq_len + depth) in every layer of
    ``cache`` (a `KVCache`); rows that do not move write the dummy slot 0. Nothing runs when no
    accepted node is out of place (always so for a chain)."""
    if all(p == list(range(len(p))) for p in acc.paths):
        return
    d = acc.path.shape[1]
    depth = torch.arange(d, device=slots.device)[None]
    move = (depth < acc.length[:, None]) & (acc.path != depth)
    wslot = torch.where(move, slots[:, None], 0)
    src = lens[:, None] + acc.path
    dst = lens[:, None] + depth.expand_as(src)
    cache.move(wslot.flatten(), torch.where(move, src, 0).flatten(), torch.where(move, dst, 0).flatten())
