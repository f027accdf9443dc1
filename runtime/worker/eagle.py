"""EAGLE draft worker: S-1 draft-model forwards with per-step top-k, then organize.

The whole step (every forward, the per-step top-k and the organize) is one capturable
function of (topk_p, topk_index, hidden_states): no host reads, no value-dependent shapes.
Static topologies (a chain, a static tree: DESIGN.md §8) are drafted depth by depth with
constant rows per depth, and the step returns views of the state's topology buffers, so
inside a captured graph the organize stage adds no node; dynamic trees (topk > 1 without
tree_choices) take the general select/organize path. What must stay outside the graph: input
validation, state selection, counters and spans (they run on the host per call).

The per-row draft state (``hidden_states``) is one tensor [b, hidden_size] (SGLang's form), or,
for a model with ``row_template(rows, device)``, that NamedTuple of named tensors (slot and
position as int64, not float columns): see `runtime.worker.draft_rows`. The graph step then has one
static input per leaf (``hidden_states_<field>``, pad 0).

Input rules (`_check_input`, the same for a graph replay, the eager backend and the eager
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

from draftgraph.graphs import Miss, resolve_backend, span
from draftgraph.runtime.config import RuntimeArgs
from draftgraph.runtime.draft_io import DraftResult, unpack_draft_input
from draftgraph.runtime.settings import compile_process
from draftgraph.runtime.topology.buffers import Selector, TopologyBuffers
from draftgraph.runtime.topology.organize import fast_topk, organize_draft_results, select_top_k_tokens
from draftgraph.runtime.validation import ConfigTypeError
from draftgraph.runtime.worker.base import EagleDraftWorkerBase, GraphStep
from draftgraph.runtime.worker.draft_checks import check_draft_values, debug_checks_enabled
from draftgraph.runtime.worker.draft_rows import DraftRowsLike, RowLayout, leaves, map_rows
from draftgraph.runtime.worker.state import RuntimeState
from draftgraph.runtime.worker.stored_steps import stored_code
from draftgraph.runtime.worker.weights import StorageGuard, WeightRefit

__all__ = ["EagleDraftWorker"]

TOPK_NAMES = ("topk_p", "topk_index")  # the graph step's first inputs; the row leaves follow
NO_GRAPHS = Miss("no_graphs")  # the state has no replayable manager (see state.EAGER_REASONS)


class EagleDraftWorker(EagleDraftWorkerBase):
    """Drafts with ``draft_model(input_ids [M], rows) -> (logits [M, V], rows)``.

    ``rows`` is hidden [M, H] (the model exposes ``hidden_size``; its dtype is taken from
    ``dtype`` or its parameters), or, for a model with ``row_template(rows, device)``, a
    NamedTuple of tensors of leading dim M like that template (`runtime.worker.draft_rows`).
    """

    def __init__(self, args: RuntimeArgs, draft_model: Any) -> None:
        if not callable(draft_model):
            raise ConfigTypeError(f"draft_model={type(draft_model).__name__}: must be callable")
        self.draft_model = draft_model
        self.row_layout = _model_rows(draft_model)
        self.hidden_size = self.row_layout.hidden_size  # None for named rows
        self.hidden_dtype = self.row_layout.dtypes[0] if not self.row_layout.structured else None
        self.vocab_size = getattr(draft_model, "vocab_size", None)
        self.debug_checks = debug_checks_enabled()  # DRAFTGRAPH_DEBUG=1: ids and NaN checked per step
        self.last_state: RuntimeState | None = None  # the state the latest step ran under
        self._device_for: tuple[str, torch.device] = ("", torch.device("cpu"))
        # in-place weight updates (None for a draft model that is not an nn.Module)
        self.weights = WeightRefit(draft_model) if isinstance(draft_model, torch.nn.Module) else None
        super().__init__(args)

    def _row_input_bytes(self) -> int:
        """hidden_states: one row of every leaf ([H] in the model's dtype for one tensor), the
        memory check's estimate."""
        return self.row_layout.row_bytes()

    def _check_args(self, args: RuntimeArgs) -> None:
        """The draft model's parameters must live on the args' device."""
        dev = _model_device(self.draft_model)
        if dev is not None and dev != torch.device(args.device):
            raise ValueError(
                f"device={args.device!r}: the draft model's parameters are on {dev}; "
                f"move the model or use device={str(dev)!r}"
            )

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

    def apply_pending_weights(self) -> bool:
        """Copy a requested weight update in place now (a host calls it at its step boundary);
        False when none was pending."""
        if self.weights is None or not self.weights.pending:
            return False
        with self.slot.lock:
            return self.weights.apply_pending()

    def _stored_code(self, state: RuntimeState, backend: str, background: bool) -> Any:
        """The compiled-code store for the compile backend (`runtime.worker.stored_steps`), else None;
        ``background`` captures compile in the worker's compile process (off this process's
        interpreter lock) unless ``DRAFTGRAPH_COMPILE_PROCESS=0``."""
        if resolve_backend(backend, self.device) != "compile":
            return None
        use_process = background and compile_process()
        return stored_code(self, state, self.draft_model, self.compile_process if use_process else None)

    def _new_manager(self, state: RuntimeState, backend: str, background: bool = False) -> Any:
        """The base manager, with the storage of the draft tensors its graphs will read."""
        state.storage_guard = StorageGuard(self.draft_model)
        return super()._new_manager(state, backend, background)

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
        slot = self.slot
        if slot.pending is not None:
            self._apply_pending()
        weights = self.weights
        if weights is not None and weights.pending and slot.host is None:
            self.apply_pending_weights()
        topk_p, topk_index, hidden = unpack_draft_input(draft_input)
        b = topk_index.shape[0]
        with slot.lock:
            state = slot.active
            self._check_input(state, topk_p, topk_index, hidden)  # against the state that will run
            if self.debug_checks:
                check_draft_values(topk_p, topk_index, hidden, self.vocab_size)
            self.last_state = state
            self.capture_queue.note_batch(b)
            graphs = state.replayable_graphs()
            found = graphs.lookup(b) if graphs is not None else NO_GRAPHS
            if type(found) is not Miss:
                if state.storage_guard is not None:
                    state.storage_guard.check()  # a replaced draft tensor: refused, never read stale
                # checked above (`_check_input`): the manager loads them as they are
                out = graphs.replay_trusted(found, (topk_p, topk_index, *leaves(hidden)))
                buf = state.static_buffers()
                return DraftResult(*out, buf.layout if buf is not None else None, replayed_at=found.load.padded)
            reason = found.reason
            reasons = state.counts.eager_reasons
            reasons[reason] = reasons.get(reason, 0) + 1
            # the graph path reads contiguous copies: the eager path reads the same layout
            topk_p, topk_index = topk_p.contiguous(), topk_index.contiguous()
            hidden = self.row_layout.assemble([t.contiguous() for t in leaves(hidden)])
            if graphs is None:
                return replace(self.draft_step(state, topk_p, topk_index, hidden), eager_reason=reason)
            with span("eager_fallback", bs=b, reason=reason):
                return replace(self.draft_step(state, topk_p, topk_index, hidden), eager_reason=reason)

    def _check_input(self, state: RuntimeState, topk_p: torch.Tensor, topk_index: torch.Tensor,
                     hidden: DraftRowsLike | None) -> None:
        """The one set of input rules, for every path, and the step's only input check: topk_p
        float32 and topk_index int64 [b, k] (same shape: checked by `unpack_draft_input`),
        hidden_states [b, H] of the model's dtype (or each named leaf [b, *trailing] of its
        template's dtype), all on the worker's device. TypeError for a dtype, ValueError for a
        shape or a device, naming the input (``hidden_states.<field>`` for a leaf)."""
        k = state.spec.topk
        if topk_index.shape[1] != k:
            raise ValueError(
                f"draft_input.topk_index has {topk_index.shape[1]} columns: topk={k} needs {k}"
            )
        b = topk_index.shape[0]
        if self.row_layout.structured:
            self._check_named_rows(topk_p, topk_index, hidden, b)
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
        dev = self._input_device()
        if topk_p.device != dev or topk_index.device != dev or hidden.device != dev:
            for name, t in (("topk_p", topk_p), ("topk_index", topk_index), ("hidden_states", hidden)):
                if t.device != dev:
                    raise ValueError(f"draft_input.{name} is on {t.device}: must be on the worker's "
                                     f"device {dev}")

    def _check_named_rows(self, topk_p: torch.Tensor, topk_index: torch.Tensor, hidden: Any, b: int) -> None:
        """`_check_input` for named rows: shapes, then dtypes, then devices (the same order)."""
        rows = self.row_layout
        rows.check_shapes(hidden, b)
        for name, t, want in (("topk_p", topk_p, torch.float32), ("topk_index", topk_index, torch.int64)):
            if t.dtype is not want:
                raise TypeError(f"draft_input.{name} has dtype {t.dtype}: must be {want} (on every backend)")
        rows.check_dtypes(hidden)
        dev = self._input_device()
        for name, t in (("topk_p", topk_p), ("topk_index", topk_index)):
            if t.device != dev:
                raise ValueError(f"draft_input.{name} is on {t.device}: must be on the worker's device {dev}")
        rows.check_device(hidden, dev)

    def _input_device(self) -> torch.device:
        """The args' device with its index resolved ("cuda" -> the current CUDA device), cached."""
        name = self.slot.args.device
        cached = self._device_for
        if cached[0] == name:
            return cached[1]
        dev = torch.device(name)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        self._device_for = (name, dev)
        return dev

    # ---- the step --------------------------------------------------------------------------
    def draft_step(self, state: RuntimeState, topk_p: torch.Tensor, topk_index: torch.Tensor,
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
        lists = self._tree_lists(spec.num_steps, spec.topk, topk_p, topk_index, hidden)
        if not count:
            return DraftResult(*organize_draft_results(*lists, spec.num_draft_tokens))
        counts.tree_path_calls += 1
        with span("organize_tree", bs=b, num_steps=spec.num_steps):
            return DraftResult(*organize_draft_results(*lists, spec.num_draft_tokens))

    def draft_tokens(self, state: RuntimeState, topk_p: torch.Tensor, topk_index: torch.Tensor,
                     hidden: DraftRowsLike) -> torch.Tensor:
        """The draft tokens of one step of ``state`` without organizing them: [b, N-1] for a
        static topology, [b, k + (S-1)k^2] (every candidate) for a dynamic tree. Capturable and
        uncounted (benchmarks of the forwards alone)."""
        buf = state.static_buffers()
        if buf is not None:
            return self._static_tokens(buf, topk_index, hidden)
        spec = state.spec
        return torch.cat(self._tree_lists(spec.num_steps, spec.topk, topk_p, topk_index, hidden)[1], dim=1)

    def _forward_topk(self, input_ids: torch.Tensor, hidden: DraftRowsLike, topk: int
                      ) -> tuple[torch.Tensor, torch.Tensor, DraftRowsLike]:
        """One draft forward: (topk_p, topk_index [M, k], next rows [M, ...])."""
        logits, hidden = self.draft_model(input_ids, hidden)
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

    def _tree_lists(self, num_steps: int, topk: int, topk_p: torch.Tensor,
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
    def _graph_step(self, state: RuntimeState, max_size: int, organize: bool = True) -> GraphStep:
        """The step over static topk_p / topk_index [max_size, k] and hidden_states [max_size, H]
        (named rows: one static input ``hidden_states_<field>`` [max_size, ...] per leaf; pad 0,
        so a pad row of the head reads the dummy slot 0 and attends only to itself)
        (``organize=False``: the tokens only, `draft_tokens`)."""
        k, dev = state.spec.topk, torch.device(self.slot.args.device)
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
                return self.draft_tokens(state, topk_p, topk_index, hidden)
            return tuple(self.draft_step(state, topk_p, topk_index, hidden, count=False))

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


def _model_device(model: Any) -> torch.device | None:
    """Device of the model's first parameter (None without parameters)."""
    params = getattr(model, "parameters", None)
    if callable(params):
        for p in params():
            return p.device
    return None


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
