"""Chain (topk == 1) constants: the parent list and score indices every chain draft returns.

For a chain, organize's cat/topk/sort/gather is the identity on the drafted tokens and the
other two outputs are constants, so they are built once per (num_steps, capacity, device) and a
batch of b <= capacity rows gets views of the first b rows. A live graph may return or read these
tensors: they are never written after construction, and `ChainBufferCache.get` hands out the very
same tensors for the same key while anyone still holds them.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from .validation import require_positive_int

__all__ = ["ChainKey", "ChainBuffers", "ChainBufferCache"]


@dataclass(frozen=True)
class ChainKey:
    """Identity of a set of chain buffers."""

    num_steps: int
    capacity: int
    device: str


class ChainBuffers:
    """Constant chain outputs, contiguous int64 on ``device``.

    parents [capacity, S if S > 1 else 0], rows = -1, 0, .., S-2 (constant);
    score_indices [capacity, S], rows = 0, .., S-1 (constant).
    Never written after construction; free only when no graph that returns them is alive.
    """

    __slots__ = ("key", "parents", "score_indices", "_views", "__weakref__")

    def __init__(self, num_steps: int, capacity: int, device: str | torch.device = "cpu") -> None:
        require_positive_int("num_steps", num_steps)
        require_positive_int("capacity", capacity)
        dev = torch.device(device)
        self.key = ChainKey(num_steps, capacity, str(dev))
        width = num_steps if num_steps > 1 else 0
        # repeat, not expand: consumers read the rows as contiguous memory.
        self.parents = torch.arange(-1, width - 1, dtype=torch.long, device=dev).repeat(capacity, 1)
        self.score_indices = torch.arange(num_steps, dtype=torch.long, device=dev).repeat(capacity, 1)
        self._views: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def num_steps(self) -> int:
        """S the buffers were built for."""
        return self.key.num_steps

    @property
    def capacity(self) -> int:
        """Rows available; a batch above this takes the general path."""
        return self.key.capacity

    @property
    def device(self) -> torch.device:
        """Device holding both tensors."""
        return self.parents.device

    @property
    def nbytes(self) -> int:
        """Bytes held by both tensors."""
        return (self.parents.numel() + self.score_indices.numel()) * self.parents.element_size()

    def view(self, bs: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Row views (parents [bs, S or 0], score_indices [bs, S]) for a batch of bs <= capacity.

        The view objects are cached per bs (a dict hit instead of two slices on the hot path);
        they are constants: read them, do not write to them or change their metadata in place.
        """
        found = self._views.get(bs)
        if found is not None:
            return found
        if isinstance(bs, bool) or not isinstance(bs, int) or not 1 <= bs <= self.capacity:
            raise ValueError(f"bs={bs!r}: must be an int in [1, capacity={self.capacity}]")
        found = self._views[bs] = (self.parents[:bs], self.score_indices[:bs])
        return found

    def __repr__(self) -> str:
        k = self.key
        return f"ChainBuffers(num_steps={k.num_steps}, capacity={k.capacity}, device={k.device!r})"


class ChainBufferCache:
    """Per-worker cache: the same key returns the same ChainBuffers while anything holds them.

    Entries are weak: buffers nobody (no state, no graph) holds any more are freed, so repeated
    reconfiguration does not grow memory.
    """

    def __init__(self) -> None:
        self._live: weakref.WeakValueDictionary[ChainKey, ChainBuffers] = weakref.WeakValueDictionary()

    def get(self, num_steps: int, capacity: int, device: str | torch.device) -> ChainBuffers:
        """The live buffers for (num_steps, capacity, device), built when none are alive."""
        key = ChainKey(num_steps, capacity, str(torch.device(device)))
        found = self._live.get(key)
        if found is None:
            found = ChainBuffers(num_steps, capacity, device)
            self._live[key] = found
        return found

    def __len__(self) -> int:
        return len(self._live)
