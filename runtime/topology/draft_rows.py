"""The draft state carried per row, in one of two forms, and the row operations on both.

A draft step re-selects its per-row state as the tree grows (every root row repeated k times
at step 0, the parents' rows later, per-depth rows in a static topology). That state is either

- one tensor [b, H] (SGLang's ``EagleDraftInput.hidden_states``, `TinyDraftModel`), or
- a NamedTuple (or tuple) of tensors, each with the leading row dim b: named inputs such as
  `HFEagleHead`'s ``DraftRows(feature [b, d], slot [b] int64, position [b] int64,
  base [b] int64, ancestors [b, A, layers, 2, kv_heads, hd])``, gpt-fast's ``forward(idx, input_pos)``
  style rather than float columns packed into one row.

`map_rows` applies one row operation to every leaf and rebuilds the same structure; for a plain
tensor it is exactly the operation itself (same ops, bitwise the same as before). `RowLayout`
is what a worker knows of the form its model expects: the static graph inputs (one per leaf),
the input rules (errors name ``draft_input.hidden_states.<field>``) and the bytes per row.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["DraftRowsLike", "RowLayout", "leaves", "map_rows", "named_leaves", "row_count"]

DraftRowsLike = torch.Tensor | tuple[torch.Tensor, ...]  # [b, H], or leaves of leading dim b


def leaves(rows: DraftRowsLike) -> tuple[torch.Tensor, ...]:
    """The tensors of ``rows`` in field order (a plain tensor is its own single leaf)."""
    return (rows,) if isinstance(rows, torch.Tensor) else tuple(rows)


def _rebuild(like: Any, parts: Sequence[torch.Tensor]) -> DraftRowsLike:
    """``parts`` in the structure of ``like`` (its NamedTuple type, else a tuple)."""
    make = getattr(type(like), "_make", None)
    return make(parts) if make is not None else tuple(parts)


def map_rows(fn: Callable[[torch.Tensor], torch.Tensor], rows: DraftRowsLike) -> DraftRowsLike:
    """``fn`` over every leaf (a row operation: repeat, index, contiguous...), same structure."""
    if isinstance(rows, torch.Tensor):
        return fn(rows)
    return _rebuild(rows, [fn(t) for t in rows])


def row_count(rows: DraftRowsLike) -> int:
    """Rows (dim 0) of ``rows``."""
    return leaves(rows)[0].shape[0]


def _field_names(rows: Any) -> tuple[str, ...]:
    fields = getattr(rows, "_fields", None)
    return tuple(fields) if fields is not None else tuple(str(i) for i in range(len(rows)))


def named_leaves(rows: Any, prefix: str = "hidden_states") -> list[tuple[str, Any]]:
    """(name, leaf) pairs for messages: ``prefix`` for a tensor (or None), ``prefix.<field>``
    for each leaf of a tuple."""
    if rows is None or isinstance(rows, torch.Tensor) or not isinstance(rows, tuple):
        return [(prefix, rows)]
    return [(f"{prefix}.{name}", t) for name, t in zip(_field_names(rows), rows)]


@dataclass(frozen=True)
class RowLayout:
    """The per-row state a draft model takes: ``fields`` () for one tensor [b, H]; else one
    entry per leaf, each of trailing shape ``shapes[i]`` and dtype ``dtypes[i]``, rebuilt with
    ``make`` (the template's NamedTuple ``_make``, or tuple)."""

    fields: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]
    make: Callable[[Sequence[torch.Tensor]], Any] = tuple

    @classmethod
    def tensor(cls, hidden_size: int, dtype: torch.dtype) -> RowLayout:
        """One tensor [b, hidden_size] of ``dtype``."""
        return cls((), ((hidden_size,),), (dtype,))

    @classmethod
    def from_template(cls, template: Any) -> RowLayout:
        """The layout of a model's ``row_template(rows, device)``: a NamedTuple or tuple of
        tensors with one leading row dim. TypeError naming the field otherwise."""
        if not isinstance(template, tuple) or not template:
            raise TypeError(f"row_template()={type(template).__name__}: must be a non-empty NamedTuple "
                            f"or tuple of tensors")
        fields = _field_names(template)
        for name, t in zip(fields, template):
            if not isinstance(t, torch.Tensor) or t.dim() == 0:
                raise TypeError(f"row_template().{name}={type(t).__name__}: must be a tensor with a leading "
                                f"row dim")
        make = getattr(type(template), "_make", tuple)
        return cls(fields, tuple(tuple(t.shape[1:]) for t in template), tuple(t.dtype for t in template), make)

    @property
    def structured(self) -> bool:
        """True for named leaves, False for one tensor [b, H]."""
        return bool(self.fields)

    @property
    def hidden_size(self) -> int | None:
        """H of the one-tensor form (None for named leaves)."""
        return None if self.fields else self.shapes[0][0]

    def input_names(self, prefix: str = "hidden_states") -> tuple[str, ...]:
        """Static graph input names, one per leaf (identifiers: the manager calls step(**inputs))."""
        if not self.fields:
            return (prefix,)
        return tuple(f"{prefix}_{f}" for f in self.fields)

    def zeros(self, rows: int, device: torch.device) -> list[torch.Tensor]:
        """One zero tensor per leaf with ``rows`` rows (the static inputs; a zero pad row)."""
        return [torch.zeros(rows, *shape, dtype=dtype, device=device)
                for shape, dtype in zip(self.shapes, self.dtypes)]

    def assemble(self, parts: Sequence[torch.Tensor]) -> DraftRowsLike:
        """The model's form from its leaves in field order."""
        return self.make(parts) if self.fields else parts[0]

    def row_bytes(self) -> int:
        """Bytes of one row over every leaf (the memory estimate's per-row input)."""
        return sum(math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
                   for shape, dtype in zip(self.shapes, self.dtypes))

    def describe(self) -> str:
        """A short text of the layout (rank fingerprints compare it)."""
        if not self.fields:
            return f"[{self.shapes[0][0]}] {self.dtypes[0]}"
        return ", ".join(f"{f}{list(s)} {d}" for f, s, d in zip(self.fields, self.shapes, self.dtypes))

    # ---- the input rules (named leaves; the one-tensor form is checked by the worker) --------
    def check_shapes(self, rows: Any, b: int) -> None:
        """A tuple of len(fields) tensors, each [b, *shape]: ValueError naming the field."""
        if isinstance(rows, torch.Tensor) or not isinstance(rows, tuple) or len(rows) != len(self.fields):
            got = tuple(rows.shape) if isinstance(rows, torch.Tensor) else type(rows).__name__
            raise ValueError(f"draft_input.hidden_states={got}: must be a tuple of {len(self.fields)} tensors "
                             f"({', '.join(self.fields)}) with {b} rows each")
        names = getattr(rows, "_fields", None)
        if names is not None and tuple(names) != self.fields:
            raise ValueError(f"draft_input.hidden_states has fields {tuple(names)}: must be {self.fields}")
        for f, t, shape in zip(self.fields, rows, self.shapes):
            if not isinstance(t, torch.Tensor) or t.shape != (b, *shape):
                got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"draft_input.hidden_states.{f}={got}: must be [b, ...] = "
                                 f"{[b, *shape]}")

    def check_dtypes(self, rows: tuple[torch.Tensor, ...]) -> None:
        """Each leaf of its dtype: TypeError naming the field."""
        for f, t, dtype in zip(self.fields, rows, self.dtypes):
            if t.dtype is not dtype:
                raise TypeError(f"draft_input.hidden_states.{f} has dtype {t.dtype}: must be {dtype} "
                                f"(on every backend)")

    def check_device(self, rows: tuple[torch.Tensor, ...], device: torch.device) -> None:
        """Each leaf on ``device``: ValueError naming the field."""
        for f, t in zip(self.fields, rows):
            if t.device != device:
                raise ValueError(f"draft_input.hidden_states.{f} is on {t.device}: must be on the worker's "
                                 f"device {device}")
