"""Memory tests that measure growth, not a level: bytes per cycle, fitted, with a stated noise floor.

An absolute bound ("RSS grew less than 8 MB") mixes two things: the plateau a process settles
on (allocator arenas, bounded caches, first-use tables: a few MB, and different on a loaded
machine) and a leak (a steady amount per reload or per request, forever). Only the second is a
bug, and only a slope sees it. `assert_no_growth`:

1. runs ``warmup`` cycles (the plateau settles; not measured),
2. runs two windows of ``window`` cycles, reading the bytes the process holds every ``every``
   cycles after a `gc.collect`, and fits bytes per cycle by least squares in each window,
3. passes when the smaller of the two slopes is within ``per_cycle`` plus the noise floor
   spread over the window (``noise_floor / window``): a leak grows every window alike, while a
   late arena step or a cache filling up shows in one window only,
4. on a failure, runs one more window under `tracemalloc` and names the allocation sites that
   grew most (top differences by line), so the message says *what* grows, not only that it does.

Units are cycles of the caller's choosing (a reload, a request, a capture and release); the
assertion message says which. The bytes held are malloc's in-use bytes (glibc ``mallinfo2``), not
the RSS: in a process that already freed much (a test run), new allocations reuse freed pages
and the RSS stays flat under a real leak (measured: a planted 256 KB per cycle showed 0 KB per
cycle of RSS after 400 other tests). Without glibc the RSS is read (psutil).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Growth", "assert_no_growth", "measure_growth", "slope"]


def slope(ys: list[float]) -> float:
    """Least-squares slope of ``ys`` against 0, 1, 2, ... (0 for fewer than two points)."""
    n = len(ys)
    if n < 2:
        return 0.0
    mx, my = (n - 1) / 2, sum(ys) / n
    return sum((x - mx) * (y - my) for x, y in enumerate(ys)) / sum((x - mx) ** 2 for x in range(n))


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]


@functools.lru_cache(maxsize=1)
def _mallinfo2() -> Callable[[], _MallInfo2] | None:
    """glibc's ``mallinfo2`` (2.33+), or None elsewhere."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    return fn


def _live_bytes() -> int:
    """Bytes the process holds allocated: with glibc, malloc's in-use bytes (``uordblks`` +
    ``hblkhd``: live blocks, tensor storage included, whatever the heap had freed before, so a
    process that already freed much still shows a leak); else the RSS (psutil)."""
    info = _mallinfo2()
    if info is not None:
        m = info()
        return int(m.uordblks + m.hblkhd)
    import psutil

    return int(psutil.Process().memory_info().rss)


@dataclass(frozen=True)
class Growth:
    """Bytes per cycle fitted over each measured window (``per_cycle``), and the samples (bytes held)."""

    unit: str
    window: int
    per_cycle: tuple[float, float]
    samples: tuple[tuple[int, ...], tuple[int, ...]]

    @property
    def steady(self) -> float:
        """The growth both windows show (the smaller slope): what a leak keeps adding."""
        return min(self.per_cycle)

    def describe(self) -> str:
        a, b = self.per_cycle
        return (f"{a / 1024:.1f} KB and {b / 1024:.1f} KB per {self.unit} over two windows of {self.window} "
                f"(held {self.samples[0][0] / 2**20:.1f} -> {self.samples[1][-1] / 2**20:.1f} MB)")


def _window(cycle: Callable[[int], None], start: int, count: int, every: int) -> tuple[int, ...]:
    gc.collect()
    samples = [_live_bytes()]
    for i in range(start, start + count):
        cycle(i)
        if (i - start + 1) % every == 0:
            gc.collect()
            samples.append(_live_bytes())
    return tuple(samples)


def measure_growth(cycle: Callable[[int], None], warmup: int, window: int, every: int = 1,
                   unit: str = "cycle") -> Growth:
    """Run ``cycle(i)`` ``warmup`` times, then two windows of ``window`` cycles; the fitted slopes."""
    if window < 2 * every:
        raise ValueError(f"window={window}: needs at least two samples (every={every})")
    for i in range(warmup):
        cycle(i)
    first = _window(cycle, warmup, window, every)
    second = _window(cycle, warmup + window, window, every)
    per = (slope([float(s) for s in first]) / every, slope([float(s) for s in second]) / every)
    return Growth(unit, window, per, (first, second))


def growing_sites(cycle: Callable[[int], None], start: int, count: int, top: int = 8) -> str:
    """The allocation sites that grew most over ``count`` more cycles under tracemalloc."""
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start(8)
    try:
        gc.collect()
        before = tracemalloc.take_snapshot()
        for i in range(start, start + count):
            cycle(i)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        if not was_tracing:
            tracemalloc.stop()
    diffs = [d for d in after.compare_to(before, "lineno") if d.size_diff > 0][:top]
    if not diffs:
        return "  (no Python allocation site grew: the growth is outside Python's allocator)"
    return "\n".join(f"  {d.size_diff / 1024:+.1f} KB in {d.count_diff:+d} blocks at {d.traceback}" for d in diffs)


def assert_no_growth(cycle: Callable[[int], None], *, warmup: int, window: int, per_cycle: float,
                     noise_floor: float, every: int = 1, unit: str = "cycle") -> Growth:
    """AssertionError unless the steady growth is at most ``per_cycle`` bytes per ``unit`` plus
    ``noise_floor`` bytes spread over a window (see the module docstring); the message names the
    growing allocation sites. Returns the measurement."""
    growth = measure_growth(cycle, warmup, window, every, unit)
    allowed = per_cycle + noise_floor / window
    print(f"memory: {growth.describe()}; allowed {allowed / 1024:.1f} KB per {unit}")  # shown with -s or on failure
    if growth.steady > allowed:
        sites = growing_sites(cycle, warmup + 2 * window, window)
        raise AssertionError(f"memory grows: {growth.describe()}; allowed {allowed / 1024:.1f} KB per {unit} "
                             f"({per_cycle / 1024:.1f} KB + a noise floor of {noise_floor / 2**20:.1f} MB per "
                             f"window). Allocation sites that grew over {window} more {unit}s:\n{sites}")
    return growth
