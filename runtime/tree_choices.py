"""Static draft trees: validation of ``tree_choices`` and the static layout they imply (pure Python).

A static tree is a list of paths of child ranks, as EAGLE-1, Medusa, vLLM
(``speculative_token_tree``) and TensorRT-LLM (``eagle_choices``) write it, e.g.
``((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))``. Nodes are ordered by (depth, path); node j
(0-based, the root excluded) sits at column j of the static layout. The chain of S steps is the
tree ``((0,), (0, 0), .., (0,) * S)``. Everything here depends on the tree only, never on scores,
so it is computed once; `draftgraph.runtime.topology.buffers` turns it into device tensors.
It lives beside `config.py`, whose ``tree_choices`` it checks: the configuration's vocabulary,
below every wing (topology/ builds on it, and nothing here imports a wing).
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from typing import Any

from draftgraph.runtime.validation import ConfigTypeError

__all__ = ["Choices", "StaticTopology", "DepthPlan", "check_tree_choices", "chain_choices",
           "parse_tree_choices"]

Choices = tuple[tuple[int, ...], ...]


def chain_choices(num_steps: int) -> Choices:
    """The chain of ``num_steps`` as a tree: ((0,), (0, 0), ..)."""
    return tuple((0,) * d for d in range(1, num_steps + 1))


def parse_tree_choices(text: str) -> Choices:
    """Parse a command-line value such as ``"[[0], [1], [0, 0]]"`` (JSON or a Python literal).

    Only the structure is checked here; `check_tree_choices` applies the tree rules.
    """
    if not isinstance(text, str):
        raise ConfigTypeError(f"tree_choices={text!r}: the command-line form must be a string")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as json_exc:
        try:
            value = ast.literal_eval(text)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            # literal_eval's messages name AST nodes (e.g. "<ast.UnaryOp object at 0x..>"): not shown
            shown = text if len(text) <= 80 else text[:77] + "..."
            raise ValueError(
                f"tree_choices={shown!r}: not a list of paths; expected JSON or a Python literal: "
                f"a list of paths, each a list of child ranks, such as [[0], [1], [0, 0]] (as JSON: "
                f"{json_exc.msg} at column {json_exc.colno})"
            ) from None
    return _as_paths(value)


def _as_paths(value: Any) -> Choices:
    """Tuple-of-int-tuples form of ``value``, or ConfigTypeError naming the bad element."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ConfigTypeError(
            f"tree_choices={value!r}: must be a sequence of paths (sequences of child ranks)"
        )
    paths = []
    for i, path in enumerate(value):
        if isinstance(path, (str, bytes)) or not hasattr(path, "__iter__"):
            raise ConfigTypeError(
                f"tree_choices[{i}]={path!r}: must be a path, a sequence of int child ranks"
            )
        path = tuple(path)
        for r in path:
            if isinstance(r, bool) or not isinstance(r, int):
                raise ConfigTypeError(
                    f"tree_choices[{i}]={path!r}: rank {r!r} ({type(r).__name__}) must be an int"
                )
        paths.append(path)
    return tuple(paths)


def check_tree_choices(value: Any, num_steps: int, topk: int, num_draft_tokens: int | None
                       ) -> Choices:
    """Validate ``value`` as a static tree for (S, k, N) and return it sorted by (depth, path).

    Rules (each error names the path and the rule): a path is non-empty; ranks are ints in
    [0, topk); no duplicates; every prefix of a path is a path; depth <= num_steps and the
    deepest path has depth == num_steps; num_draft_tokens == len(paths) + 1 when given.
    """
    paths = _as_paths(value)
    if not paths:
        raise ValueError(f"tree_choices=(): needs at least one path (num_steps={num_steps})")
    seen: dict[tuple[int, ...], int] = {}
    for i, path in enumerate(paths):
        if not path:
            raise ValueError(f"tree_choices[{i}]=(): a path needs at least one rank (the root is implied)")
        for r in path:
            if r < 0 or r >= topk:
                raise ValueError(
                    f"tree_choices[{i}]={path}: rank {r} must be in [0, topk={topk})"
                )
        if len(path) > num_steps:
            raise ValueError(
                f"tree_choices[{i}]={path}: depth {len(path)} exceeds num_steps={num_steps}"
            )
        if path in seen:
            raise ValueError(
                f"tree_choices[{i}]={path}: duplicate of tree_choices[{seen[path]}]"
            )
        seen[path] = i
    for i, path in enumerate(paths):
        for d in range(1, len(path)):
            if path[:d] not in seen:
                raise ValueError(
                    f"tree_choices[{i}]={path}: its prefix {path[:d]} is missing "
                    f"(every prefix of a path must itself be a path)"
                )
    deepest = max(len(p) for p in paths)
    if deepest != num_steps:
        raise ValueError(
            f"tree_choices: the deepest path has depth {deepest}, must equal num_steps={num_steps}"
        )
    if num_draft_tokens is not None and num_draft_tokens != len(paths) + 1:
        raise ValueError(
            f"num_draft_tokens={num_draft_tokens!r} with {len(paths)} tree_choices: must equal "
            f"len(tree_choices) + 1 = {len(paths) + 1} (omit it to derive it)"
        )
    return tuple(sorted(paths, key=lambda p: (len(p), p)))


