"""Random numbers keyed, not carried: a uniform is a pure function of (seed, position, column).

Counter-based (as vLLM's newer sampler and SGLang's hashed coins): no generator state, so the
same key gives the same number in eager code, inside a captured graph, on every backend and
every rank, and a speculative step draws for a position exactly what plain decoding draws for
it. The hash is Wellons' "lowbias32" on 32-bit words kept in int64 tensors; every product stays
below 2**63 (no overflow, whatever the backend), so the numbers are bit-identical everywhere.
"""

from __future__ import annotations

import torch

__all__ = ["keyed_uniform", "mix32"]

_M32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for x in [0, 2**32) without leaving int64's positive range."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _M32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijective 32-bit mix of int64 x in [0, 2**32) (lowbias32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def keyed_uniform(seed: torch.Tensor, position: torch.Tensor, vocab: int) -> torch.Tensor:
    """Uniforms in (0, 1), float64 with 53 random bits (never 0 or 1): seed [b] int64 >= 0,
    position [b, N] int64 (the absolute position of the token drawn) -> [b, N, vocab], the
    draw index being the vocabulary column."""
    key = mix32((seed & _M32) ^ mix32(((seed >> 32) & _M32) ^ 0x9E3779B9))  # [b]
    key = mix32(key[:, None] ^ (position & _M32))  # [b, N]
    col = mix32(torch.arange(vocab, dtype=torch.long, device=seed.device) ^ 0x85EBCA6B)  # [V]
    h1 = mix32(key[..., None] ^ col)  # [b, N, V]
    h2 = mix32(h1 ^ 0x27D4EB2F)
    bits = ((h1 >> 6) << 27) | (h2 >> 5)  # 26 + 27 = 53 bits
    return (bits.double() + 0.5) * 2.0**-53
