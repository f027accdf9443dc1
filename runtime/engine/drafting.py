"""Draft side of the engine: a draftgraph worker plus the draft model's extend.

`EagleDrafter` drafts through `EagleDraftWorker` (graphs captured at start, replayed at the
padded batch size, eager above the largest); `MultiLayerDrafter` runs the multi-layer draft's S
layers and organizes through `MultiLayerEagleDraftWorker`. Both keep per request what the next
step's draft needs (see `Request`). The engine uses the component through its public API only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from draftgraph.runtime import (
    DraftInput,
    DraftResult,
    EagleDraftWorker,
    MultiLayerEagleDraftWorker,
    RuntimeArgs,
)

from ..models.eagle_head import EagleDraftHead
from ..models.multi_layer import MultiLayerDraft
from .requests import Request
from .verify import Acceptance

__all__ = ["EagleDrafter", "MultiLayerDrafter", "KEEP_TOPK"]

KEEP_TOPK = 8  # candidates kept per request: a reload may raise topk up to this


def _causal_mask(lens: torch.Tensor, t: int, lk: int) -> torch.Tensor:
    """[b, t, lk]: query i of request r (at position lens[r] + i) sees keys <= its position."""
    q = lens[:, None] + torch.arange(t, device=lens.device)[None]
    return torch.arange(lk, device=lens.device)[None, None] <= q[:, :, None]


class EagleDrafter:
    """EAGLE head + `EagleDraftWorker`; the head's cache is allocated before any capture."""

    def __init__(self, args: RuntimeArgs, head: EagleDraftHead, slots: int) -> None:
        self.head = head
        head.allocate_cache(slots)
        self.worker = EagleDraftWorker(args, head)

    def set_first(self, reqs: Sequence[Request], feats: torch.Tensor, logits: torch.Tensor) -> None:
        """Store each request's next draft inputs: feature [b, d] and top candidates of logits [b, V]."""
        p, ids = torch.softmax(logits.float(), -1).topk(KEEP_TOPK, dim=-1)
        for i, r in enumerate(reqs):
            r.feature, r.draft_p, r.draft_ids = feats[i], p[i], ids[i]

    @torch.no_grad()
    def reset_carried_state(self, running: Sequence[Request]) -> None:
        """After a weights update: zero the cache rows of every slot no running request holds
        (stale rows a later request's masked attention multiplies by zero: inf * 0 is NaN) and
        clear non-finite values everywhere, the running requests' draft inputs included. In
        place: the captured graphs read these tensors. The running requests keep their finite
        draft context (outputs are exact whatever the draft holds)."""
        cache = self.head.cache
        if cache is not None:
            live = {r.slot for r in running if r.slot >= 0}
            for t in (*cache.k, *cache.v):
                free = [s for s in range(t.shape[0]) if s not in live]
                if free:
                    t.index_fill_(0, torch.tensor(free, device=t.device), 0.0)
                t.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
        _clear_non_finite(running)

    @torch.no_grad()
    def prefill(self, req: Request, hidden: torch.Tensor) -> None:
        """Extend over the prompt: hidden [P, d] is the target's, req.bonus the first token."""
        dev = hidden.device
        toks = torch.tensor([req.prompt[1:] + [req.bonus]], device=dev)
        t = toks.shape[1]
        pos = torch.arange(t, device=dev)[None]
        slots = torch.tensor([req.slot], device=dev)
        mask = _causal_mask(torch.zeros(1, dtype=torch.long, device=dev), t, t)
        feats, logits = self.head.extend(hidden[None], toks, pos, slots, slots[:, None].expand(1, t), mask)
        self.set_first([req], feats[:, -1], logits[:, -1])

    @torch.no_grad()
    def draft(self, reqs: Sequence[Request]) -> DraftResult:
        """One draft step for the batch (the worker's graph for the padded size, or eager)."""
        k = self.worker.spec.topk
        dev = reqs[0].feature.device
        feats = torch.stack([r.feature for r in reqs])
        slots = torch.tensor([r.slot for r in reqs], device=dev)
        lens = torch.tensor([r.seq_len for r in reqs], device=dev)
        state = self.head.initial_state(feats, slots, lens)
        p = torch.stack([r.draft_p[:k] for r in reqs])
        ids = torch.stack([r.draft_ids[:k] for r in reqs])
        return self.worker.draft_forward(DraftInput(p, ids, state))

    @torch.no_grad()
    def extend(self, reqs: Sequence[Request], hidden: torch.Tensor, acc: Acceptance,
               old_lens: Sequence[int], rows: Sequence[int]) -> None:
        """Run the head over each request's newly committed positions (padded batch; pads write
        only the dummy slot 0). hidden [b, N, d] from the verify; ``rows`` index reqs in acc."""
        dev = hidden.device
        t = max(len(acc.paths[i]) for i in rows)
        b = len(rows)
        feats = hidden.new_zeros(b, t, hidden.shape[-1])
        toks = torch.zeros(b, t, dtype=torch.long, device=dev)
        real = torch.zeros(b, t, dtype=torch.bool, device=dev)
        for j, i in enumerate(rows):
            path = acc.paths[i]
            feats[j, :len(path)] = hidden[i, path]
            toks[j, :len(path)] = torch.tensor(acc.tokens[i], device=dev)
            real[j, :len(path)] = True
        lens = torch.tensor([old_lens[i] for i in rows], device=dev)
        pos = (lens[:, None] + torch.arange(t, device=dev)[None]).clamp(max=self.head.cfg.max_len - 1)
        slots = torch.tensor([reqs[i].slot for i in rows], device=dev)
        wslot = torch.where(real, slots[:, None], torch.zeros_like(pos))
        mask = _causal_mask(lens, t, int(lens.max()) + t)
        out, logits = self.head.extend(feats, toks, pos, slots, wslot, mask)
        last = torch.tensor([len(acc.paths[i]) - 1 for i in rows], device=dev)
        ar = torch.arange(b, device=dev)
        self.set_first([reqs[i] for i in rows], out[ar, last], logits[ar, last])


