"""The growth helper of the memory tests (tests/support/memory_support.py) sees a leak and names its site."""

from __future__ import annotations

import pytest
from memory_support import assert_no_growth, slope

pytest.importorskip("psutil")


def test_slope_is_the_least_squares_fit():
    assert slope([3.0, 5.0, 7.0, 9.0]) == pytest.approx(2.0)
    assert slope([4.0, 4.0, 4.0]) == 0.0 and slope([1.0]) == 0.0


def test_a_steady_leak_fails_and_names_where_it_allocates():
    kept: list[bytes] = []

    def leak(i: int) -> None:
        kept.append(b"x" * 256 * 1024)  # 256 KB written per cycle, kept forever

    with pytest.raises(AssertionError) as failure:
        assert_no_growth(leak, warmup=2, window=20, every=4, per_cycle=16 * 1024, noise_floor=2**20, unit="request")
    message = str(failure.value)
    assert "KB per request" in message and "test_memory_support.py" in message  # the growing site


def test_no_growth_passes():
    scratch: list[bytes] = []

    def churn(i: int) -> None:  # allocates and frees: no growth
        scratch.append(b"y" * 256 * 1024)
        scratch.clear()

    growth = assert_no_growth(churn, warmup=2, window=20, every=4, per_cycle=16 * 1024, noise_floor=2**20)
    assert growth.steady < 16 * 1024 + 2**20 / 20
