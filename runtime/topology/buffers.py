"""Topology buffers: the constants of a static draft tree (the chain is one) on a device.

For a static topology, organize's outputs and the verify tree's mask, depths and retrieve arrays
never depend on the scores, so they are built once per (topology, capacity, device) and a batch
of b <= capacity rows gets views of the first b rows. A live graph may return or read these
tensors: they are never written after construction, and `TopologyBufferCache.get` hands out the
very same tensors for the same key while anyone (a state, a graph) still holds them.

A worker returns a static layout's organize outputs with its `VerifyConstants` as the
`DraftResult`'s ``layout`` value, and `build_tree(..., layout=...)` then takes the constant route:
no host read, no lookup table, nothing inferred from the tensors.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from draftgraph.runtime.tree_choices import StaticTopology
from draftgraph.runtime.validation import ConfigTypeError, require_positive_int

__all__ = ["TopologyKey", "TopologyBuffers", "TopologyBufferCache", "VerifyConstants", "Selector"]

# A column/row selection: a slice (a view, no kernel) or a constant int64 index (index_select).
Selector = slice | torch.Tensor


@dataclass(frozen=True)
class TopologyKey:
    """Identity of a set of topology buffers."""

    topology: StaticTopology
    capacity: int
    device: str

    @property
    def num_steps(self) -> int:
        """Depth of the topology (S of a chain)."""
        return self.topology.num_steps


class VerifyConstants:
    """The verify tree of a static topology, repeated over ``capacity`` rows (contiguous).

    node_parents [cap, N] (-1 for the root), tree_mask [cap, N, N] bool, retrieve_index [cap, N]
    (row r = r*N .. r*N+N-1), retrieve_next_token / retrieve_next_sibling [cap, N], depth [1, N].
    Constants: never written; `view(b)` gives the first b rows (cached per b).
    """

    __slots__ = ("num_nodes", "num_steps", "capacity", "depth", "node_parents", "tree_mask",
                 "retrieve_index", "next_token", "next_sibling", "_views")

    def __init__(self, topology: StaticTopology, capacity: int, device: torch.device) -> None:
        n = topology.num_nodes + 1
        parents = topology.node_parents()
        depth = [0] + list(topology.depths)
        mask = [[False] * n for _ in range(n)]
        for i in range(n):
            j = i
            while j >= 0:
                mask[i][j] = True
                j = parents[j]
        kids: list[list[int]] = [[] for _ in range(n)]
        for j in range(1, n):
            kids[parents[j]].append(j)
        next_token = [c[0] if c else -1 for c in kids]
        next_sibling = [-1] * n
        for c in kids:
            for a, b in zip(c, c[1:]):
                next_sibling[a] = b

        def rows(values: list) -> torch.Tensor:
            t = torch.tensor(values, device=device)
            return t.unsqueeze(0).repeat(capacity, *([1] * t.dim()))  # repeat, not expand

        self.num_nodes, self.num_steps, self.capacity = n - 1, topology.num_steps, capacity
        self.depth = torch.tensor([depth], dtype=torch.long, device=device)
        self.node_parents = rows(parents)
        self.tree_mask = rows(mask)
        self.retrieve_index = torch.arange(capacity * n, dtype=torch.long, device=device).view(capacity, n)
        self.next_token = rows(next_token)
        self.next_sibling = rows(next_sibling)
        self._views: dict[int, tuple[torch.Tensor, ...]] = {}

    def view(self, bs: int) -> tuple[torch.Tensor, ...]:
        """(node_parents, tree_mask, retrieve_index, next_token, next_sibling), first bs rows
        (a symbolic bs, recording one graph for every size, is sliced each time, not cached)."""
        if isinstance(bs, torch.SymInt):
            return (self.node_parents[:bs], self.tree_mask[:bs], self.retrieve_index[:bs],
                    self.next_token[:bs], self.next_sibling[:bs])
        found = self._views.get(bs)
        if found is None:
            if not 1 <= bs <= self.capacity:
                raise ValueError(f"bs={bs!r}: must be an int in [1, capacity={self.capacity}]")
            found = self._views[bs] = (self.node_parents[:bs], self.tree_mask[:bs],
                                       self.retrieve_index[:bs], self.next_token[:bs],
                                       self.next_sibling[:bs])
        return found

    @property
    def nbytes(self) -> int:
        """Bytes of all tensors."""
        return sum(t.numel() * t.element_size() for t in
                   (self.depth, self.node_parents, self.tree_mask, self.retrieve_index,
                    self.next_token, self.next_sibling))


class TopologyBuffers:
    """Constants of one static topology on ``device``, contiguous int64, ``capacity`` rows.

    Organize outputs (static layout, DESIGN.md §8): parents [cap, W] (W = N-1, or 0 for a
    depth-1 tree) = each node's parent column, -1 at depth 1; score_indices [cap, N-1] = 0..N-2.
    The chain of S is the topology ((0,), (0, 0), ..): parents rows -1, 0, .., S-2 and
    score_indices rows 0, .., S-1. ``verify`` holds the verify-tree constants; ``first_columns``,
    ``first_feed`` (``first_rows`` of them) and ``levels`` (rows, topk, columns, next_positions,
    next_rows per depth >= 2) are the draft loop's selectors: slices, int64 indices or None.
    Never written after construction; free only when no graph that reads or returns them lives.
    """

    __slots__ = ("key", "parents", "score_indices", "verify", "first_columns", "first_feed",
                 "first_rows", "levels", "_views", "__weakref__")

    def __init__(self, topology: StaticTopology, capacity: int,
                 device: str | torch.device = "cpu") -> None:
        if not isinstance(topology, StaticTopology):
            raise ConfigTypeError(f"topology={topology!r}: must be a StaticTopology")
        require_positive_int("capacity", capacity)
        dev = torch.device(device)
        self.key = TopologyKey(topology, capacity, str(dev))
        width = topology.parent_width
        parents = torch.tensor(topology.parents[:width], dtype=torch.long, device=dev)
        # repeat, not expand: consumers read the rows as contiguous memory.
        self.parents = parents.repeat(capacity, 1)
        self.score_indices = torch.arange(topology.num_nodes, dtype=torch.long,
                                          device=dev).repeat(capacity, 1)
        self.verify = VerifyConstants(topology, capacity, dev)
        self.first_columns = _selector(topology.first_columns, dev)
        self.first_feed = _selector(topology.first_feed, dev)
        self.first_rows = len(topology.first_feed)
        self.levels = tuple(
            (lv.rows, lv.topk, _selector(lv.columns, dev), _selector(lv.next_positions, dev),
             _selector(lv.next_rows, dev))
            for lv in topology.levels
        )
        self._views: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def topology(self) -> StaticTopology:
        """The static tree these constants describe."""
        return self.key.topology

    @property
    def num_steps(self) -> int:
        """Depth of the topology (S)."""
        return self.key.topology.num_steps

    @property
    def num_draft_tokens(self) -> int:
        """N (the root included)."""
        return self.key.topology.num_nodes + 1

    @property
    def capacity(self) -> int:
        """Rows available; a batch above this gets fresh copies."""
        return self.key.capacity

    @property
    def device(self) -> torch.device:
        """Device holding the tensors."""
        return self.parents.device

    @property
    def layout(self) -> VerifyConstants:
        """The layout value of this topology's draft results (`DraftResult.layout`): its verify
        constants, for the rows of `view` as well as of `copies`."""
        return self.verify

    @property
    def nbytes(self) -> int:
        """Bytes held by the organize outputs and the verify constants."""
        own = (self.parents.numel() + self.score_indices.numel()) * self.parents.element_size()
        return own + self.verify.nbytes

    def view(self, bs: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Row views (parents [bs, W], score_indices [bs, N-1]) for a batch of bs <= capacity.

        The view objects are cached per bs (a dict hit instead of two slices on the hot path);
        they are constants: read them, do not write to them or change their metadata in place.
        A symbolic bs (recording one graph for every size) is sliced each time, not cached.
        """
        if isinstance(bs, torch.SymInt):
            return self.parents[:bs], self.score_indices[:bs]
        found = self._views.get(bs)
        if found is not None:
            return found
        if isinstance(bs, bool) or not isinstance(bs, int) or not 1 <= bs <= self.capacity:
            raise ValueError(f"bs={bs!r}: must be an int in [1, capacity={self.capacity}]")
        found = self._views[bs] = (self.parents[:bs], self.score_indices[:bs])
        return found

    def copies(self, bs: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Fresh contiguous (parents, score_indices) of bs rows, any bs (above the capacity); their
        layout is still `layout` (`build_tree` decodes them generally, with topk 1)."""
        return self.parents[:1].expand(bs, -1).clone(), self.score_indices[:1].expand(bs, -1).clone()

    def __repr__(self) -> str:
        k = self.key
        return f"TopologyBuffers({k.topology!r}, capacity={k.capacity}, device={k.device!r})"


def _selector(index: tuple[int, ...] | None, device: torch.device) -> Selector | None:
    """None stays None; a contiguous run becomes a slice (a view); anything else an int64 index."""
    if index is None:
        return None
    if index and list(index) == list(range(index[0], index[0] + len(index))):
        return slice(index[0], index[0] + len(index))
    return torch.tensor(index, dtype=torch.long, device=device)


class TopologyBufferCache:
    """Per-worker cache: the same key returns the same TopologyBuffers while anything holds them.

    Entries are weak: buffers nobody (no state, no graph) holds any more are freed, so repeated
    reconfiguration does not grow memory.
    """

    def __init__(self) -> None:
        self._live: weakref.WeakValueDictionary[TopologyKey, TopologyBuffers] = (
            weakref.WeakValueDictionary())

    def get(self, topology: StaticTopology, capacity: int, device: str | torch.device
            ) -> TopologyBuffers:
        """The live buffers for (topology, capacity, device), built when none are alive."""
        key = TopologyKey(topology, capacity, str(torch.device(device)))
        found = self._live.get(key)
        if found is None:
            found = TopologyBuffers(topology, capacity, device)
            self._live[key] = found
        return found

    def __len__(self) -> int:
        return len(self._live)
