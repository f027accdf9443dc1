"""The engine's step as one pipeline: admit, then draft, tree, verify, accept, commit, extend.

Each stage is a function of named tensors: the step's `StepBatch` (slots, lengths, bonus tokens
gathered once from the per-slot `SlotState`), the draft result, the verify tree, the target's
logits and hidden states, and the `Acceptance`. The host reads the device once per step, when
acceptance hands over the committed tokens (the requests' outputs, EOS and lengths); everything
else stays on the device, read and written by slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from draftgraph.graphs.spans import span, spans_active
from draftgraph.runtime import DraftResult, VerifyTree, build_tree
from draftgraph.runtime.worker import DraftWorker

from ..models.greedy import prefill
from ..models.kv_cache import KVCache
from .accept_policy import AcceptPolicy, accept_policy
from .drafting import EagleDrafter, MultiLayerDrafter
from .held_extends import HeldExtends, holds_plain_extends
from .model_seam import DraftTarget
from .phases import EnginePhases
from .request_table import RequestTable
from .requests import Request
from .slot_state import SlotState, StepBatch
from .stats import EngineStats
from .verify import Acceptance, commit_kv, root_only_tree, verify_mask

__all__ = ["StepPipeline"]


class StepPipeline:
    """The model work of one engine: ``target`` with its K/V ``cache``, the ``drafter`` and the
    per-slot device state ``slots``; figures go to ``stats``."""

    def __init__(self, target: DraftTarget, cache: KVCache, drafter: EagleDrafter | MultiLayerDrafter, slots: SlotState,
                 eos_id: int | None, stats: EngineStats, phases: EnginePhases | None = None) -> None:
        self.target = target
        self.phases = phases  # verify / extend graphs of the worker's states (None: always eager)
        self.cache = cache
        self.drafter = drafter
        self.slots = slots
        self.eos_id = eos_id
        self.stats = stats
        # plain steps hold the head's extend until its next draft (`held_extends`)
        self.held = HeldExtends(slots.seq_len.shape[0]) if holds_plain_extends(drafter) else None

    @torch.no_grad()
    def admit(self, table: RequestTable) -> None:
        """Prefill waiting requests into free slots. Requests of one prompt admitted together
        (the server's ``n`` choices) share its target prefill: the first runs it, the others
        copy its K/V (``prefills_shared``); each still draws its own first token. A failure of
        one request's prefill (target or drafter) returns its slot and fails that request
        alone; an interrupt (a BaseException that is not an Exception) puts the request back at
        the head of the queue, its slot freed, and propagates."""
        state = self.slots
        done: dict[tuple[int, ...], tuple[int, torch.Tensor, torch.Tensor]] = {}  # prompt -> slot, logits, hidden
        for req in table.admissions():
            try:
                key = tuple(req.prompt)
                if key in done:
                    src, logits, hidden = done[key]
                    self.cache.copy_prefix(src, req.slot, len(key))
                    self.stats.add("prefills_shared")
                else:
                    logits, hidden = prefill(self.target, self.cache, req.slot, req.prompt)
                state.set_sampling(req.slot, req.sampling)
                bonus = self.first_token(logits, req)
                req.seq_len = len(req.prompt)
                state.seq_len[req.slot] = req.seq_len
                state.bonus[req.slot] = bonus
                req.emit([bonus], self.eos_id)
                if self.held is not None:
                    self.held.forget(req.slot)
                if not req.done:
                    self.drafter.prefill(state, req.slot, req.prompt, bonus, hidden)
                    done.setdefault(key, (req.slot, logits, hidden))  # a running request keeps its slot
            except BaseException as exc:
                if not isinstance(exc, Exception):
                    table.requeue(req)
                    raise
                table.fail(req, exc)
                continue
            table.admitted(req)

    def first_token(self, logits: torch.Tensor, req: Request) -> int:
        """The token after ``req``'s prompt from the prefill's logits [T, V] (its accept policy's
        choice for position T)."""
        policy = accept_policy(not req.sampling.greedy)
        slot = torch.tensor([req.slot], device=logits.device)
        pos = torch.tensor([[len(req.prompt) - 1]], device=logits.device)
        return int(policy.choose(logits[-1:][None], pos, self.slots.sampling_rows(slot))[0, 0])

    @torch.no_grad()
    def step(self, reqs: Sequence[Request], worker: DraftWorker, num_steps: int) -> Acceptance:
        """One step for the running ``reqs`` with the worker's active state (``num_steps`` 0: a
        plain target decode, one token per request). Commits the accepted tokens into the
        requests and the device state, extends the draft, counts the step; returns the
        acceptance."""
        st = self.stats
        batch = StepBatch.gather(self.slots, [r.slot for r in reqs], [r.seq_len for r in reqs],
                                 any(not r.sampling.greedy for r in reqs))
        policy = accept_policy(batch.sampled)
        spec = worker.spec
        n = spec.num_draft_tokens if num_steps else 1
        draft = None
        if num_steps:
            self.release_held(batch)  # before the draft reads the head's context
            with st.timed("draft"):
                draft = self.drafter.draft(self.slots, batch)
        if spans_active():
            _served_range(batch.size, spec, num_steps, draft)
        with st.timed("build_tree"):
            tree = self.tree(batch, draft, spec, n)
        # the phases of the state serving this step: the one that drafted, or for a plain target
        # step (S = 0, width 1) a target-only state; never a state of the other width (eager then)
        state = worker.state if self.phases is not None else None
        if state is not None and state.target_only == bool(num_steps):
            state = None
        with st.timed("verify"):
            chosen, hidden = self.verify(batch, tree, n, policy, state)
        with st.timed("accept_commit"):
            acc = policy.accept(tree, chosen, spec.num_steps if num_steps else 0, chain=spec.is_chain)
            emitted = self.commit(batch, acc, reqs)
        st.count_verify(batch.size, n, bool(num_steps), acc.lengths, emitted)
        if self.held is not None and not num_steps:  # a plain step's extend: held instead
            with st.timed("extend"):
                full = self.held.hold(batch.slot_list, batch.len_list, hidden, acc.tokens[:, 0],
                                      [not r.done for r in reqs])
                if full:
                    self.held.release(self.drafter, self.slots, full)
            return acc
        self.release_held(batch)  # a graph extend reads the head's cache: the held rows first
        with st.timed("extend"):
            if not all(r.done for r in reqs):
                alive = torch.tensor([not r.done for r in reqs], device=hidden.device)
                self.extend(batch, hidden, acc, alive, state)
        return acc

    def release_held(self, batch: StepBatch) -> None:
        """Extend the rows plain steps held for the batch's slots (`held_extends`), if any."""
        if self.held is not None and self.held.holding(batch.slot_list):
            with self.stats.timed("extend"):
                self.held.release(self.drafter, self.slots, batch.slot_list)

    @staticmethod
    def tree(batch: StepBatch, draft: DraftResult | None, spec: Any, n: int) -> VerifyTree:
        """The verify tree: the draft's (no validation: the engine's own drafter made it, and a
        validation reads the device), or the bonus token alone when nothing was drafted."""
        if draft is None:
            return root_only_tree(batch.bonus, batch.lens)
        parent_list, top_idx, draft_tokens = draft
        return build_tree(batch.bonus, parent_list, top_idx, draft_tokens, batch.lens, spec.layout_topk,
                          spec.num_steps, n, validate=False, layout=draft.layout)

    def verify(self, batch: StepBatch, tree: VerifyTree, n: int, policy: AcceptPolicy, state: Any = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """One target forward over every request's N tree tokens (K/V written at seq_len + node):
        (each node's token by ``policy`` [b, N], hidden [b, N, d]); from ``state``'s verify graph
        when it has one for the batch (see `EnginePhases`; the graph chooses with the sampled
        policy, which gives greedy rows the argmax), else eager."""
        def eager() -> tuple[torch.Tensor, torch.Tensor]:
            logits, hidden = self.verify_eager(batch, tree, n)
            return policy.choose(logits, tree.positions.view(batch.size, n), batch.sampling), hidden

        if state is not None:
            return self.phases.verify(state, batch, tree, n, eager, policy)
        return eager()

    def verify_eager(self, batch: StepBatch, tree: VerifyTree, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The target's eager forward over the tree: (logits [b, N, V], hidden [b, N, d])."""
        dev = batch.lens.device
        write = batch.lens[:, None] + torch.arange(n, device=dev)[None]
        mask = verify_mask(tree, batch.lens, batch.max_len + n)
        b = batch.size
        return self.target(tree.tokens.view(b, n), tree.positions.view(b, n), write, batch.slots, mask, self.cache)

    def extend(self, batch: StepBatch, hidden: torch.Tensor, acc: Acceptance, alive: torch.Tensor,
               state: Any = None) -> None:
        """The draft's extend over the accepted rows: ``state``'s extend graph when it has one
        for the batch (its outputs written into the slot state here), else the drafter's eager
        extend."""
        def eager() -> None:
            self.drafter.extend(self.slots, batch, hidden, acc, alive)

        if state is None:
            eager()
            return
        out = self.phases.extend(state, batch, hidden, acc, alive, eager)
        if out is not None:
            self.slots.set_draft_top(batch.slots, *out)

    def commit(self, batch: StepBatch, acc: Acceptance, reqs: Sequence[Request]) -> int:
        """Move accepted K/V to consecutive positions, advance each slot's length and bonus token
        (device) and each request's tokens (host); returns the tokens emitted."""
        commit_kv(self.cache, batch.slots, batch.lens, acc)
        state = self.slots
        state.seq_len.index_copy_(0, batch.slots, batch.lens + acc.length)
        state.bonus.index_copy_(0, batch.slots, acc.tokens.gather(1, (acc.length - 1)[:, None])[:, 0])
        emitted = 0
        for r, toks in zip(reqs, acc.committed):
            r.seq_len += len(toks)
            r.verify_steps += 1
            r.accepted += len(toks)
            emitted += r.emit(toks, self.eos_id)
        return emitted


def _served_range(b: int, spec: Any, num_steps: int, draft: DraftResult | None) -> None:
    """A zero-length ``served`` range inside the ``step`` range, opened once the step's dispatch
    is known: ``served[bs=4,S=3,topk=1,N=4,mode=graph,padded=4]``, ``...,mode=eager,reason=not_ready``
    or ``served[bs=9,S=0,mode=target_only]`` (what ran, never a forecast)."""
    if draft is None:
        attrs: dict[str, Any] = {"bs": b, "S": 0, "mode": "target_only"}
    else:
        attrs = {"bs": b, "S": num_steps, "topk": spec.topk, "N": spec.num_draft_tokens}
        if draft.replayed_at is not None:
            attrs.update(mode="graph", padded=draft.replayed_at)
        else:
            attrs.update(mode="eager", reason=draft.eager_reason or "no_graphs")
    with span("served", **attrs):
        pass
