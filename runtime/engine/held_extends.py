"""The draft's extend held over plain steps: run once, wider, when the draft is next needed.

A plain target step (S = 0: one token per request, nothing drafted) still had to extend the
EAGLE head over the committed token, so that speculation could resume at any step: about a
sixth of a plain step of SmolLM2 on a CPU, paid on every step while the payoff gate serves plain
steps. `HeldExtends` keeps instead what that extend would read, per slot: the verify's hidden row
[d] and the committed token, from the first held position on. Before the slot's next draft (or
when ``cap`` rows wait) one extend runs over all of them at once, writing the same head cache
positions with the same inputs, so the draft proposes from the same context; its numbers may
differ in the last bits from one-row extends (the attention over more rows at once), and the
draft only proposes: the emitted tokens stay the target's.

A plain step holds whether its verify ran eagerly or from a target-only state's graph, so
that state captures no width-1 extend (`EnginePhases`).

The host keeps the counts and first positions (no device read); the rows live on the device in
[slots, cap, d] / [slots, cap] buffers made at first use in the verify's hidden dtype.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

import torch

from .slot_state import SlotState

__all__ = ["DEFAULT_HOLD", "HeldExtends", "RowExtender", "holds_plain_extends"]

DEFAULT_HOLD = 16  # rows a slot holds at most before they are extended anyway


class RowExtender(Protocol):
    """What `HeldExtends` needs of a drafter: its extend over given rows."""

    def extend_rows(self, state: SlotState, slots: torch.Tensor, hidden: torch.Tensor, tokens: torch.Tensor,
                    length: torch.Tensor, lens: torch.Tensor, lk: int) -> None: ...


def holds_plain_extends(drafter: object) -> bool:
    """True when plain steps hold ``drafter``'s extend (it extends given rows: `RowExtender`), so
    a plain step needs no extend of its own, eager or graph."""
    return callable(getattr(drafter, "extend_rows", None))


class HeldExtends:
    """Held extend rows of ``slots`` slots, at most ``cap`` each (module docstring)."""

    def __init__(self, slots: int, cap: int = DEFAULT_HOLD) -> None:
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise ValueError(f"cap={cap!r}: rows held per slot must be an int >= 1")
        self.cap = cap
        self.count = [0] * slots  # rows held per slot
        self.start = [0] * slots  # the position of each slot's first held row
        self.hidden: torch.Tensor | None = None  # [slots, cap, d]
        self.tokens: torch.Tensor | None = None  # [slots, cap]

    def holding(self, slots: Iterable[int]) -> list[int]:
        """Those of ``slots`` with rows held."""
        return [s for s in slots if self.count[s]]

    def forget(self, slot: int) -> None:
        """Drop ``slot``'s rows (its request ended, or a new one takes the slot)."""
        self.count[slot] = 0

    def hold(self, slots: Sequence[int], starts: Sequence[int], hidden: torch.Tensor, tokens: torch.Tensor,
             keep: Sequence[bool]) -> list[int]:
        """Hold one plain step's rows: ``hidden`` [b, 1, d] and committed ``tokens`` [b] at
        positions ``starts`` [b] (host) for the rows with ``keep``; the other rows' slots are
        forgotten. Returns the slots that now hold ``cap`` rows (to extend now)."""
        if self.hidden is None or self.hidden.shape[-1] != hidden.shape[-1] or self.hidden.dtype != hidden.dtype:
            n = len(self.count)
            self.hidden = hidden.new_zeros(n, self.cap, hidden.shape[-1])
            self.tokens = torch.zeros(n, self.cap, dtype=torch.long, device=hidden.device)
            self.count = [0] * n
        rows = [i for i, k in enumerate(keep) if k]
        for i, s in enumerate(slots):
            if not keep[i]:
                self.forget(s)
        if not rows:
            return []
        dst = [slots[i] for i in rows]
        cols = [self.count[s] for s in dst]
        for s, p in ((slots[i], starts[i]) for i in rows):
            if not self.count[s]:
                self.start[s] = p
            self.count[s] += 1
        dev = hidden.device
        at = (torch.tensor(dst, device=dev), torch.tensor(cols, device=dev))
        pick = torch.tensor(rows, device=dev)
        self.hidden.index_put_(at, hidden[pick, 0])
        self.tokens.index_put_(at, tokens[pick])
        return [s for s in dst if self.count[s] >= self.cap]

    def release(self, drafter: RowExtender, state: SlotState, slots: Sequence[int]) -> int:
        """Extend the held rows of ``slots`` (those holding any) in one call; returns how many
        slots were extended."""
        live = self.holding(slots)
        if not live or self.hidden is None or self.tokens is None:
            return 0
        dev = self.hidden.device
        sel = torch.tensor(live, device=dev)
        width = max(self.count[s] for s in live)
        length = torch.tensor([self.count[s] for s in live], device=dev)
        starts = [self.start[s] for s in live]
        drafter.extend_rows(state, sel, self.hidden[sel, :width], self.tokens[sel, :width], length,
                            torch.tensor(starts, device=dev), max(starts) + width)
        for s in live:
            self.count[s] = 0
        return len(live)
