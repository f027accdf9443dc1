"""Multi-layer EAGLE draft worker: S draft layers give one token each (a chain, topk == 1).

Its organize is host-side only: for a chain the parent list and score indices are the
constant chain buffers and the tokens are the input unchanged, so the fast path launches no
kernel. The general path (`organize_chain_steps`) is kept for batches above the buffers'
capacity and for a state whose buffers do not match its (S, N).
"""

from __future__ import annotations

from typing import Any

import torch

from draftgraph.graphs import span
from draftgraph.runtime.config import RuntimeArgs
from draftgraph.runtime.draft_io import DraftResult, checked_topk
from draftgraph.runtime.topology.chain import chain_fast_views
from draftgraph.runtime.topology.organize import organize_chain_steps
from draftgraph.runtime.worker.base import EagleDraftWorkerBase
from draftgraph.runtime.worker.host_phases import GraphStep
from draftgraph.runtime.worker.state import RuntimeState, StepCounts

__all__ = ["MultiLayerEagleDraftWorker"]


class ChainKind:
    """The multi-layer worker's `WorkerKind`: a chain, nothing to capture."""

    captures_graphs = False  # the fast path launches no kernel

    def check_args(self, args: RuntimeArgs) -> None:
        """A multi-layer draft yields one token per step: topk must be 1."""
        if args.speculative.topk != 1:
            raise ValueError(
                f"speculative.topk={args.speculative.topk}: MultiLayerEagleDraftWorker drafts a "
                f"chain (one token per layer), topk must be 1"
            )

    def row_input_bytes(self) -> int:
        """No static inputs besides topk_p / topk_index."""
        return 0

    def graph_step(self, state: RuntimeState, max_size: int, args: RuntimeArgs) -> GraphStep:
        """Never called (``captures_graphs`` is False)."""
        raise NotImplementedError("a multi-layer chain captures no draft step")

    def stored_code(self, state: RuntimeState, compiler: Any, args: RuntimeArgs) -> None:
        """Nothing compiled, nothing stored."""
        return None


class MultiLayerEagleDraftWorker(EagleDraftWorkerBase):
    """Organizes multi-layer chain drafts: draft_input.topk_p / topk_index [b, S]."""

    def __init__(self, args: RuntimeArgs) -> None:
        super().__init__(args, ChainKind())

    def draft_forward(self, draft_input: Any) -> DraftResult:
        """(parent_list [b, S or 0], top_scores_index [b, S], draft_tokens [b, S]).

        Fast path when the active state's chain buffers were built for its S, topk_index has S
        columns and b <= capacity: row views of the buffers and topk_index itself, with the
        chain's layout; otherwise SGLang's general organize (layout None, decoded with topk 1).
        """
        slot = self.slot
        if slot.pending is not None:
            self.reloads.apply_pending()
        topk_p, topk_index, (b, width) = checked_topk(draft_input)
        state = slot.active  # one read: a concurrent swap cannot mix two states
        # key check: buffers built for this S (a chain state's N is S + 1 by validation)
        buf = state.chain_buffers
        views = chain_fast_views(buf, state.spec.num_steps, width, b, state.counts)
        if views is not None:
            return DraftResult(views[0], views[1], topk_index, buf.layout)
        hidden = getattr(draft_input, "hidden_states", None)
        return self._draft_forward_organize(state.counts, topk_p, topk_index, hidden, state.spec.num_steps,
                                            state.spec.num_draft_tokens)

    def _draft_forward_organize(self, counts: StepCounts, topk_p: torch.Tensor, topk_index: torch.Tensor,
                                hidden_states: torch.Tensor | None, num_steps: int,
                                num_draft_tokens: int) -> DraftResult:
        """The general path: per-step cat/topk/sort/gather of the chain (same results)."""
        if topk_index.shape[1] != num_steps:
            raise ValueError(
                f"draft_input.topk_index has {topk_index.shape[1]} columns: a multi-layer chain "
                f"of num_steps={num_steps} needs {num_steps}"
            )
        counts.tree_path_calls += 1
        with span("organize_tree", bs=topk_index.shape[0], num_steps=num_steps):
            return DraftResult(*organize_chain_steps(topk_p, topk_index, hidden_states, num_steps,
                                                     num_draft_tokens))
