"""Draft side of the engine: a draftgraph worker plus the draft model's prefill and extend.

`EagleDrafter` drafts through `EagleDraftWorker` (graphs replayed at the padded batch size, eager
above the largest); `MultiLayerDrafter` runs the multi-layer draft's S layers and organizes
through `MultiLayerEagleDraftWorker`. What the next step's draft needs is kept per slot in the
engine's `SlotState` (feature, candidates): each call reads and writes it by slot index. The
engine uses the component through its public API only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch

from draftgraph.runtime import DraftInput, DraftResult, EagleDraftWorker, MultiLayerEagleDraftWorker, RuntimeArgs
from draftgraph.runtime.worker import DraftWorker, GraphStep

from ..models.multi_layer import MultiLayerDraft
from .model_seam import DraftHead, DraftTarget, check_members, check_pair
from .slot_state import SlotState, StepBatch
from .verify import Acceptance

__all__ = ["EagleDrafter", "MultiLayerDrafter", "KEEP_TOPK", "make_drafter"]

KEEP_TOPK = 8  # candidates kept per slot: a reload may raise topk up to this


def _causal_mask(lens: torch.Tensor, t: int, lk: int) -> torch.Tensor:
    """[b, t, lk]: query i of request r (at position lens[r] + i) sees keys <= its position."""
    q = lens[:, None] + torch.arange(t, device=lens.device)[None]
    return torch.arange(lk, device=lens.device)[None, None] <= q[:, :, None]


class EagleDrafter:
    """EAGLE head + `EagleDraftWorker`; the head's cache is allocated before any capture. The head
    is any `DraftHead` (`model_seam`): a published EAGLE-1/2 or EAGLE-3 one (`Eagle1Head`,
    `Eagle3Head`, the embedded default's too) or another model with the same members."""

    max_steps: int | None = None  # no limit of its own on S (the head is called once per step)
    graphs_extend = True  # its extend runs as a captured phase (`extend_step`)

    def __init__(self, args: RuntimeArgs, head: DraftHead, slots: int) -> None:
        self.head: DraftHead = head
        head.allocate_cache(slots)
        self.worker: DraftWorker = EagleDraftWorker(args, head)

    @property
    def feature_dim(self) -> int:
        return self.head.cfg.dim

    @torch.no_grad()
    def reset_carried_state(self, state: SlotState, live_slots: Sequence[int]) -> None:
        """After a weights update: zero the cache rows of every slot no running request holds
        (stale rows a later request's masked attention multiplies by zero: inf * 0 is NaN) and
        clear non-finite values everywhere, the carried draft inputs included. In place: the
        captured graphs read these tensors. The running requests keep their finite draft
        context (outputs are exact whatever the draft holds)."""
        cache = self.head.cache
        if cache is not None:
            live = set(live_slots)
            for t in (*cache.k, *cache.v):
                free = [s for s in range(t.shape[0]) if s not in live]
                if free:
                    t.index_fill_(0, torch.tensor(free, device=t.device), 0.0)
                t.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
        state.clear_non_finite()

    @torch.no_grad()
    def prefill(self, state: SlotState, slot: int, prompt: Sequence[int], bonus: int, hidden: torch.Tensor) -> None:
        """Extend over the prompt: hidden [P, d] is the target's, ``bonus`` the first token."""
        dev = hidden.device
        toks = torch.tensor([list(prompt[1:]) + [bonus]], device=dev)
        t = toks.shape[1]
        pos = torch.arange(t, device=dev)[None]
        slots = torch.tensor([slot], device=dev)
        mask = _causal_mask(torch.zeros(1, dtype=torch.long, device=dev), t, t)
        feats, logits = self.head.extend(hidden[None], toks, pos, slots, slots[:, None].expand(1, t), mask)
        state.set_draft(slots, feats[:, -1], logits[:, -1])

    @torch.no_grad()
    def draft(self, state: SlotState, batch: StepBatch) -> DraftResult:
        """One draft step for the batch (the worker's graph for the padded size, or eager)."""
        k = self.worker.spec.topk
        slots = batch.slots
        rows = self.head.initial_state(state.feature[slots], slots, batch.lens)  # named DraftRows
        return self.worker.draft_forward(DraftInput(state.draft_p[slots, :k], state.draft_ids[slots, :k], rows))

    @torch.no_grad()
    def extend(self, state: SlotState, batch: StepBatch, hidden: torch.Tensor, acc: Acceptance,
               alive: torch.Tensor) -> None:
        """Run the head over each request's newly committed positions, all rows at once (rows past
        a request's accepted length, and the rows of requests that ended, write only the dummy
        slot 0). hidden [b, N, d] from the verify; ``alive`` [b] bool."""
        t = max(acc.lengths)
        feature, logits = self._extend_rows(hidden, acc.path, acc.tokens, acc.length, batch.lens, batch.slots,
                                            alive, t, batch.max_len + t)
        state.set_draft(batch.slots, feature, logits)

    @torch.no_grad()
    def extend_rows(self, state: SlotState, slots: torch.Tensor, hidden: torch.Tensor, tokens: torch.Tensor,
                    length: torch.Tensor, lens: torch.Tensor, lk: int) -> None:
        """The head over held rows (`HeldExtends`): hidden [b, t, d] and tokens [b, t], row j of
        request i at position lens[i] + j, its first length[i] rows real; attends over ``lk``
        positions; the draft inputs come from each request's last real row."""
        b, t = tokens.shape
        path = torch.arange(t, device=hidden.device)[None].expand(b, t)
        alive = torch.ones(b, dtype=torch.bool, device=hidden.device)
        feature, logits = self._extend_rows(hidden, path, tokens, length, lens, slots, alive, t, lk)
        state.set_draft(slots, feature, logits)

    def _extend_rows(self, hidden: torch.Tensor, path: torch.Tensor, tokens: torch.Tensor, length: torch.Tensor,
                     lens: torch.Tensor, slots: torch.Tensor, alive: torch.Tensor, t: int, lk: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """The head over the first ``t`` accepted rows of each request, attending over ``lk`` cache
        positions: (the feature [b, d] and logits [b, V] at each request's last accepted row)."""
        b = hidden.shape[0]
        dev = hidden.device
        idx = path[:, :t]
        feats = hidden.gather(1, idx[:, :, None].expand(b, t, hidden.shape[-1]))
        steps = torch.arange(t, device=dev)[None]
        real = (steps < length[:, None]) & alive[:, None]
        pos = (lens[:, None] + steps).clamp(max=self.head.cfg.max_len - 1)
        wslot = torch.where(real, slots[:, None], 0)
        mask = _causal_mask(lens, t, lk)
        out, logits = self.head.extend(feats, tokens[:, :t], pos, slots, wslot, mask)
        last = (length - 1)[:, None, None]
        return (out.gather(1, last.expand(b, 1, out.shape[-1]))[:, 0],
                logits.gather(1, last.expand(b, 1, logits.shape[-1]))[:, 0])

    def extend_step(self, n: int, width: int, lk: int, rows: int, hidden_dim: int, hidden_dtype: torch.dtype
                    ) -> GraphStep:
        """The extend phase's capturable step (`runtime.engine.phases`): all ``width`` accepted
        rows of each request over an ``lk``-position window; static rows for ``rows`` requests
        (hidden [rows, n, hidden_dim] from the verify). Returns (feature [b, d], p, ids [b, keep])."""
        dev = self.head.device
        long = torch.long
        static = {
            "hidden": torch.zeros(rows, n, hidden_dim, dtype=hidden_dtype, device=dev),
            "path": torch.zeros(rows, width, dtype=long, device=dev),
            "tokens": torch.zeros(rows, width, dtype=long, device=dev),
            "length": torch.ones(rows, dtype=long, device=dev),
            "lens": torch.zeros(rows, dtype=long, device=dev),
            "slots": torch.zeros(rows, dtype=long, device=dev),
            "alive": torch.zeros(rows, dtype=torch.bool, device=dev),
        }

        def extend(hidden: torch.Tensor, path: torch.Tensor, tokens: torch.Tensor, length: torch.Tensor,
                   lens: torch.Tensor, slots: torch.Tensor, alive: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            feature, logits = self._extend_rows(hidden, path, tokens, length, lens, slots, alive, width, lk)
            p, ids = torch.softmax(logits.float(), -1).topk(KEEP_TOPK, dim=-1)
            return feature, p, ids

        # pad rows: length 1 (their last row is row 0), not alive (they write the dummy slot 0)
        pads = {"hidden": 0, "path": 0, "tokens": 0, "length": 1, "lens": 0, "slots": 0, "alive": 0}
        return GraphStep(extend, static, pads)


class MultiLayerDrafter:
    """Multi-layer draft (S layers, one token each) organized by `MultiLayerEagleDraftWorker`.
    It has no head: no draft cache, nothing the phase graphs read, no extend phase."""

    head: None = None
    graphs_extend = False

    def __init__(self, args: RuntimeArgs, draft: MultiLayerDraft, slots: int) -> None:
        self.draft_model = draft
        self.check_args(args)
        self.worker: DraftWorker = MultiLayerEagleDraftWorker(args)
        self.worker.reloads.add_check(self.check_args)  # every reload path, not construction only

    @property
    def feature_dim(self) -> int:
        return self.draft_model.cfg.dim

    @property
    def max_steps(self) -> int:
        """S may not exceed the draft's layer count."""
        return self.draft_model.max_steps

    def check_args(self, args: RuntimeArgs) -> None:
        """S draft layers give S tokens: num_steps may not exceed the layer count."""
        s = args.speculative.num_steps
        if s > self.draft_model.max_steps:
            raise ValueError(f"speculative.num_steps={s}: the multi-layer draft has "
                             f"{self.draft_model.max_steps} layers (num_steps <= {self.draft_model.max_steps})")

    @torch.no_grad()
    def reset_carried_state(self, state: SlotState, live_slots: Sequence[int]) -> None:
        """After a weights update: the draft carries no cache (a pure function of the target's
        hidden state); the carried inputs are cleared of non-finite values."""
        state.clear_non_finite()

    @torch.no_grad()
    def prefill(self, state: SlotState, slot: int, prompt: Sequence[int], bonus: int, hidden: torch.Tensor) -> None:
        state.set_draft(torch.tensor([slot], device=hidden.device), hidden[-1:], None)

    @torch.no_grad()
    def draft(self, state: SlotState, batch: StepBatch) -> DraftResult:
        p, ids = self.draft_model(state.feature[batch.slots], batch.bonus, self.worker.spec.num_steps)
        return self.worker.draft_forward(DraftInput(p, ids))

    @torch.no_grad()
    def extend(self, state: SlotState, batch: StepBatch, hidden: torch.Tensor, acc: Acceptance,
               alive: torch.Tensor) -> None:
        last = acc.path.gather(1, (acc.length - 1)[:, None])[:, :, None]  # [b, 1, 1]
        state.set_draft(batch.slots, hidden.gather(1, last.expand(-1, 1, hidden.shape[-1]))[:, 0], None)


def make_drafter(args: RuntimeArgs, draft: object, n_slots: int, target: DraftTarget
                 ) -> EagleDrafter | MultiLayerDrafter:
    """The drafter for ``draft`` (a `MultiLayerDraft`, or a `DraftHead` reading ``target``'s
    features, which it then owns) over ``n_slots`` slots. TypeError naming the member a head
    lacks, ValueError when it cannot read ``target`` (`model_seam.check_pair`)."""
    if isinstance(draft, MultiLayerDraft):
        return MultiLayerDrafter(args, draft, n_slots)
    check_members(draft, DraftHead, "draft")
    head = cast(DraftHead, draft)  # checked member by member just above
    check_pair(target, head)
    return EagleDrafter(args, head, n_slots)
