"""Draft worker base: arguments, the active RuntimeState, topology buffers, graph capture, overrides.

A worker serves from one active `RuntimeState`. Everything that changes the configuration
(override, build/apply, reload) builds a complete state first and then swaps one reference, so
a step never sees a half-built state, and a state's graphs only ever read or return the
buffers that state owns.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch

from draftgraph.graphs import GraphCaptureError, GraphCaptureManager, capture_batch_sizes, resolve_backend, span
from draftgraph.graphs.compile.inductor import inductor_cache_dir
from draftgraph.graphs.compile.pool import CompilePool
from draftgraph.runtime.config import RuntimeArgs, SpeculativeConfig, chain_capacity
from draftgraph.runtime.settings import compile_process
from draftgraph.runtime.topology.buffers import TopologyBufferCache, TopologyBuffers
from draftgraph.runtime.validation import ConfigTypeError, require_positive_int
from draftgraph.runtime.worker.budget import check_state_budget, check_states_budget, largest_capture_size
from draftgraph.runtime.worker.capture_queue import CaptureQueue
from draftgraph.runtime.worker.counting import CounterLedger
from draftgraph.runtime.worker.host_phases import PhaseGraphs, PhaseProvider
from draftgraph.runtime.worker.reload import ReloadLog, ReloadMixin
from draftgraph.runtime.worker.state import DraftCounters, RuntimeState
from draftgraph.runtime.worker.state_slot import StateSlot
from draftgraph.runtime.worker.stored_steps import phase_stored_code

__all__ = ["EagleDraftWorkerBase", "GraphStep"]

logger = logging.getLogger(__name__)


class GraphStep(NamedTuple):
    """What a worker hands the graph manager for one state: the capturable ``step(**inputs)``,
    its named static inputs (allocated at the largest capture size) and their pad values.
    A host's phase may add what its compiled code is stored under: ``structure`` (everything
    the code depends on besides shapes: models, configuration, widths) and ``constants()``
    (every tensor the step reads besides its inputs, by stable name); see `runtime.worker.stored_steps`."""

    step: Callable[..., Any]
    static_inputs: dict[str, torch.Tensor]
    pad_values: dict[str, float | int]
    structure: str = ""
    constants: Callable[[], Any] | None = None


class EagleDraftWorkerBase(ReloadMixin):
    """Holds the state slot (args, active state, generation, pending reload), the topology
    buffer cache and the counts.

    Subclasses provide ``_graph_step(state, max_size)`` (a `GraphStep`).
    """

    captures_graphs = True

    def __init__(self, args: RuntimeArgs) -> None:
        if not isinstance(args, RuntimeArgs):
            raise ConfigTypeError(f"args={type(args).__name__}: must be a RuntimeArgs")
        self._token = object()  # identifies this worker's states (an id() could be reused)
        self._topology_cache = TopologyBufferCache()  # every static topology; the chain is one
        self._ledger = CounterLedger()
        self.reload_log = ReloadLog()
        self._check_args(args)
        self._state_bytes_limit = args.max_state_bytes  # the operator's: a reload only lowers it
        self.slot = StateSlot(args, self._new_state(args.speculative, None, args=args, generation=0))
        self.capture_queue = CaptureQueue(lambda: self.slot.active)
        self.capture_queue.interrupt_at_exit = self._close_compile_processes
        self._compile_process: CompilePool | None = None
        self.phase_provider: PhaseProvider | None = None  # the host's phases (see `set_phase_provider`)

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
    def counters(self) -> DraftCounters:
        """Snapshot of the worker's counters over all its states, past and present (computed
        from the counts kept where each event happens; writing to it changes nothing)."""
        log = self.reload_log
        return self._ledger.snapshot(log.succeeded, log.failed)

    def live_states(self) -> list[RuntimeState]:
        """Every state of this worker not garbage collected yet (metrics read their figures)."""
        return self._ledger.live_states()

    @property
    def spec(self) -> SpeculativeConfig:
        """The active draft shape (S, k, N)."""
        return self.slot.active.spec

    @property
    def topk(self) -> int:
        """k of the active state."""
        return self.slot.active.spec.topk

    @property
    def device(self) -> torch.device:
        """Device of buffers and graphs."""
        return torch.device(self.slot.args.device)

    @property
    def chain_capacity(self) -> int:
        """Rows of the chain buffers (see `chain_capacity`)."""
        return chain_capacity(self.slot.args)

    @property
    def chain_buffers(self) -> TopologyBuffers | None:
        """The active state's buffers when its topology is a chain (None otherwise)."""
        return self.slot.active.chain_buffers

    @property
    def topology_buffers(self) -> TopologyBuffers | None:
        """The active state's topology buffers (None for a dynamic tree)."""
        return self.slot.active.topology_buffers

    @property
    def speculative_num_steps(self) -> int:
        """S of the active state."""
        return self.slot.active.spec.num_steps

    @speculative_num_steps.setter
    def speculative_num_steps(self, value: int) -> None:
        """Raw write, as SGLang's attribute: no rebuild; the fast path and graphs then refuse the
        stale buffers (key check) until `rebuild_chain_buffers` or an override. A static tree's
        depth is fixed by its tree_choices: ValueError."""
        state = self.slot.active
        state.spec = state.spec.with_steps(value)

    @property
    def speculative_num_draft_tokens(self) -> int:
        """N of the active state."""
        return self.slot.active.spec.num_draft_tokens

    # ---- buffers and states ----------------------------------------------------------------
    def rebuild_topology_buffers(self) -> TopologyBuffers | None:
        """Give the active state the buffers of its current spec (same key: same tensors)."""
        st = self.slot.active
        with span("rebuild", num_steps=st.spec.num_steps, capacity=self.chain_capacity):
            st.topology_buffers = self._buffers_for(st.spec)
            self._ledger.events.rebuilds += 1
        return st.topology_buffers

    def rebuild_chain_buffers(self) -> TopologyBuffers | None:
        """SGLang's name (`_rebuild_topk1_chain_buffers`' worker) for `rebuild_topology_buffers`."""
        return self.rebuild_topology_buffers()

    def _buffers_for(self, spec: SpeculativeConfig, args: RuntimeArgs | None = None
                     ) -> TopologyBuffers | None:
        """Shared topology buffers for ``spec`` under ``args`` (None for a dynamic tree)."""
        topology = spec.topology
        if topology is None:
            return None
        args = args or self.slot.args
        return self._topology_cache.get(topology, chain_capacity(args), args.device)

    def _new_state(self, spec: SpeculativeConfig, capture_bs: Sequence[int] | None,
                   args: RuntimeArgs | None = None, generation: int | None = None,
                   target_only: bool = False) -> RuntimeState:
        """A complete state for ``spec`` with its buffers, counted in this worker's figures;
        graphs are captured separately. Every state is built here, after the memory check
        (`_check_budget`): ValueError, nothing allocated, when it is over the budget.
        ``target_only``: a plain target step's state (no draft graphs, no topology buffers, so
        the draft state's budget does not apply)."""
        args = args or self.slot.args
        if not target_only:
            self._check_budget(spec, capture_bs, args)
        buffers = None if target_only else self._buffers_for(spec, args)
        state = RuntimeState(spec, self._capture_sizes(capture_bs, args), buffers, self._token,
                             target_only=target_only)
        state.generation = self.slot.generation if generation is None else generation
        self._ledger.track(state)
        return state

    def _build_state(self, args: RuntimeArgs, generation: int, backend: str | None,
                     background: bool = False) -> RuntimeState:
        """`ReloadMixin`'s hook: the state for ``args`` at ``generation``, captured when ``backend``
        is given (``background``: queued, see `capture_graphs`)."""
        state = self._new_state(args.speculative, None, args=args, generation=generation)
        if backend is not None:
            if background:
                self._queue_capture(state, backend)
            else:
                self._capture_into(state, backend)
        return state

    def _check_budget(self, spec: SpeculativeConfig, capture_bs: Sequence[int] | None, args: RuntimeArgs
                      ) -> None:
        """Refuse a state whose estimated bytes exceed ``args.max_state_bytes`` (see
        `draftgraph.runtime.worker.budget`), before building anything (the size grid included)."""
        if not self.captures_graphs:
            rows = 0
        elif capture_bs is None:
            rows = largest_capture_size(args)
        else:
            sizes = self._capture_sizes(capture_bs, args)
            rows = sizes[-1] if sizes else 0
        check_state_budget(args, spec, rows, self._row_input_bytes(), limit=self.state_bytes_limit_for(args))

    @property
    def state_bytes_limit(self) -> int:
        """The operator's memory limit per state and per reload: the ``max_state_bytes`` this
        worker was constructed with (a reload file cannot raise it)."""
        return self._state_bytes_limit

    def state_bytes_limit_for(self, args: RuntimeArgs) -> int:
        """The limit that applies under ``args``: its ``max_state_bytes`` when lower than the
        operator's, else the operator's."""
        return min(args.max_state_bytes, self._state_bytes_limit)

    def check_states_budget(self, args: RuntimeArgs, specs: Sequence[SpeculativeConfig]) -> int:
        """Refuse a reload to ``args`` whose states (``specs``: every state it builds, graphs up to
        ``args``' largest capture size) need more than `state_bytes_limit_for` together
        (`draftgraph.runtime.worker.budget.check_states_budget`): ValueError, nothing allocated.
        Returns the estimated bytes."""
        rows = largest_capture_size(args) if self.captures_graphs else 0
        return check_states_budget(args, list(specs), rows, self.state_bytes_limit_for(args),
                                   self._row_input_bytes())

    def _row_input_bytes(self) -> int:
        """Bytes per row of the static graph inputs besides topk_p / topk_index (subclass hook)."""
        return 0

    def _check_reload(self, new_args: Any, policy: str) -> None:
        """`ReloadMixin`'s check plus the memory check, so an over-budget reload is refused when
        requested, before anything (release_first: the old graphs) changes."""
        super()._check_reload(new_args, policy)
        self._check_budget(new_args.speculative, None, new_args)

    @staticmethod
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

    def _spec_for(self, num_steps: int, num_draft_tokens: int | None, topk: int | None = None,
                  tree_choices: Any = None) -> SpeculativeConfig:
        """Validated spec; topk defaults to the active state's."""
        return SpeculativeConfig(num_steps, self.topk if topk is None else topk, num_draft_tokens,
                                 tree_choices)

    # ---- graphs ----------------------------------------------------------------------------
    def _graph_step(self, state: RuntimeState, max_size: int) -> GraphStep:
        """(step, static_inputs, pad_values) of one draft step of ``state``; subclasses define it."""
        raise NotImplementedError

    def _stored_code(self, state: RuntimeState, backend: str, background: bool) -> Any:
        """Where ``state``'s compiled steps are stored and loaded from (`StoredCode`), or None
        (subclass hook; the base stores nothing). ``background``: captured beside serving."""
        return None

    def _new_manager(self, state: RuntimeState, backend: str, background: bool = False) -> GraphCaptureManager:
        """An uncaptured manager of ``state``'s step, counting into ``state.replays``."""
        graph_step = self._graph_step(state, max(state.capture_sizes))
        return GraphCaptureManager(graph_step.step, graph_step.static_inputs, list(state.capture_sizes),
                                   backend=backend, pad_values=graph_step.pad_values, counters=state.replays,
                                   stored=self._stored_code(state, backend, background), share=state.capture_share)

    def set_phase_provider(self, provider: PhaseProvider | None) -> None:
        """The host's phases (target verify, draft extend; see `runtime.worker.host_phases`): every state
        captured from now on captures them beside its draft step, with the same backend and
        sizes, and swaps and releases them with it. Set it before `capture_graphs`."""
        if provider is not None and not callable(provider):
            raise TypeError(f"provider={provider!r}: must be callable (spec, max_size) -> {{name: GraphStep}}")
        self.phase_provider = provider

    def _new_phases(self, state: RuntimeState, backend: str, background: bool = False) -> PhaseGraphs | None:
        """Uncaptured managers of the host's phases for ``state`` (None without a provider or
        capture sizes). Each counts its own replays; eager steps are counted by the host.
        ``background``: captured beside serving, compiled in the compile process (as the draft
        step's units, unless ``DRAFTGRAPH_COMPILE_PROCESS=0``)."""
        provider = self.phase_provider
        if provider is None or not state.capture_sizes:
            return None
        phases = PhaseGraphs()
        compiled = resolve_backend(backend, self.device) == "compile"
        elsewhere = background and compile_process()
        spec = None if state.target_only else state.spec  # None: a step that drafts nothing
        for name, graph_step in provider(spec, max(state.capture_sizes)).items():
            stored = None
            if compiled and graph_step.constants is not None:
                stored = phase_stored_code(name, graph_step.structure, graph_step.constants,
                                           self.compile_process if elsewhere else None)
            phases.add(name, GraphCaptureManager(graph_step.step, graph_step.static_inputs,
                                                 list(state.capture_sizes), backend=backend,
                                                 pad_values=graph_step.pad_values, stored=stored,
                                                 share=state.capture_share))
        return phases

    @staticmethod
    def _install_phases(state: RuntimeState, phases: PhaseGraphs | None) -> None:
        """Swap ``phases`` into ``state`` (captured for its spec), releasing the old ones."""
        if phases is None:
            return
        old, state.phases, state.phase_spec = state.phases, phases, state.spec
        if old is not None:
            old.release()

    def _capture_phases(self, state: RuntimeState, backend: str) -> None:
        """Capture the host's phases of ``state``, each on its own: a phase whose capture fails
        serves eager ("capture_failed", logged) and the others, the draft step's included, serve
        their graphs."""
        phases = self._new_phases(state, backend)
        if phases is None:
            return
        for name, manager in list(phases.managers.items()):
            try:
                manager.capture()
            except GraphCaptureError as exc:
                logger.warning("phase %r of %r: capture failed, it serves eager: %s", name, state, exc)
                phases.failed[name] = str(exc)
                del phases.managers[name]
                continue
            for size in manager.captured_sizes:
                phases.figures[name].add_size(manager, size)
        self._install_phases(state, phases)

    def _capture_into(self, state: RuntimeState, backend: str) -> RuntimeState:
        """Capture ``state``'s graphs (the draft step, then the host's phases); on a failure of
        the draft step ``state`` keeps what it had and the error propagates."""
        if not state.capture_sizes:
            return state
        if self.captures_graphs and not state.target_only:
            manager = self._new_manager(state, backend)
            start = time.perf_counter()
            manager.capture()
            old, state.graphs, state.graph_spec = state.graphs, manager, state.spec
            if old is not None:
                old.release()
            state.capture_s = time.perf_counter() - start
            state.nodes = {s: manager.node_count(s) for s in state.capture_sizes}
            state.capture_bytes = sum(v.capture_bytes or 0 for v in manager.stats.sizes.values())
            state.compile_s = sum(v.compile_s for v in manager.stats.sizes.values())
        self._capture_phases(state, backend)
        return state

    def _queue_capture(self, state: RuntimeState, backend: str) -> RuntimeState:
        """Give ``state`` a manager whose sizes are captured later, one unit at a time (see
        `runtime.worker.capture_queue`), and the same for the host's phases (queued after the draft
        step); until a size is ready its steps run eager ("not_ready")."""
        if not state.capture_sizes:
            return state
        if self.captures_graphs and not state.target_only:
            manager = self._new_manager(state, backend, background=True)
            manager.begin()
            start = time.perf_counter()
            if manager.load_stored():  # compiled code from the store: tens of ms a size, no recording
                state.capture_s += time.perf_counter() - start
            old, state.graphs, state.graph_spec = state.graphs, manager, state.spec
            if old is not None:
                old.release()
            if manager.pending_sizes:
                self.capture_queue.add(state, manager, background_thread=manager.backend_name != "cuda",
                                       paced=not manager.compiles_elsewhere)
        phases = self._new_phases(state, backend, background=True)
        if phases is not None:
            for manager in phases.managers.values():
                manager.begin()
                manager.load_stored()  # compiled code from the store: no recording, no compile
            self._install_phases(state, phases)
            for name, manager in phases.managers.items():
                if manager.pending_sizes:
                    self.capture_queue.add(state, manager, background_thread=manager.backend_name != "cuda",
                                           paced=not manager.compiles_elsewhere, phase=name)
        return state

    def capture_graphs(self, backend: str = "auto", background: bool = False) -> RuntimeState:
        """Capture the active state's draft step, one graph per capture size; later steps replay.

        ``background=True`` queues the sizes instead (capture off the serving path): trace and
        compile units run in a background thread, CUDA units at step boundaries through
        `capture_pending`; a step whose size is not ready yet runs eager. See `graphs_ready`,
        `wait_graphs`."""
        with self.slot.lock:
            self.graph_backend = backend  # the worker's: later reloads capture with it
            if background:
                return self._queue_capture(self.slot.active, backend)
            return self._capture_into(self.slot.active, backend)

    @property
    def compile_process(self) -> CompilePool:
        """The processes that compile this worker's background captures (one, spawned at its
        first compile, off this process's interpreter lock; see `graphs.compile.worker`; more
        with `set_compile_processes`)."""
        if self._compile_process is None:
            self._compile_process = CompilePool(str(inductor_cache_dir()))
        return self._compile_process

    def set_compile_processes(self, n: int) -> None:
        """Compile in up to ``n`` processes at once (an int >= 1; default 1): more only while
        nothing is served beside them (a fill before serving), since each takes a core."""
        self.compile_process.set_size(n)

    def _close_compile_processes(self) -> None:
        if self._compile_process is not None:
            self._compile_process.close()

    def compile_process_figures(self) -> dict[str, Any] | None:
        """The compile process's counts and seconds (None when it never ran)."""
        return None if self._compile_process is None else self._compile_process.as_dict()

    def graphs_ready(self) -> bool:
        """True when no queued capture unit is pending."""
        return self.capture_queue.pending() == 0

    def wait_graphs(self, timeout_s: float | None = None) -> bool:
        """Wait until every queued unit is done (running step-boundary units here, under the
        worker's lock); False when ``timeout_s`` passed first."""
        deadline = None if timeout_s is None else time.perf_counter() + timeout_s
        queue = self.capture_queue
        while queue.pending():
            left = None if deadline is None else deadline - time.perf_counter()
            if left is not None and left <= 0:
                return False
            if queue.threaded:
                queue.wait(left)
            else:
                with self.slot.lock:
                    queue.run_one()
        return True

    def stop_capture(self, timeout_s: float | None = 60.0) -> bool:
        """Stop capturing in the background: no further unit runs (pending sizes serve eager)
        and the one in progress is waited for up to ``timeout_s``; True when none runs any more.
        The compile process (if any) ends too."""
        process = self._compile_process
        return self.capture_queue.stop(timeout_s, interrupt=process.close if process is not None else None)

    def capture_pending(self, budget_s: float) -> int:
        """Run queued units in this thread, under the worker's lock, until ``budget_s`` is spent
        (at least one when any is pending): the step-boundary capture a CUDA engine calls
        between steps. Returns how many ran."""
        with self.slot.lock:
            return self.capture_queue.run_for(budget_s)

    # ---- overrides and states --------------------------------------------------------------
    @contextmanager
    def override_worker_state(self, num_steps: int, num_draft_tokens: int | None = None,
                              capture_bs: Sequence[int] | None = None, *, topk: int | None = None,
                              tree_choices: Any = None) -> Iterator[RuntimeState]:
        """Temporarily serve (S, N) (and ``topk`` / a static tree when given): validate (nothing
        changes on error), swap in a state with its own topology buffers, yield it; on exit,
        also on error, restore the previous state object, whose buffers and graphs are
        untouched. Nests. ``capture_bs=[]`` means no graphs.
        Holds the worker's lock throughout: steps of other threads wait until it exits."""
        self._require_direct("override_worker_state")
        spec = self._spec_for(num_steps, num_draft_tokens, topk, tree_choices)
        slot = self.slot
        with slot.lock:
            with span("rebuild", num_steps=spec.num_steps, capacity=self.chain_capacity):
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
            state = self._new_state(spec, capture_bs)
            if background:
                return self._queue_capture(state, backend)
            return self._capture_into(state, backend)

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
            if background:
                return self._queue_capture(state, backend)
            return self._capture_into(state, backend)

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
