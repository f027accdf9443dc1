"""The engine's batch on the device, by slot: what a running request carries between steps.

Allocated once for every slot (slot 0 is the dummy slot pad rows use), read and written by slot
index (vLLM's persistent batch, gpt-fast's static cache): a step gathers its rows with one index
tensor and scatters its results back; nothing is stacked from or unstacked into Python objects.

Per slot:
- ``seq_len`` [slots] long: tokens whose target K/V is committed;
- ``bonus`` [slots] long: the next token (at position seq_len, not yet in the cache), the root
  of the next verify tree;
- ``feature`` [slots, dim]: the draft's carried feature (EAGLE: the draft's feature at the bonus
  position; multi-layer: the target's hidden state there);
- ``draft_p`` / ``draft_ids`` [slots, keep]: the draft's top candidates for the token after the
  bonus, the widest ``keep`` so that a reload to another topk can use them;
- ``temperature`` / ``top_p`` / ``min_p`` [slots] float64, ``top_k`` / ``seed`` [slots] long: the
  request's sampling parameters (`SamplingParams`), written at admission (temperature 0: greedy).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch

from draftgraph.runtime.sampling import SamplingParams, SamplingRows

__all__ = ["SlotState", "StepBatch"]


class SlotState:
    """Per-slot device tensors (see the module docstring); never rebound, so graphs that read
    them stay valid."""

    def __init__(self, slots: int, dim: int, keep: int, device: torch.device | str) -> None:
        self.seq_len = torch.zeros(slots, dtype=torch.long, device=device)
        self.bonus = torch.zeros(slots, dtype=torch.long, device=device)
        self.feature = torch.zeros(slots, dim, dtype=torch.float32, device=device)
        self.draft_p = torch.zeros(slots, keep, dtype=torch.float32, device=device)
        self.draft_ids = torch.zeros(slots, keep, dtype=torch.long, device=device)
        f64 = torch.float64
        self.sampling = SamplingRows(torch.zeros(slots, dtype=f64, device=device),
                                     torch.ones(slots, dtype=f64, device=device),
                                     torch.zeros(slots, dtype=torch.long, device=device),
                                     torch.zeros(slots, dtype=f64, device=device),
                                     torch.zeros(slots, dtype=torch.long, device=device))

    @property
    def device(self) -> torch.device:
        return self.seq_len.device

    def set_sampling(self, slot: int, params: SamplingParams) -> None:
        """Write a request's sampling parameters into ``slot`` (at admission; a greedy request
        without a seed gets seed 0, never read)."""
        rows = self.sampling
        rows.temperature[slot] = params.temperature
        rows.top_p[slot] = params.top_p
        rows.top_k[slot] = params.top_k
        rows.min_p[slot] = params.min_p
        rows.seed[slot] = params.seed or 0

    def sampling_rows(self, slots: torch.Tensor) -> SamplingRows:
        """The sampling parameters of ``slots`` [b], each [b]."""
        r = self.sampling
        return SamplingRows(r.temperature[slots], r.top_p[slots], r.top_k[slots], r.min_p[slots], r.seed[slots])

    def set_draft(self, slots: torch.Tensor, feature: torch.Tensor, logits: torch.Tensor | None) -> None:
        """The draft inputs of the next step for ``slots`` [b]: feature [b, dim] and, when given,
        the top candidates of logits [b, V]."""
        self.feature.index_copy_(0, slots, feature.float())
        if logits is not None:
            p, ids = torch.softmax(logits.float(), -1).topk(self.draft_p.shape[1], dim=-1)
            self.draft_p.index_copy_(0, slots, p)
            self.draft_ids.index_copy_(0, slots, ids)

    def set_draft_top(self, slots: torch.Tensor, feature: torch.Tensor, p: torch.Tensor, ids: torch.Tensor) -> None:
        """As `set_draft`, with the candidates already chosen: p / ids [b, keep] (an extend graph's)."""
        self.feature.index_copy_(0, slots, feature.float())
        self.draft_p.index_copy_(0, slots, p)
        self.draft_ids.index_copy_(0, slots, ids)

    @torch.no_grad()
    def clear_non_finite(self) -> None:
        """Replace NaN / inf in the carried draft inputs by zeros (in place)."""
        for t in (self.feature, self.draft_p):
            t.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)


@dataclass(frozen=True)
class StepBatch:
    """One step's batch, built once per step: ``slots`` [b] long (the running requests' slots,
    in batch order), ``lens`` [b] and ``bonus`` [b] gathered from the `SlotState`, and the host's
    copies ``slot_list`` / ``len_list`` (sizes and windows without reading the device);
    ``sampling`` the rows' `SamplingRows` (gathered from ``state`` when first read) and ``sampled``
    (host) whether any row samples (False: every row greedy, the argmax path)."""

    slots: torch.Tensor
    lens: torch.Tensor
    bonus: torch.Tensor
    slot_list: tuple[int, ...]
    len_list: tuple[int, ...]
    state: SlotState = field(repr=False, compare=False)
    sampled: bool = False

    @classmethod
    def gather(cls, state: SlotState, slot_list: list[int], len_list: list[int], sampled: bool = False
               ) -> StepBatch:
        slots = torch.tensor(slot_list, dtype=torch.long, device=state.device)
        return cls(slots, state.seq_len[slots], state.bonus[slots], tuple(slot_list), tuple(len_list), state, sampled)

    @cached_property
    def sampling(self) -> SamplingRows:
        """The rows' sampling parameters, gathered at first use (an all-greedy eager step never
        reads them; a verify graph always does)."""
        return self.state.sampling_rows(self.slots)

    @property
    def size(self) -> int:
        return len(self.slot_list)

    @property
    def max_len(self) -> int:
        return max(self.len_list)
