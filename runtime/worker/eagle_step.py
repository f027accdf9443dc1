"""The EAGLE draft step of a state: S-1 draft-model forwards with per-step top-k, then organize.

The whole step (every forward, the per-step top-k and the organize) is one capturable
function of (topk_p, topk_index, hidden_states): no host reads, no value-dependent shapes.
Static topologies (a chain, a static tree: DESIGN.md §8) are drafted depth by depth with
constant rows per depth, and the step returns views of the state's topology buffers, so
inside a captured graph the organize stage adds no node; dynamic trees (topk > 1 without
tree_choices) take the general select/organize path.

`EagleDrafting` is what `EagleDraftWorker` holds of its draft model: the row layout, the input
rules (`check_input`), the step (`step`, `tokens`) and the capturable graph step
(`graph_step`). It keeps no state of its own besides the layout and the latest served state.
"""

from __future__ import annotations

from typing import Any

import torch

from draftgraph.graphs import span
from draftgraph.runtime.draft_io import DraftResult
from draftgraph.runtime.topology.buffers import Selector, TopologyBuffers
from draftgraph.runtime.topology.draft_rows import DraftRowsLike, RowLayout, map_rows
from draftgraph.runtime.topology.organize import fast_topk, organize_draft_results, select_top_k_tokens
from draftgraph.runtime.validation import ConfigTypeError
from draftgraph.runtime.worker.draft_checks import debug_checks_enabled
from draftgraph.runtime.worker.host_phases import GraphStep
from draftgraph.runtime.worker.state import RuntimeState

__all__ = ["EagleDrafting", "TOPK_NAMES"]

TOPK_NAMES = ("topk_p", "topk_index")  # the graph step's first inputs; the row leaves follow


