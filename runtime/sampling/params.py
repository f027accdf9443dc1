"""`SamplingParams`: one request's sampling parameters, checked when built."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["GREEDY", "MAX_SEED", "SamplingParams", "per_prompt"]

MAX_SEED = 2**63 - 1  # a seed lives in an int64 slot tensor


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}={value!r}: must be a number")
    if not math.isfinite(value):
        raise ValueError(f"{name}={value!r}: must be finite")
    return float(value)


@dataclass(frozen=True)
class SamplingParams:
    """How a request draws its tokens, applied in this order to the target's logits: divide by
    ``temperature`` (0: greedy, the argmax, bitwise the greedy path), keep the ``top_k`` most
    likely tokens (0: all), then the smallest most-likely set holding ``top_p`` of the mass
    (1.0: all), then the tokens with probability >= ``min_p`` times the largest (0.0: all);
    draw from what is left. ``seed`` keys the random numbers (None: the engine draws one and
    logs it, so a run can be replayed)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        t = _number("temperature", self.temperature)
        if t < 0:
            raise ValueError(f"temperature={self.temperature!r}: must be >= 0 (0 means greedy)")
        p = _number("top_p", self.top_p)
        if not 0 < p <= 1:
            raise ValueError(f"top_p={self.top_p!r}: must be in (0, 1] (1 keeps every token)")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int):
            raise TypeError(f"top_k={self.top_k!r}: must be an int (0 keeps every token)")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k!r}: must be >= 0 (0 keeps every token)")
        m = _number("min_p", self.min_p)
        if not 0 <= m <= 1:
            raise ValueError(f"min_p={self.min_p!r}: must be in [0, 1] (0 keeps every token)")
        if self.seed is not None:
            if isinstance(self.seed, bool) or not isinstance(self.seed, int):
                raise TypeError(f"seed={self.seed!r}: must be an int or None")
            if not 0 <= self.seed <= MAX_SEED:
                raise ValueError(f"seed={self.seed!r}: must be in [0, 2**63 - 1]")

    @property
    def greedy(self) -> bool:
        """Temperature 0: the argmax, no random number drawn."""
        return self.temperature == 0

    def with_seed(self, seed: int) -> SamplingParams:
        """The same parameters with ``seed``."""
        return SamplingParams(self.temperature, self.top_p, self.top_k, self.min_p, seed)


GREEDY = SamplingParams(temperature=0.0)


def per_prompt(sampling: object, n: int) -> list:
    """One entry per prompt from ``sampling``: a list / tuple of ``n`` entries, or one entry for
    all ``n`` (ValueError for a list of another length)."""
    per = list(sampling) if isinstance(sampling, (list, tuple)) else [sampling] * n
    if len(per) != n:
        raise ValueError(f"sampling: {len(per)} entries for {n} prompts; give one or one per prompt")
    return per