class MultiLayerDrafter:
    """Multi-layer draft (S layers, one token each) organized by `MultiLayerEagleDraftWorker`."""

    def __init__(self, args: RuntimeArgs, draft: MultiLayerDraft, slots: int) -> None:
        self.draft_model = draft
        self.check_args(args)
        self.worker = MultiLayerEagleDraftWorker(args)
        self.worker.add_args_check(self.check_args)  # every reload path, not construction only

    def check_args(self, args: RuntimeArgs) -> None:
        """S draft layers give S tokens: num_steps may not exceed the layer count."""
        s = args.speculative.num_steps
        if s > self.draft_model.max_steps:
            raise ValueError(f"speculative.num_steps={s}: the multi-layer draft has "
                             f"{self.draft_model.max_steps} layers (num_steps <= {self.draft_model.max_steps})")

    @torch.no_grad()
    def reset_carried_state(self, running: Sequence[Request]) -> None:
        """After a weights update: the draft carries no cache (a pure function of the target's
        hidden state); the running requests' inputs are cleared of non-finite values."""
        _clear_non_finite(running)

    @torch.no_grad()
    def prefill(self, req: Request, hidden: torch.Tensor) -> None:
        req.feature = hidden[-1]

    @torch.no_grad()
    def draft(self, reqs: Sequence[Request]) -> DraftResult:
        s = self.worker.spec.num_steps
        feats = torch.stack([r.feature for r in reqs])
        bonus = torch.tensor([r.bonus for r in reqs], device=feats.device)
        p, ids = self.draft_model(feats, bonus, s)
        return self.worker.draft_forward(DraftInput(p, ids))

    @torch.no_grad()
    def extend(self, reqs: Sequence[Request], hidden: torch.Tensor, acc: Acceptance,
               old_lens: Sequence[int], rows: Sequence[int]) -> None:
        for i in rows:
            reqs[i].feature = hidden[i, acc.paths[i][-1]]


def _clear_non_finite(running: Sequence[Request]) -> None:
    """Replace NaN / inf in the running requests' draft inputs by zeros (in place)."""
    for r in running:
        for t in (r.feature, r.draft_p):
            if t is not None and t.is_floating_point():
                t.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