class EagleDrafting:
    """Drafts with ``draft_model(input_ids [M], rows) -> (logits [M, V], rows)``.

    ``rows`` is hidden [M, H] (the model exposes ``hidden_size``; its dtype is taken from
    ``dtype`` or its parameters), or, for a model with ``row_template(rows, device)``, a
    NamedTuple of tensors of leading dim M like that template (`runtime.topology.draft_rows`).
    """

    def __init__(self, draft_model: Any) -> None:
        self.model = draft_model
        self.row_layout = _model_rows(draft_model)
        self.hidden_size = self.row_layout.hidden_size  # None for named rows
        self.hidden_dtype = self.row_layout.dtypes[0] if not self.row_layout.structured else None
        self.vocab_size = getattr(draft_model, "vocab_size", None)
        self.debug_checks = debug_checks_enabled()  # DRAFTGRAPH_DEBUG=1: ids and NaN checked per step
        self.last_state: RuntimeState | None = None  # the state the latest served step ran under
        self._device_for: tuple[str, torch.device] = ("", torch.device("cpu"))

    # ---- input rules -----------------------------------------------------------------------
    def check_input(self, state: RuntimeState, topk_p: torch.Tensor, topk_index: torch.Tensor,
                    hidden: DraftRowsLike | None, device: str) -> None:
        """The one set of input rules, for every path, and the step's only input check: topk_p
        float32 and topk_index int64 [b, k] (same shape: checked by `unpack_draft_input`),
        hidden_states [b, H] of the model's dtype (or each named leaf [b, *trailing] of its
        template's dtype), all on the worker's ``device``. TypeError for a dtype, ValueError for a
        shape or a device, naming the input (``hidden_states.<field>`` for a leaf)."""
        k = state.spec.topk
        if topk_index.shape[1] != k:
            raise ValueError(
                f"draft_input.topk_index has {topk_index.shape[1]} columns: topk={k} needs {k}"
            )
        b = topk_index.shape[0]
        if self.row_layout.structured:
            self._check_named_rows(topk_p, topk_index, hidden, b, device)
            return
        if not isinstance(hidden, torch.Tensor) or hidden.shape != (b, self.hidden_size):
            got = tuple(hidden.shape) if isinstance(hidden, torch.Tensor) else hidden
            raise ValueError(
                f"draft_input.hidden_states={got}: must be [b, hidden_size] = [{b}, {self.hidden_size}]"
            )
        if topk_p.dtype is not torch.float32 or topk_index.dtype is not torch.int64 \
                or hidden.dtype is not self.hidden_dtype:
            for name, t, want in (("topk_p", topk_p, torch.float32), ("topk_index", topk_index, torch.int64),
                                  ("hidden_states", hidden, self.hidden_dtype)):
                if t.dtype is not want:
                    raise TypeError(f"draft_input.{name} has dtype {t.dtype}: must be {want} "
                                    f"(on every backend)")
        dev = self._input_device(device)
        if topk_p.device != dev or topk_index.device != dev or hidden.device != dev:
            for name, t in (("topk_p", topk_p), ("topk_index", topk_index), ("hidden_states", hidden)):
                if t.device != dev:
                    raise ValueError(f"draft_input.{name} is on {t.device}: must be on the worker's "
                                     f"device {dev}")

    def _check_named_rows(self, topk_p: torch.Tensor, topk_index: torch.Tensor, hidden: Any, b: int,
                          device: str) -> None:
        """`check_input` for named rows: shapes, then dtypes, then devices (the same order)."""
        rows = self.row_layout
        rows.check_shapes(hidden, b)
        for name, t, want in (("topk_p", topk_p, torch.float32), ("topk_index", topk_index, torch.int64)):
            if t.dtype is not want:
                raise TypeError(f"draft_input.{name} has dtype {t.dtype}: must be {want} (on every backend)")
        rows.check_dtypes(hidden)
        dev = self._input_device(device)
        for name, t in (("topk_p", topk_p), ("topk_index", topk_index)):
            if t.device != dev:
                raise ValueError(f"draft_input.{name} is on {t.device}: must be on the worker's device {dev}")
        rows.check_device(hidden, dev)

    def _input_device(self, name: str) -> torch.device:
        """Device ``name`` with its index resolved ("cuda" -> the current CUDA device), cached."""
        cached = self._device_for
        if cached[0] == name:
            return cached[1]
        dev = torch.device(name)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        self._device_for = (name, dev)
        return dev


    # ---- the step --------------------------------------------------------------------------
    def step(self, state: RuntimeState, topk_p: torch.Tensor, topk_index: torch.Tensor,
                   hidden: DraftRowsLike, *, count: bool = True) -> DraftResult:
        """One organized draft step of ``state``, capturable.

        ``count``: the host-side bookkeeping (``state``'s counts: fast path, tree path, capacity
        fallback; the organize spans). False inside a captured step, where a span would be
        recorded into the graph (trace) or not replay (cuda) and the manager counts the replay.
        """
        b = topk_index.shape[0]
        buf = state.static_buffers()
        counts = state.counts
        if buf is not None:
            tokens = self._static_tokens(buf, topk_index, hidden)
            if b > buf.capacity:  # fresh copies of the constant rows, the same layout
                if count:
                    counts.capacity_fallbacks += 1
                    counts.tree_path_calls += 1
                return DraftResult(*buf.copies(b), tokens, buf.layout)
            if not count:
                return DraftResult(*buf.view(b), tokens, buf.layout)
            counts.fast_path_hits += 1
            with span("organize_fast", bs=b):
                parents, score_indices = buf.view(b)
            return DraftResult(parents, score_indices, tokens, buf.layout)
        spec = state.spec
        lists = self.tree_lists(spec.num_steps, spec.topk, topk_p, topk_index, hidden)
        if not count:
            return DraftResult(*organize_draft_results(*lists, spec.num_draft_tokens))
        counts.tree_path_calls += 1
        with span("organize_tree", bs=b, num_steps=spec.num_steps):
            return DraftResult(*organize_draft_results(*lists, spec.num_draft_tokens))

    def tokens(self, state: RuntimeState, topk_p: torch.Tensor, topk_index: torch.Tensor,
                     hidden: DraftRowsLike) -> torch.Tensor:
        """The draft tokens of one step of ``state`` without organizing them: [b, N-1] for a
        static topology, [b, k + (S-1)k^2] (every candidate) for a dynamic tree. Capturable and
        uncounted (benchmarks of the forwards alone)."""
        buf = state.static_buffers()
        if buf is not None:
            return self._static_tokens(buf, topk_index, hidden)
        spec = state.spec
        return torch.cat(self.tree_lists(spec.num_steps, spec.topk, topk_p, topk_index, hidden)[1], dim=1)

    def _forward_topk(self, input_ids: torch.Tensor, hidden: DraftRowsLike, topk: int
                      ) -> tuple[torch.Tensor, torch.Tensor, DraftRowsLike]:
        """One draft forward: (topk_p, topk_index [M, k], next rows [M, ...])."""
        logits, hidden = self.model(input_ids, hidden)
        p, idx = fast_topk(torch.softmax(logits, dim=-1), topk, dim=-1)
        return p, idx, hidden

    def _static_tokens(self, buf: TopologyBuffers, topk_index: torch.Tensor, hidden: DraftRowsLike
                       ) -> torch.Tensor:
        """Static-topology drafting, depth by depth (no path scores: the tree is fixed).

        Depth 1 takes the input's top-k columns by rank; at each depth, the nodes with children
        run one forward on (their token, their parent's hidden) and their children take the top
        tokens of it by rank. Returns draft_tokens [b, N-1] in node order; a chain runs exactly
        the chain's ops (slices and views only besides the forwards and the final cat).
        """
        b = topk_index.shape[0]
        level = _select(topk_index, buf.first_columns)  # [b, nodes at depth 1]
        tokens = [level]
        if not buf.levels:
            return level
        ids = _select(level, buf.first_feed).flatten()
        if buf.first_rows > 1:  # every depth-1 node's parent is the root
            first_rows = buf.first_rows
            hidden = map_rows(lambda t: t.repeat_interleave(first_rows, dim=0), hidden)
        last = len(buf.levels) - 1
        for i, (rows, k, columns, next_positions, next_rows) in enumerate(buf.levels):
            _, idx, hidden = self._forward_topk(ids, hidden, k)  # [b*rows, k], [b*rows, H]
            level = _select(idx.view(b, rows * k), columns)
            tokens.append(level)
            if i == last:
                break
            ids = _select(level, next_positions).flatten()
            if next_rows is not None:  # each fed node takes its parent's hidden row
                hidden = map_rows(_parent_rows(b, rows, next_rows), hidden)
        return torch.cat(tokens, dim=1)

    def tree_lists(self, num_steps: int, topk: int, topk_p: torch.Tensor,
                   topk_index: torch.Tensor, hidden: DraftRowsLike
                   ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        """The general draft loop: per-step (scores, tokens, parents) for organize."""
        score_list: list[torch.Tensor] = []
        token_list: list[torch.Tensor] = []
        parents_list: list[torch.Tensor] = []
        scores = None
        for i in range(num_steps):
            ids, hidden, scores, (s, t, p) = select_top_k_tokens(
                i, topk_p, topk_index, hidden, scores, topk
            )
            score_list.append(s)
            token_list.append(t)
            parents_list.append(p)
            if i == num_steps - 1:
                break
            topk_p, topk_index, hidden = self._forward_topk(ids, hidden, topk)
        return score_list, token_list, parents_list

    # ---- capture ---------------------------------------------------------------------------
    def graph_step(self, state: RuntimeState, max_size: int, device: str, organize: bool = True) -> GraphStep:
        """The step over static topk_p / topk_index [max_size, k] and hidden_states [max_size, H]
        (named rows: one static input ``hidden_states_<field>`` [max_size, ...] per leaf; pad 0,
        so a pad row of the head reads the dummy slot 0 and attends only to itself)
        (``organize=False``: the tokens only, `tokens`) on ``device``."""
        k, dev = state.spec.topk, torch.device(device)
        layout = self.row_layout
        row_names = layout.input_names()
        static = {
            "topk_p": torch.zeros(max_size, k, dtype=torch.float32, device=dev),
            "topk_index": torch.zeros(max_size, k, dtype=torch.long, device=dev),
            **dict(zip(row_names, layout.zeros(max_size, dev))),
        }

        def step(topk_p: torch.Tensor, topk_index: torch.Tensor, **row_inputs: torch.Tensor) -> Any:
            hidden = layout.assemble([row_inputs[n] for n in row_names])
            if not organize:
                return self.tokens(state, topk_p, topk_index, hidden)
            return tuple(self.step(state, topk_p, topk_index, hidden, count=False))

        return GraphStep(step, static, {name: 0 for name in (*TOPK_NAMES, *row_names)})



def _select(t: torch.Tensor, selector: Selector | None) -> torch.Tensor:
    """Entries along dim 1 of ``t``: all (None), a slice (a view), or an int64 index (one gather)."""
    if selector is None:
        return t
    if isinstance(selector, slice):
        if selector.start == 0 and selector.stop == t.shape[1]:
            return t
        return t[:, selector]
    return t.index_select(1, selector)


def _parent_rows(b: int, rows: int, selector: Selector) -> Any:
    """Leaf [b*rows, *trail] -> the rows ``selector`` picks per request, [b*picked, *trail]."""
    def pick(t: torch.Tensor) -> torch.Tensor:
        trail = t.shape[1:]
        return _select(t.reshape(b, rows, *trail), selector).reshape(-1, *trail)
    return pick


def _model_rows(model: Any) -> RowLayout:
    """The row layout of ``model``: its ``row_template`` when it has one, else one tensor
    [hidden_size] of its dtype. ConfigTypeError when neither is usable."""
    template = getattr(model, "row_template", None)
    if callable(template):
        try:
            return RowLayout.from_template(template(1, torch.device("meta")))
        except TypeError as e:
            raise ConfigTypeError(f"draft_model.row_template: {e}") from e
    hidden = getattr(model, "hidden_size", None)
    if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1:
        raise ConfigTypeError(
            f"draft_model.hidden_size={hidden!r}: the draft model must expose an int hidden_size "
            f"(or row_template(rows, device))"
        )
    return RowLayout.tensor(hidden, _model_dtype(model))



def _model_dtype(model: Any) -> torch.dtype:
    """The model's hidden dtype: ``model.dtype``, else its first parameter's, else float32."""
    dtype = getattr(model, "dtype", None)
    if isinstance(dtype, torch.dtype):
        return dtype
    params = getattr(model, "parameters", None)
    if callable(params):
        for p in params():
            return p.dtype
    return torch.float32
