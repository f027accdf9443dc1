"""Draft worker base: arguments, the active RuntimeState, topology buffers, states and overrides.

A worker serves from one active `RuntimeState`. Everything that changes the configuration
(override, build/apply, reload) builds a complete state first and then swaps one reference, so
a step never sees a half-built state, and a state's graphs only ever read or return the
buffers that state owns.

The worker holds three collaborators, each with its own small interface: ``reloads``
(`Reloads`: request, prepare, commit, the reload log; given the slot, the budget, the capture
and the worker's `StateFactory` as objects), ``capture`` (`StateCapture`: building and
capturing a state's graphs, the capture queue, the compile processes, the host's phases) and
``budget`` (`StateBudget`: the memory limit per state). What a host engine may use of a worker
is written in `runtime.worker.contract.DraftWorker`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from draftgraph.graphs import capture_batch_sizes, span
from draftgraph.runtime.config import RuntimeArgs, SpeculativeConfig, chain_capacity
from draftgraph.runtime.topology.buffers import TopologyBufferCache, TopologyBuffers
from draftgraph.runtime.validation import ConfigTypeError, require_positive_int
from draftgraph.runtime.worker.budget import StateBudget
from draftgraph.runtime.worker.counting import CounterLedger
from draftgraph.runtime.worker.kind import WorkerKind
from draftgraph.runtime.worker.reload import Reloads
from draftgraph.runtime.worker.state import DraftCounters, RuntimeState
from draftgraph.runtime.worker.state_capture import StateCapture
from draftgraph.runtime.worker.state_slot import StateSlot
from draftgraph.runtime.worker.weights import WeightRefit

__all__ = ["EagleDraftWorkerBase"]


class EagleDraftWorkerBase:
    """Holds the state slot (args, active state, generation, pending reload), the topology
    buffer cache, the counts and the collaborators of the module docstring.

    Subclasses provide ``draft_forward`` and give their `WorkerKind` (``kind``: args rules,
    row bytes, the capturable step, stored code) to this constructor.
    """

    weights: WeightRefit | None = None  # in-place draft-weight updates (None: not supported)

    def __init__(self, args: RuntimeArgs, kind: WorkerKind) -> None:
        if not isinstance(args, RuntimeArgs):
            raise ConfigTypeError(f"args={type(args).__name__}: must be a RuntimeArgs")
        for member in ("captures_graphs", "check_args", "row_input_bytes", "graph_step", "stored_code"):
            if not hasattr(kind, member):
                raise ConfigTypeError(f"kind={type(kind).__name__}: needs {member} (a WorkerKind)")
        self._kind = kind
        self._token = object()  # identifies this worker's states (an id() could be reused)
        self._topology_cache = TopologyBufferCache()  # every static topology; the chain is one
        self._ledger = CounterLedger()
        kind.check_args(args)
        # the operator's limit: a reload only lowers it
        self.budget = StateBudget(args.max_state_bytes, kind.row_input_bytes(), kind.captures_graphs)
        self.slot = StateSlot(args, self._new_state(args.speculative, None, args=args, generation=0))
        self.capture = StateCapture(self.slot, kind)
        self.reloads = Reloads(self.slot, _WorkerStates(self), self.budget, self.capture)

    # ---- configuration views -------------------------------------------------------------
    @property
    def args(self) -> RuntimeArgs:
        """The arguments the worker was built or last reloaded with."""
        return self.slot.args

    @property
    def state(self) -> RuntimeState:
        """The active runtime state."""
        return self.slot.active

    @property
    def generation(self) -> int:
        """Committed reloads so far: a state built under an older generation is stale."""
        return self.slot.generation

    @property
    def spec(self) -> SpeculativeConfig:
        """The active draft shape (S, k, N)."""
        return self.slot.active.spec

    @property
    def counters(self) -> DraftCounters:
        """Snapshot of the worker's counters over all its states, past and present (computed
        from the counts kept where each event happens; writing to it changes nothing)."""
        log = self.reloads.log
        return self._ledger.snapshot(log.succeeded, log.failed)

    def live_states(self) -> list[RuntimeState]:
        """Every state of this worker not garbage collected yet (metrics read their figures)."""
        return self._ledger.live_states()

    # ---- states ------------------------------------------------------------------------------
    def _buffers_for(self, spec: SpeculativeConfig, args: RuntimeArgs) -> TopologyBuffers | None:
        """Shared topology buffers for ``spec`` under ``args`` (None for a dynamic tree)."""
        topology = spec.topology
        if topology is None:
            return None
        return self._topology_cache.get(topology, chain_capacity(args), args.device)

    def _new_state(self, spec: SpeculativeConfig, capture_bs: Sequence[int] | None,
                   args: RuntimeArgs | None = None, generation: int | None = None,
                   target_only: bool = False, budget_checked: bool = False) -> RuntimeState:
        """A complete state for ``spec`` with its buffers, counted in this worker's figures;
        graphs are captured separately. Every state is built here, after the memory check
        (`StateBudget.check_state`): ValueError, nothing allocated, when it is over the budget.
        ``target_only``: a plain target step's state (no draft graphs, no topology buffers, so
        the draft state's budget does not apply); ``budget_checked``: a reload's, checked when
        requested (`Reloads.check`)."""
        args = args or self.slot.args
        if not (target_only or budget_checked):
            rows = None
            if capture_bs is not None:
                sizes = _capture_sizes(capture_bs, args)
                rows = sizes[-1] if sizes else 0
            self.budget.check_state(args, spec, rows)
        buffers = None if target_only else self._buffers_for(spec, args)
        state = RuntimeState(spec, _capture_sizes(capture_bs, args), buffers, self._token,
                             target_only=target_only)
        state.generation = self.slot.generation if generation is None else generation
        self._ledger.track(state)
        return state

    def _spec_for(self, num_steps: int, num_draft_tokens: int | None, topk: int | None = None,
                  tree_choices: Any = None) -> SpeculativeConfig:
        """Validated spec; topk defaults to the active state's."""
        return SpeculativeConfig(num_steps, self.spec.topk if topk is None else topk, num_draft_tokens,
                                 tree_choices)

    # ---- graphs, states and reloads ------------------------------------------------------------
    def capture_graphs(self, backend: str = "auto", background: bool = False) -> RuntimeState:
        """Capture the active state's draft step, one graph per capture size; later steps replay.

        ``background=True`` queues the sizes instead (capture off the serving path): trace and
        compile units run in a background thread, CUDA units at step boundaries through
        ``capture.run_pending``; a step whose size is not ready yet runs eager. See
        `StateCapture.ready`, `StateCapture.wait`."""
        with self.slot.lock:
            self.capture.use_backend(backend)  # the worker's: later reloads capture with it
            return self.capture.build(self.slot.active, backend, background)

    @contextmanager
    def override_worker_state(self, num_steps: int, num_draft_tokens: int | None = None,
                              capture_bs: Sequence[int] | None = None, *, topk: int | None = None,
                              tree_choices: Any = None) -> Iterator[RuntimeState]:
        """Temporarily serve (S, N) (and ``topk`` / a static tree when given): validate (nothing
        changes on error), swap in a state with its own topology buffers, yield it; on exit,
        also on error, restore the previous state object, whose buffers and graphs are
        untouched. Nests. ``capture_bs=[]`` means no graphs.
        Holds the worker's lock throughout: steps of other threads wait until it exits."""
        self.reloads.require_direct("override_worker_state")
        spec = self._spec_for(num_steps, num_draft_tokens, topk, tree_choices)
        slot = self.slot
        with slot.lock:
            with span("rebuild", num_steps=spec.num_steps, capacity=chain_capacity(slot.args)):
                temporary = self._new_state(spec, capture_bs)
                self._ledger.events.rebuilds += 1
            previous = slot.switch(temporary)
            try:
                yield temporary
            finally:
                slot.switch(previous)

    def build_runtime_state(self, num_steps: int, num_draft_tokens: int | None = None,
                            capture_bs: Sequence[int] | None = None,
                            backend: str = "auto", *, topk: int | None = None,
                            tree_choices: Any = None, background: bool = False) -> RuntimeState:
        """Build and capture a state for (S, N) (``topk`` / ``tree_choices`` as in the override)
        without disturbing the active one.

        Equivalent to capturing inside an override, except that the active state is never
        swapped, so a lock-free reader (the multi-layer fast path) cannot see the new state.
        ``background=True`` queues its capture after the active state's (see `capture_graphs`)."""
        spec = self._spec_for(num_steps, num_draft_tokens, topk, tree_choices)
        with self.slot.lock:
            return self.capture.build(self._new_state(spec, capture_bs), backend, background)

    def build_target_state(self, capture_bs: Sequence[int], backend: str = "auto", *,
                           background: bool = False) -> RuntimeState:
        """Build and capture the state of a plain target step (S = 0: nothing drafted) at
        ``capture_bs``: no draft graphs, only the host's phases for a step that drafts nothing
        (the provider called with spec None: the engine's verify and extend at width 1). A host
        that serves S = 0 makes it active (`apply_runtime_state`) for those steps, so a width-1
        step never reads a drafting state's width-N graphs, nor the reverse. Without a phase
        provider it holds no graphs. ``background=True`` queues its capture (see `capture_graphs`)."""
        with self.slot.lock:
            state = self._new_state(self.slot.args.speculative, capture_bs, target_only=True)
            return self.capture.build(state, backend, background)

    def apply_runtime_state(self, state: RuntimeState) -> None:
        """Switch to a built state: O(1), no capture, no allocation."""
        if not isinstance(state, RuntimeState) or state.owner is not self._token:
            raise ValueError(f"state={state!r}: not a state built by this worker")
        slot = self.slot
        if state.generation != slot.generation:
            raise ValueError(
                f"state={state!r}: built before the last reload (generation {state.generation}, "
                f"now {slot.generation}); build it again"
            )
        with slot.lock:
            slot.switch(state)
            self._ledger.events.switches += 1

    def reload(self, new_args: RuntimeArgs, policy: str = "swap", backend: str | None = None) -> None:
        """Replace the active state with one built from ``new_args`` (`Reloads.reload`: ``swap``
        builds then swaps, ``release_first`` releases the old graphs first)."""
        self.reloads.reload(new_args, policy, backend)

    def request_reload(self, new_args: RuntimeArgs, policy: str = "swap") -> None:
        """Validate now, reload at the start of the next step: the worker's own, or its host's
        step boundary (safe from signal handlers; `Reloads.request`)."""
        self.reloads.request(new_args, policy)


