"""`AdmissionRules`: what a request must be for the engine to take it, written once.

The engine's request table checks every `add` against them, and the HTTP routes ask the same
object (the engine's own, `RequestTable.rules`) before they queue a request, so a 400 and the
engine's ValueError are one rule with one set of limits (issue 50: the routes kept copies).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["AdmissionRules"]


@dataclass(frozen=True)
class AdmissionRules:
    """Token ids in [0, ``vocab_size``); a prompt of at least one token; the prompt plus the
    tokens asked for plus ``reserve`` positions (the widest verify tree) within ``max_len``, the
    cache's positions per request."""

    vocab_size: int
    max_len: int
    reserve: int

    def refusal(self, prompt_ids: Sequence[int], max_new_tokens: int, field: str = "prompt_ids",
                budget: str = "max_new_tokens") -> str | None:
        """Why the request cannot be served (naming ``field`` / ``budget``, the value and the
        rule), or None when it can."""
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            return f"{budget}={max_new_tokens!r}: must be an int >= 1"
        if not prompt_ids:
            return f"{field}=[]: a prompt needs at least one token"
        v = self.vocab_size
        for i, t in enumerate(prompt_ids):
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < v:
                return f"{field}[{i}]={t!r}: token ids must be ints in [0, {v})"
        if len(prompt_ids) + max_new_tokens + self.reserve > self.max_len:
            return (f"{field} of {len(prompt_ids)} tokens + {budget}={max_new_tokens}: must leave {self.reserve} "
                    f"positions for the verify tree within the cache's max_len={self.max_len} per request")
        return None

    def check(self, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
        """The prompt as a list; ValueError with the `refusal` when it cannot be served."""
        ids = list(prompt_ids)
        why = self.refusal(ids, max_new_tokens)
        if why is not None:
            raise ValueError(why)
        return ids
