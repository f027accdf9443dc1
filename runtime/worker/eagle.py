"""EAGLE draft worker: serves its draft model's step (`runtime.worker.eagle_step`) from the active state.

The step itself (S-1 draft-model forwards with per-step top-k, then organize) is one capturable
function, held by `EagleDrafting`. What must stay outside the graph runs here, on the host per
call: input validation, state selection, counters and spans.

The per-row draft state (``hidden_states``) is one tensor [b, hidden_size] (SGLang's form), or,
for a model with ``row_template(rows, device)``, that NamedTuple of named tensors (slot and
position as int64, not float columns): see `runtime.topology.draft_rows`. The graph step then has one
static input per leaf (``hidden_states_<field>``, pad 0).

Input rules (`EagleDrafting.check_input`, the same for a graph replay, the eager backend and the eager
fallback above the largest captured size, so an input gets the same answer or the same error
on every path): topk_p float32 and topk_index int64, both [b, topk]; hidden_states [b,
hidden_size] of the model's dtype, or each named leaf [b, *trailing] of the template's dtype
(errors name ``draft_input.hidden_states.<field>``); all on the worker's device; any strides; a step never
records autograd history, whatever the grad mode (inputs that require grad and inference-mode
tensors give the same answer). They are checked once, at `draft_forward`'s entry: the graph
manager replays the checked tensors as they are (`replay_trusted`), and the layers below
trust them.

Decisions travel as values: the manager's `lookup` answers a plan or a `Miss` naming its
reason (counted per reason in the state's counts), and every result carries its layout
(`DraftResult.layout`: the topology's constants for a static topology, None for a dynamic tree).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from draftgraph.graphs import Miss, span
from draftgraph.graphs.compile.pool import CompilePool
from draftgraph.runtime.config import RuntimeArgs
from draftgraph.runtime.draft_io import DraftResult, unpack_draft_input
from draftgraph.runtime.topology.draft_rows import leaves
from draftgraph.runtime.validation import ConfigTypeError
from draftgraph.runtime.worker.base import EagleDraftWorkerBase
from draftgraph.runtime.worker.draft_checks import check_draft_values
from draftgraph.runtime.worker.eagle_step import EagleDrafting
from draftgraph.runtime.worker.host_phases import GraphStep
from draftgraph.runtime.worker.state import RuntimeState
from draftgraph.runtime.worker.stored_steps import stored_code
from draftgraph.runtime.worker.weights import StorageGuard, WeightRefit

__all__ = ["EagleDraftWorker"]

NO_GRAPHS = Miss("no_graphs")  # the state has no replayable manager (see state.EAGER_REASONS)


class EagleKind:
    """The EAGLE worker's `WorkerKind`: its draft model's device, rows, step and stored code."""

    captures_graphs = True

    def __init__(self, draft_model: Any, drafting: EagleDrafting, worker_name: str) -> None:
        self.draft_model = draft_model
        self.drafting = drafting
        self.worker_name = worker_name  # part of the stored code's key

    def check_args(self, args: RuntimeArgs) -> None:
        """The draft model's parameters must live on the args' device."""
        dev = _model_device(self.draft_model)
        if dev is not None and dev != torch.device(args.device):
            raise ValueError(
                f"device={args.device!r}: the draft model's parameters are on {dev}; "
                f"move the model or use device={str(dev)!r}"
            )

    def row_input_bytes(self) -> int:
        """hidden_states: one row of every leaf ([H] in the model's dtype for one tensor), the
        memory check's estimate."""
        return self.drafting.row_layout.row_bytes()

    def graph_step(self, state: RuntimeState, max_size: int, args: RuntimeArgs) -> GraphStep:
        """The graph step of ``state`` (`EagleDrafting.graph_step`), guarding the storage of the
        draft tensors its graphs will read."""
        state.storage_guard = StorageGuard(self.draft_model)
        return self.drafting.graph_step(state, max_size, args.device)

    def stored_code(self, state: RuntimeState, compiler: CompilePool | None, args: RuntimeArgs) -> Any:
        """The compiled-code store of ``state``'s step (`runtime.worker.stored_steps`); ``compiler``:
        the compile processes of a background capture (None: compiled here)."""
        return stored_code(self.worker_name, args, self.drafting.row_layout, state, self.draft_model, compiler)


class EagleDraftWorker(EagleDraftWorkerBase):
    """Drafts with ``draft_model(input_ids [M], rows) -> (logits [M, V], rows)`` (see
    `EagleDrafting`, its ``drafting``: the row layout, the input rules and the step)."""

    def __init__(self, args: RuntimeArgs, draft_model: Any) -> None:
        if not callable(draft_model):
            raise ConfigTypeError(f"draft_model={type(draft_model).__name__}: must be callable")
        self.draft_model = draft_model
        self.drafting = EagleDrafting(draft_model)
        # in-place weight updates (None for a draft model that is not an nn.Module)
        self.weights = WeightRefit(draft_model) if isinstance(draft_model, torch.nn.Module) else None
        super().__init__(args, EagleKind(draft_model, self.drafting, type(self).__qualname__))

    # ---- draft weights ---------------------------------------------------------------------
    def update_draft_weights(self, state_dict: Any, *, strict: bool = True) -> int:
        """Check ``state_dict`` against the draft model now (keys, shapes, dtypes, devices, finite
        values: ValueError / TypeError naming the key, nothing changed) and copy it in place at
        the start of the next step (the host's step boundary when an engine drives this
        worker), so parameter addresses never move and every captured graph stays valid.
        Safe from another thread or a signal handler. Returns the weights version it brings."""
        if self.weights is None:
            raise ConfigTypeError(f"draft_model={type(self.draft_model).__name__}: not a torch.nn.Module, "
                                  f"its weights cannot be updated in place")
        return self.weights.request(state_dict, strict)

    def _apply_pending_weights(self) -> bool:
        """Copy a requested weight update in place now (a worker without a host, at the start of
        its step); False when none was pending."""
        if self.weights is None or not self.weights.pending:
            return False
        with self.slot.lock:
            return self.weights.apply_pending()

    # ---- serving ---------------------------------------------------------------------------
    # ---- serving ---------------------------------------------------------------------------
    def draft_forward(self, draft_input: Any) -> DraftResult:
        """(parent_list [b, 1+(S-1)k], top_scores_index [b, N-1], draft_tokens [b, N-1]).

        A static topology returns the static layout: parent_list [b, N-1] (width 0 for a
        depth-1 tree), row views of the topology buffers up to their capacity, with its
        ``layout`` (the buffers' `VerifyConstants`; None for a dynamic tree). The state's
        graph manager decides once (`lookup`) whether b replays and at which padded size; the
        outputs of a replay are views of graph memory, valid until the next step. Otherwise
        the step runs eagerly, under the same input rules (see the module docstring).
        """
        if torch.is_grad_enabled():  # a draft step never records autograd history
            with torch.no_grad():
                return self._draft_forward(draft_input)
        return self._draft_forward(draft_input)

    def _draft_forward(self, draft_input: Any) -> DraftResult:
        """`draft_forward` with grad off."""
        slot, drafting = self.slot, self.drafting
        if slot.pending is not None:
            self.reloads.apply_pending()
        weights = self.weights
        if weights is not None and weights.pending and slot.host is None:
            self._apply_pending_weights()
        topk_p, topk_index, hidden = unpack_draft_input(draft_input)
        b = topk_index.shape[0]
        with slot.lock:
            state = slot.active
            drafting.check_input(state, topk_p, topk_index, hidden, slot.args.device)  # against the state that will run
            if drafting.debug_checks:
                check_draft_values(topk_p, topk_index, hidden, drafting.vocab_size)
            drafting.last_state = state
            self.capture.queue.note_batch(b)
            graphs = state.replayable_graphs()
            found = graphs.lookup(b) if graphs is not None else NO_GRAPHS
            if type(found) is not Miss:
                if state.storage_guard is not None:
                    state.storage_guard.check()  # a replaced draft tensor: refused, never read stale
                # checked above (`check_input`): the manager loads them as they are
                out = graphs.replay_trusted(found, (topk_p, topk_index, *leaves(hidden)))
                buf = state.static_buffers()
                return DraftResult(*out, buf.layout if buf is not None else None, replayed_at=found.load.padded)
            reason = found.reason
            reasons = state.counts.eager_reasons
            reasons[reason] = reasons.get(reason, 0) + 1
            # the graph path reads contiguous copies: the eager path reads the same layout
            topk_p, topk_index = topk_p.contiguous(), topk_index.contiguous()
            hidden = drafting.row_layout.assemble([t.contiguous() for t in leaves(hidden)])
            if graphs is None:
                return replace(drafting.step(state, topk_p, topk_index, hidden), eager_reason=reason)
            with span("eager_fallback", bs=b, reason=reason):
                return replace(drafting.step(state, topk_p, topk_index, hidden), eager_reason=reason)


def _model_device(model: Any) -> torch.device | None:
    """Device of the model's first parameter (None without parameters)."""
    params = getattr(model, "parameters", None)
    if callable(params):
        for p in params():
            return p.device
    return None