class _WorkerStates:
    """The `StateFactory` a worker gives its `Reloads`: its args rules and its new states."""

    def __init__(self, worker: EagleDraftWorkerBase) -> None:
        self._worker = worker

    def check_args(self, args: RuntimeArgs) -> None:
        """The worker's own rules."""
        self._worker._kind.check_args(args)  # noqa: SLF001  # this module's own worker

    def new_state(self, args: RuntimeArgs, generation: int) -> RuntimeState:
        """A reload's state (no graphs yet; its budget was checked when requested)."""
        return self._worker._new_state(args.speculative, None, args=args, generation=generation,  # noqa: SLF001
                                       budget_checked=True)


def _capture_sizes(capture_bs: Sequence[int] | None, args: RuntimeArgs) -> tuple[int, ...]:
    """None: the sizes the args ask for; []: none (eager); else validated explicit sizes."""
    if capture_bs is None:
        decode = args.decode
        if decode.max_bs is None and decode.bs is None:
            return ()
        return tuple(capture_batch_sizes(decode, limit=args.max_running_requests))
    if isinstance(capture_bs, (str, bytes)) or not hasattr(capture_bs, "__iter__"):
        raise ConfigTypeError(f"capture_bs={capture_bs!r}: must be a sequence of ints or None")
    sizes = tuple(capture_bs)
    for i, b in enumerate(sizes):
        require_positive_int(f"capture_bs[{i}]", b)
    if list(sizes) != sorted(set(sizes)):
        raise ValueError(f"capture_bs={list(sizes)!r}: must be sorted ascending and unique")
    return sizes
