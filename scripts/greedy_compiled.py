"""Target-only greedy decoding with a compiled per-token decode step: the baseline a compiled
speculative engine is measured against (issue 31: speculation must keep paying when the
target-only path is graphed too).

Prefill is `greedy.prefill` (eager, one prompt at a time), as in `greedy_generate`. Each decode
token runs one `torch.compile`-d step (inductor, ``dynamic=False``): embed, every block over the
static per-slot KV cache, final norm, lm_head and the argmax. Its shapes are fixed per batch
size and per *attention tier*: keys are read over the first ``tier`` cache positions, the
smallest tier that holds every request's next position, under a mask built from the lengths
on the device (gpt-fast's full-length mask is the single tier ``max_len``). So a batch compiles
once per tier it reaches, never per length. The loop reads the new tokens on the host once per
token (``tolist``), as `greedy_generate` does.

Outputs equal `greedy_generate`'s (tests/engine/test_greedy_compiled.py): the target runs in float64,
and the masked positions add exact zeros to the softmax.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from draftgraph.runtime.models.greedy import greedy_generate, prefill_batch

__all__ = ["CompiledGreedy", "default_tiers"]

_RECOMPILE_LIMIT = 64  # one compile per (batch size, tier): more than dynamo's default of 8


def default_tiers(max_len: int, smallest: int = 64) -> tuple[int, ...]:
    """Powers of two from ``smallest`` below ``max_len``, then ``max_len``."""
    if max_len < 1 or smallest < 1:
        raise ValueError(f"max_len={max_len}, smallest={smallest}: must be >= 1")
    tiers, t = [], smallest
    while t < max_len:
        tiers.append(t)
        t *= 2
    return (*tiers, max_len)


def _decode(target: Any, last: torch.Tensor, lens: torch.Tensor, slots: torch.Tensor, cache: Any,
            tier: int) -> torch.Tensor:
    """One greedy token for every request: last [B] tokens at positions lens [B] in ``slots``
    [B]; attends over cache positions < ``tier``. Returns the next tokens [B]."""
    mask = (torch.arange(tier, device=lens.device)[None] <= lens[:, None]).unsqueeze(1)
    logits, _ = target(last[:, None], lens[:, None], lens[:, None], slots, mask, cache)
    return logits[:, 0].argmax(-1)


class CompiledGreedy:
    """Greedy decoding of ``target`` with the decode step compiled (see the module docstring).

    ``tiers``: the attention lengths compiled (ascending; the last may not exceed the target's
    ``max_len``; default `default_tiers`). ``compile_backend``: torch.compile's backend
    ("inductor"; "eager" checks the loop without compiling)."""

    def __init__(self, target: Any, tiers: Sequence[int] | None = None, compile_backend: str = "inductor") -> None:
        limit = target.cfg.max_len
        tiers = tuple(tiers) if tiers is not None else default_tiers(limit)
        if not tiers or list(tiers) != sorted(set(tiers)) or tiers[0] < 1 or tiers[-1] > limit:
            raise ValueError(f"tiers={tiers!r}: must be ascending distinct ints in [1, max_len={limit}]")
        self.target = target
        self.tiers = tiers
        self._step = torch.compile(_decode, backend=compile_backend, dynamic=False)

    def tier_for(self, length: int) -> int:
        """The smallest tier holding ``length`` cache positions; ValueError past the largest."""
        for t in self.tiers:
            if t >= length:
                return t
        raise ValueError(f"length={length}: past the largest attention tier {self.tiers[-1]}")

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
        """``max_new_tokens`` greedy ids per prompt (as `greedy_generate`)."""
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens!r}: must be an int >= 1")
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("prompts: need at least one, each of at least one token")
        longest = max(len(p) for p in prompts) + max_new_tokens
        if longest > self.tiers[-1]:
            raise ValueError(f"prompts: {longest} positions needed, past the largest tier {self.tiers[-1]}")
        target = self.target
        if max_new_tokens == 1:
            return greedy_generate(target, prompts, 1)  # no decode step: nothing to compile
        dev = target.embed.weight.device
        b = len(prompts)
        cache, out = prefill_batch(target, prompts)
        lens_host = [len(p) for p in prompts]
        lens = torch.tensor(lens_host, device=dev)
        slots = torch.arange(1, b + 1, device=dev)
        last = torch.tensor([o[0] for o in out], device=dev)
        top = max(lens_host)
        with torch._dynamo.config.patch(recompile_limit=_RECOMPILE_LIMIT):
            for _ in range(max_new_tokens - 1):
                last = self._step(target, last, lens, slots, cache, self.tier_for(top + 1))
                lens = lens + 1
                top += 1
                for o, t in zip(out, last.tolist()):
                    o.append(t)
        return out
