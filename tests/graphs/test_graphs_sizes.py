"""Capture sizes, the grid and the padding table (pure functions)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings
from hypothesis import strategies as st

from draftgraph.graphs import (
    DEFAULT_MAX_BS,
    capture_batch_sizes,
    grid_sizes,
    padded_size,
    padding_table,
)

FAST = settings(max_examples=40, deadline=None)


@dataclass(frozen=True)
class Decode:
    """Stand-in for a decode config: max_bs, bs, disabled."""

    max_bs: int | None = None
    bs: tuple[int, ...] | list[int] | None = None
    disabled: bool = False


def _expected_step(size: int) -> int:
    """Grid step after ``size`` as the spec states it."""
    if size < 8:
        return 1
    if size < 32:
        return 2
    if size < 64:
        return 4
    if size < 256:
        return 8
    return 16


def test_grid_prefix_matches_spec() -> None:
    grid = grid_sizes(300)
    assert grid[:8] == list(range(1, 9))
    assert grid[8:20] == list(range(10, 33, 2))
    assert grid[20:28] == list(range(36, 65, 4))
    assert grid[28:52] == list(range(72, 257, 8))
    assert grid[52:] == [272, 288, 300]


@FAST
@given(st.integers(1, 600))
def test_grid_steps_and_max_included(max_bs: int) -> None:
    grid = grid_sizes(max_bs)
    assert grid[0] == 1 and grid[-1] == max_bs
    assert grid == sorted(set(grid))
    for a, b in itertools.pairwise(grid[:-1]):
        assert b - a == _expected_step(a)
    if len(grid) > 1:
        assert 0 < grid[-1] - grid[-2] <= _expected_step(grid[-2])


@FAST
@given(st.integers(1, 600), st.one_of(st.none(), st.integers(1, 700)))
def test_capture_sizes_grid_with_limit(max_bs: int, limit: int | None) -> None:
    sizes = capture_batch_sizes(Decode(max_bs=max_bs), limit=limit)
    assert sizes == sorted(set(sizes))
    if limit is None or limit >= max_bs:
        assert sizes == grid_sizes(max_bs)
    else:
        assert sizes[-1] == limit
        assert sizes[:-1] == [s for s in grid_sizes(max_bs) if s < limit]


@FAST
@given(st.lists(st.integers(1, 500), min_size=1, max_size=20), st.one_of(st.none(), st.integers(1, 500)))
def test_capture_sizes_explicit_bs(bs: list[int], limit: int | None) -> None:
    sizes = capture_batch_sizes(Decode(max_bs=7, bs=bs), limit=limit)
    unique = sorted(set(bs))
    if limit is None:
        assert sizes == unique
    else:
        assert all(s <= limit for s in sizes)
        assert [s for s in sizes if s < limit] == [s for s in unique if s < limit]
        assert (limit in sizes) == (limit in unique or max(unique) > limit)


def test_disabled_and_defaults() -> None:
    assert capture_batch_sizes(Decode(max_bs=64, bs=[1, 2], disabled=True)) == []
    assert capture_batch_sizes(Decode()) == grid_sizes(DEFAULT_MAX_BS)
    assert capture_batch_sizes(Decode(bs=[])) == []
    assert capture_batch_sizes(Decode(max_bs=256), limit=48)[-3:] == [40, 44, 48]


@pytest.mark.parametrize(
    ("decode", "limit", "exc", "field"),
    [
        (Decode(max_bs=0), None, ValueError, "decode.max_bs"),
        (Decode(max_bs=2.5), None, TypeError, "decode.max_bs"),
        (Decode(bs=[4, -1]), None, ValueError, "decode.bs[1]"),
        (Decode(bs="12"), None, TypeError, "decode.bs"),
        (Decode(max_bs=8), 0, ValueError, "limit"),
        (Decode(max_bs=8, disabled="no"), None, TypeError, "decode.disabled"),
        (object(), None, TypeError, "max_bs"),
    ],
)
def test_capture_sizes_validation(decode: object, limit: int | None, exc: type, field: str) -> None:
    with pytest.raises(exc, match=field.replace("[", r"\[").replace("]", r"\]")):
        capture_batch_sizes(decode, limit=limit)


@FAST
@given(st.lists(st.integers(1, 300), min_size=1, max_size=12))
def test_padding_table_properties(sizes: list[int]) -> None:
    table = padding_table(sizes)
    captured = sorted(set(sizes))
    assert len(table) == captured[-1] + 1
    previous = 0
    for b in range(1, captured[-1] + 1):
        p = padded_size(table, b)
        assert p is not None and p >= b and p in captured
        assert not any(b <= s < p for s in captured)  # smallest fitting size
        assert p >= previous  # monotone
        previous = p
    for s in captured:
        assert padded_size(table, s) == s
    assert padded_size(table, captured[-1] + 1) is None


def test_padded_size_validation_and_empty() -> None:
    assert padding_table([]) == ()
    assert padded_size((), 1) is None
    with pytest.raises(ValueError, match="b=-1"):
        padded_size(padding_table([4]), -1)
    with pytest.raises(TypeError, match="b=2.0"):
        padded_size(padding_table([4]), 2.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sizes"):
        padding_table([2, 0])
