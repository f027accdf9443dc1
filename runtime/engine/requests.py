"""Request bookkeeping of the engine: what the host knows of each request (its tokens, its slot,
how far it got) and how a request ends (finished, aborted or failed).

Everything a step computes with lives on the device, by slot (`slot_state.SlotState`); a
`Request` holds Python values only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from draftgraph.runtime.sampling import GREEDY, SamplingParams

__all__ = ["Request", "RequestFailed"]


class RequestFailed(RuntimeError):
    """A request failed (its admission raised): raised by `SpecDecodeEngine.result` and
    `pop_result` for it, with the original exception chained as ``__cause__``."""

    def __init__(self, rid: int, message: str) -> None:
        super().__init__(message)
        self.rid = rid


@dataclass
class Request:
    """One generation request (host bookkeeping only).

    ``slot`` is its row in the engine's per-slot device state and K/V caches (-1 while waiting
    or once ended); ``seq_len`` counts tokens whose target K/V is committed (the device holds
    the same count in its slot: the host copy sizes the attention window without reading the
    device); ``aborted`` / ``error`` say how it ended when it did not finish normally.
    """

    rid: int
    prompt: list[int]
    max_new_tokens: int
    sampling: SamplingParams = GREEDY
    slot: int = -1
    seq_len: int = 0
    output: list[int] = field(default_factory=list)
    verify_steps: int = 0
    accepted: int = 0  # tokens committed over all verify steps, bonus included
    done: bool = False
    aborted: bool = False
    error: BaseException | None = None  # why it failed (traceback dropped: it holds frames)

    def emit(self, tokens: list[int], eos_id: int | None) -> int:
        """Append generated tokens, stopping at max_new_tokens or after EOS; returns how many
        were appended."""
        before = len(self.output)
        for t in tokens:
            if len(self.output) >= self.max_new_tokens:
                break
            self.output.append(t)
            if eos_id is not None and t == eos_id:
                self.done = True
                break
        if len(self.output) >= self.max_new_tokens:
            self.done = True
        return len(self.output) - before