@dataclass(frozen=True)
class DepthPlan:
    """How the draft loop makes the nodes of depth d >= 2 from one forward over depth d-1.

    The forward runs on ``rows`` nodes of depth d-1 (those with children, in node order) and
    takes the top-``topk`` of each; its token table [b, rows * topk] holds this depth's nodes
    at ``columns`` (None: all columns, in order). For the next forward, ``next_positions`` are
    the positions (in this depth) of the nodes with children (None: all of them) and
    ``next_rows`` the forward row of each one's parent, whose hidden state it takes (None: row i
    for position i, the hidden states are used as they are).
    """

    depth: int
    rows: int
    topk: int
    columns: tuple[int, ...] | None
    next_positions: tuple[int, ...] | None
    next_rows: tuple[int, ...] | None


@dataclass(frozen=True)
class StaticTopology:
    """A static tree in the static layout: ``choices`` sorted by (depth, path), N-1 = len(choices).

    Derived (constant) data: ``parents[j]`` = node index (0-based, root excluded) of node j's
    parent, -1 at depth 1; ``depths[j]``; ``first_columns`` = input top-k columns of the depth-1
    nodes; ``first_feed`` = depth-1 nodes with children (their positions); ``levels`` = one
    `DepthPlan` per depth 2..S.
    """

    choices: Choices
    num_steps: int = field(init=False, compare=False, repr=False)
    parents: tuple[int, ...] = field(init=False, compare=False, repr=False)
    depths: tuple[int, ...] = field(init=False, compare=False, repr=False)
    first_columns: tuple[int, ...] = field(init=False, compare=False, repr=False)
    first_feed: tuple[int, ...] = field(init=False, compare=False, repr=False)
    levels: tuple[DepthPlan, ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        choices = self.choices
        if list(choices) != sorted(set(choices), key=lambda p: (len(p), p)) or not choices:
            raise ValueError(f"choices={choices!r}: must be non-empty, unique, sorted by (depth, path)")
        index = {p: j for j, p in enumerate(choices)}
        try:
            parents = tuple(index[p[:-1]] if len(p) > 1 else -1 for p in choices)
        except KeyError as exc:
            raise ValueError(f"choices: prefix {exc.args[0]} missing") from None
        setattr_ = object.__setattr__
        setattr_(self, "num_steps", len(choices[-1]))
        setattr_(self, "parents", parents)
        setattr_(self, "depths", tuple(len(p) for p in choices))
        has_kids = {pj for pj in parents if pj >= 0}
        by_depth = [[j for j, p in enumerate(choices) if len(p) == d]
                    for d in range(1, self.num_steps + 1)]
        setattr_(self, "first_columns", tuple(choices[j][0] for j in by_depth[0]))
        setattr_(self, "first_feed", tuple(i for i, j in enumerate(by_depth[0]) if j in has_kids))
        levels = []
        for d in range(2, self.num_steps + 1):
            fed = [j for j in by_depth[d - 2] if j in has_kids]  # forward rows, in node order
            row_of = {j: r for r, j in enumerate(fed)}
            nodes = by_depth[d - 1]
            k = 1 + max(choices[j][-1] for j in nodes)
            cols = tuple(row_of[parents[j]] * k + choices[j][-1] for j in nodes)
            positions = tuple(i for i, j in enumerate(nodes) if j in has_kids)
            rows = tuple(row_of[parents[nodes[i]]] for i in positions)
            levels.append(DepthPlan(
                depth=d, rows=len(fed), topk=k,
                columns=None if cols == tuple(range(len(fed) * k)) else cols,
                next_positions=None if len(positions) == len(nodes) else positions,
                next_rows=None if rows == tuple(range(len(fed))) else rows,
            ))
        setattr_(self, "levels", tuple(levels))

    @classmethod
    def chain(cls, num_steps: int) -> StaticTopology:
        """The chain of ``num_steps`` drafted tokens."""
        return cls(chain_choices(num_steps))

    @property
    def num_nodes(self) -> int:
        """Drafted nodes, N - 1 (the root excluded)."""
        return len(self.choices)

    @property
    def is_chain(self) -> bool:
        """True when every depth has one node."""
        return self.num_nodes == self.num_steps

    @property
    def parent_width(self) -> int:
        """Columns of the parent_list row: N-1, or 0 for a depth-1 tree (every parent is the root,
        the same convention as organize's S == 1)."""
        return self.num_nodes if self.num_steps > 1 else 0

    def node_parents(self) -> list[int]:
        """Verify-tree parents [N] with the root at 0: -1 for the root, else parent node index."""
        return [-1] + [p + 1 for p in self.parents]

    def __repr__(self) -> str:
        return f"StaticTopology(N={self.num_nodes + 1}, depth={self.num_steps}, choices={self.choices})"
