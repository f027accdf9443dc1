"""Request bookkeeping of the engine: what each running request holds between steps, and how a
request ends (finished, aborted or failed)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["Request", "RequestFailed"]


class RequestFailed(RuntimeError):
    """A request failed (its admission raised): raised by `SpecDecodeEngine.result` and
    `pop_result` for it, with the original exception chained as ``__cause__``."""

    def __init__(self, rid: int, message: str) -> None:
        super().__init__(message)
        self.rid = rid


@dataclass
class Request:
    """One generation request.

    ``seq_len`` counts tokens whose target K/V is committed; ``bonus`` is the next token (at
    position ``seq_len``, not yet in the cache), the root of the next verify tree. Draft inputs
    for the next step: ``draft_p`` / ``draft_ids`` (the draft's top candidates for the token after
    the bonus, widest kept so a reload to another topk can use them) and ``feature`` (EAGLE:
    the draft's feature at the bonus position; multi-layer: the target's hidden state there).
    A request that ended (``done``) holds no tensors (`release`); ``aborted`` / ``error`` say
    how it ended when it did not finish normally.
    """

    rid: int
    prompt: list[int]
    max_new_tokens: int
    slot: int = -1
    seq_len: int = 0
    bonus: int = -1
    output: list[int] = field(default_factory=list)
    draft_p: torch.Tensor | None = None
    draft_ids: torch.Tensor | None = None
    feature: torch.Tensor | None = None
    verify_steps: int = 0
    accepted: int = 0  # tokens committed over all verify steps, bonus included
    done: bool = False
    aborted: bool = False
    error: BaseException | None = None  # why it failed (traceback dropped: it holds frames)

    def release(self) -> None:
        """Drop the draft tensors (a finished request keeps its tokens only)."""
        self.draft_p = self.draft_ids = self.feature = None

    def emit(self, tokens: list[int], eos_id: int | None) -> None:
        """Append generated tokens, stopping at max_new_tokens or after EOS."""
        for t in tokens:
            if len(self.output) >= self.max_new_tokens:
                break
            self.output.append(t)
            if eos_id is not None and t == eos_id:
                self.done = True
                break
        if len(self.output) >= self.max_new_tokens:
            self.done = True
