"""Seeds for requests that bring none: drawn from the engine's own generator and logged, so a
run can be replayed from its log (give the logged seed back in `SamplingParams`)."""

from __future__ import annotations

import logging
import random

from draftgraph.runtime.sampling import GREEDY, SamplingParams
from draftgraph.runtime.sampling.params import MAX_SEED

__all__ = ["SeedSource"]

logger = logging.getLogger(__name__)


class SeedSource:
    """Resolves a request's `SamplingParams`: None is greedy; a sampled request without a seed
    gets the next number of a generator seeded with ``seed`` (None: from the OS)."""

    def __init__(self, seed: int | None = None) -> None:
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"sampling_seed={seed!r}: must be an int or None")
        self._rng = random.Random(seed)

    def resolve(self, sampling: SamplingParams | None) -> SamplingParams:
        """``sampling`` with a seed when it samples (TypeError for anything but a SamplingParams
        or None)."""
        if sampling is None:
            return GREEDY
        if not isinstance(sampling, SamplingParams):
            raise TypeError(f"sampling={sampling!r}: must be a SamplingParams or None")
        if sampling.greedy or sampling.seed is not None:
            return sampling
        return sampling.with_seed(self._rng.randint(0, MAX_SEED))

    @staticmethod
    def log(rid: int, given: SamplingParams | None, used: SamplingParams) -> None:
        """Log the seed drawn for request ``rid`` (nothing when the caller gave one)."""
        if used.seed is not None and (given is None or given.seed is None):
            logger.info("request %d: sampling seed %d drawn (temperature %s); pass seed=%d to replay it",
                        rid, used.seed, used.temperature, used.seed)
