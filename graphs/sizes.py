"""Capture batch sizes and the padding lookup: pure, torch-free functions over plain values."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "DEFAULT_MAX_BS",
    "capture_batch_sizes",
    "grid_sizes",
    "padded_size",
    "padding_table",
]

DEFAULT_MAX_BS = 256
"""Grid top used when a decode config gives neither ``max_bs`` nor ``bs``."""

# (upper bound, step) pairs of the default grid: 1..8 by 1, to 32 by 2, to 64 by 4,
# to 256 by 8, beyond that by 16.
_GRID_STEPS: tuple[tuple[int, int], ...] = ((8, 1), (32, 2), (64, 4), (256, 8))
_GRID_TAIL_STEP = 16


def _check_positive_int(field: str, value: Any) -> int:
    """Return ``value`` if it is a positive int (bool excluded), else raise naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{field}={value!r} ({type(value).__name__}): must be an int")
    if value < 1:
        raise ValueError(f"{field}={value!r}: must be >= 1")
    return value


def grid_sizes(max_bs: int) -> list[int]:
    """Default grid up to ``max_bs``: 1..8, step 2 to 32, 4 to 64, 8 to 256, 16 beyond; max_bs included."""
    _check_positive_int("max_bs", max_bs)
    sizes: list[int] = []
    size, step = 1, 1
    while size <= max_bs:
        sizes.append(size)
        step = next((s for bound, s in _GRID_STEPS if size < bound), _GRID_TAIL_STEP)
        size += step
    if sizes[-1] != max_bs:
        sizes.append(max_bs)
    return sizes


def _cap(sizes: Iterable[int], limit: int | None) -> list[int]:
    """Sorted unique sizes with those above ``limit`` dropped and ``limit`` added when any was."""
    unique = sorted(set(sizes))
    if limit is None:
        return unique
    kept = [s for s in unique if s <= limit]
    if len(kept) < len(unique) and (not kept or kept[-1] != limit):
        kept.append(limit)
    return kept


def capture_batch_sizes(decode: Any, limit: int | None = None) -> list[int]:
    """Batch sizes to capture, ascending, from a decode config (``max_bs``, ``bs``, ``disabled``).

    ``decode.disabled`` gives ``[]``. An explicit ``decode.bs`` list wins (sorted,
    deduplicated; an empty list gives ``[]``). Otherwise the default grid runs up to
    ``decode.max_bs``, which is always included; when ``max_bs`` is None too, the grid
    runs up to ``DEFAULT_MAX_BS`` (256). ``limit`` (the request pool size) caps the list:
    sizes above it are dropped and ``limit`` itself is added when any size exceeded it.
    """
    for attr in ("max_bs", "bs", "disabled"):
        if not hasattr(decode, attr):
            raise TypeError(f"decode={decode!r}: needs attributes max_bs, bs and disabled; missing {attr!r}")
    if limit is not None:
        _check_positive_int("limit", limit)
    if not isinstance(decode.disabled, bool):
        raise TypeError(f"decode.disabled={decode.disabled!r}: must be a bool")
    if decode.disabled:
        return []
    if decode.bs is not None:
        if isinstance(decode.bs, (str, bytes)) or not isinstance(decode.bs, Sequence):
            raise TypeError(f"decode.bs={decode.bs!r}: must be a sequence of ints or None")
        sizes = [_check_positive_int(f"decode.bs[{i}]", s) for i, s in enumerate(decode.bs)]
        return _cap(sizes, limit)
    max_bs = DEFAULT_MAX_BS if decode.max_bs is None else _check_positive_int("decode.max_bs", decode.max_bs)
    return _cap(grid_sizes(max_bs), limit)


def padding_table(sizes: Iterable[int]) -> tuple[int, ...]:
    """Table whose index b (0..max(sizes)) holds the smallest size >= b; ``()`` for no sizes."""
    ordered = sorted({_check_positive_int("sizes[]", s) for s in sizes})
    if not ordered:
        return ()
    table: list[int] = []
    idx = 0
    for b in range(ordered[-1] + 1):
        if b > ordered[idx]:
            idx += 1
        table.append(ordered[idx])
    return tuple(table)


def padded_size(table: Sequence[int], b: int) -> int | None:
    """Smallest captured size >= ``b`` from a ``padding_table``; None when b is above the largest."""
    if isinstance(b, bool) or not isinstance(b, int):
        raise TypeError(f"b={b!r} ({type(b).__name__}): must be an int")
    if b < 0:
        raise ValueError(f"b={b}: must be >= 0")
    return table[b] if b < len(table) else None
