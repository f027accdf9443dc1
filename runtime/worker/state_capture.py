"""Graph building and capture for a worker's states: one collaborator the worker holds.

`StateCapture` makes a state's graph managers (the draft step's, from the worker's
``graph_step(state, max_size)`` hook, and the host's phases, from its `PhaseProvider`) and
captures them: now (`capture`, blocking) or queued (`enqueue`, one (state, size) unit at a time,
see `runtime.worker.capture_queue`). It owns what capture needs beside a state: the queue, the
compile processes of background compiles, the host's phase provider and the worker's backend.

What a backend can do is asked of the backend (`backend_class(...).compiles_code`), never
decided by comparing its name. Capture runs under the worker's lock (the slot's), so a step
never replays a half-published state.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from draftgraph.graphs import GraphCaptureError, GraphCaptureManager, resolve_backend
from draftgraph.graphs.backends import backend_class
from draftgraph.graphs.compile.inductor import inductor_cache_dir
from draftgraph.graphs.compile.pool import CompilePool
from draftgraph.runtime.settings import compile_process
from draftgraph.runtime.worker.capture_queue import MAX_THREADS, CaptureQueue
from draftgraph.runtime.worker.host_phases import PhaseGraphs, PhaseProvider
from draftgraph.runtime.worker.kind import WorkerKind
from draftgraph.runtime.worker.state import RuntimeState
from draftgraph.runtime.worker.state_slot import StateSlot
from draftgraph.runtime.worker.stored_steps import phase_stored_code

__all__ = ["StateCapture"]

logger = logging.getLogger(__name__)


class StateCapture:
    """Builds and captures the graphs of one worker's states.

    ``kind`` (the worker's `WorkerKind`) gives the draft step (`WorkerKind.graph_step`; none
    when it ``captures_graphs`` not: only the host's phases are captured) and where a compiling
    backend stores and loads that step's code (`WorkerKind.stored_code`, given the compile
    processes, or None to compile here), both for the args the slot serves."""

    def __init__(self, slot: StateSlot, kind: WorkerKind) -> None:
        self._slot = slot
        self._kind = kind
        self._captures_step = kind.captures_graphs  # a draft step to capture
        self.queue = CaptureQueue(lambda: slot.active)
        self.queue.interrupt_at_exit = self._close_compile_processes
        self._compile_process: CompilePool | None = None
        self.phase_provider: PhaseProvider | None = None  # the host's phases (`set_phase_provider`)
        self.backend: str | None = None  # the worker's: later reloads capture with it

    # ---- the host's phases -------------------------------------------------------------------
    def set_phase_provider(self, provider: PhaseProvider | None) -> None:
        """The host's phases (target verify, draft extend; see `runtime.worker.host_phases`): every
        state captured from now on captures them beside its draft step, with the same backend and
        sizes, and swaps and releases them with it. Set it before the first capture."""
        if provider is not None and not callable(provider):
            raise TypeError(f"provider={provider!r}: must be callable (spec, max_size) -> {{name: GraphStep}}")
        self.phase_provider = provider

    def _compiles(self, backend: str) -> bool:
        """True when ``backend`` compiles code (its stored code then applies)."""
        return backend_class(resolve_backend(backend, torch.device(self._slot.args.device))).compiles_code

    def _new_manager(self, state: RuntimeState, backend: str, background: bool) -> GraphCaptureManager:
        """An uncaptured manager of ``state``'s draft step, counting into ``state.replays``."""
        assert self._captures_step
        args = self._slot.args
        graph_step = self._kind.graph_step(state, max(state.capture_sizes), args)
        stored = None
        if self._compiles(backend):
            compiler = self.compile_process if background and compile_process() else None
            stored = self._kind.stored_code(state, compiler, args)
        return GraphCaptureManager(graph_step.step, graph_step.static_inputs, list(state.capture_sizes),
                                   backend=backend, pad_values=graph_step.pad_values, counters=state.replays,
                                   stored=stored, share=state.capture_share)

    def _new_phases(self, state: RuntimeState, backend: str, background: bool = False) -> PhaseGraphs | None:
        """Uncaptured managers of the host's phases for ``state`` (None without a provider or
        capture sizes). Each counts its own replays; eager steps are counted by the host.
        ``background``: compiled in the compile process (unless ``DRAFTGRAPH_COMPILE_PROCESS=0``)."""
        provider = self.phase_provider
        if provider is None or not state.capture_sizes:
            return None
        phases = PhaseGraphs()
        compiles = self._compiles(backend)
        elsewhere = background and compile_process()
        spec = None if state.target_only else state.spec  # None: a step that drafts nothing
        for name, graph_step in provider(spec, max(state.capture_sizes)).items():
            stored = None
            if compiles and graph_step.constants is not None:
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

    @staticmethod
    def _install_draft(state: RuntimeState, manager: GraphCaptureManager) -> None:
        """Swap ``manager`` in as ``state``'s draft graphs (for its spec), releasing the old one."""
        old, state.graphs, state.graph_spec = state.graphs, manager, state.spec
        if old is not None:
            old.release()

    # ---- capture -----------------------------------------------------------------------------
    def build(self, state: RuntimeState, backend: str, background: bool) -> RuntimeState:
        """`enqueue` with ``background``, else `capture`."""
        return self.enqueue(state, backend) if background else self.capture(state, backend)

    def capture(self, state: RuntimeState, backend: str) -> RuntimeState:
        """Capture ``state``'s graphs now (the draft step, then the host's phases); on a failure of
        the draft step ``state`` keeps what it had and the error propagates."""
        if not state.capture_sizes:
            return state
        if self._captures_step and not state.target_only:
            manager = self._new_manager(state, backend, background=False)
            start = time.perf_counter()
            manager.capture()
            self._install_draft(state, manager)
            state.capture_s = time.perf_counter() - start
            state.nodes = {s: manager.node_count(s) for s in state.capture_sizes}
            state.capture_bytes = sum(v.capture_bytes or 0 for v in manager.stats.sizes.values())
            state.compile_s = sum(v.compile_s for v in manager.stats.sizes.values())
        self._capture_phases(state, backend)
        return state

    def enqueue(self, state: RuntimeState, backend: str) -> RuntimeState:
        """Give ``state`` a manager whose sizes are captured later, one unit at a time, and the
        same for the host's phases (queued after the draft step); until a size is ready its
        steps run eager ("not_ready")."""
        if not state.capture_sizes:
            return state
        if self._captures_step and not state.target_only:
            manager = self._new_manager(state, backend, background=True)
            manager.begin()
            start = time.perf_counter()
            if manager.load_stored():  # compiled code from the store: tens of ms a size, no recording
                state.capture_s += time.perf_counter() - start
            self._install_draft(state, manager)
            self._queue(state, manager, None)
        phases = self._new_phases(state, backend, background=True)
        if phases is not None:
            for manager in phases.managers.values():
                manager.begin()
                manager.load_stored()  # compiled code from the store: no recording, no compile
            self._install_phases(state, phases)
            for name, manager in phases.managers.items():
                self._queue(state, manager, name)
        return state

    def _queue(self, state: RuntimeState, manager: GraphCaptureManager, phase: str | None) -> None:
        """Queue ``manager``'s pending sizes: a background thread unless its backend captures at
        step boundaries only (a CUDA capture must not overlap other threads' kernels)."""
        if manager.pending_sizes:
            self.queue.add(state, manager, background_thread=not manager.capabilities.replays_on_device,
                           paced=not manager.compiles_elsewhere, phase=phase)

    # ---- the queue ---------------------------------------------------------------------------
    def ready(self) -> bool:
        """True when no queued capture unit is pending."""
        return self.queue.pending() == 0

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait until every queued unit is done (running step-boundary units here, under the
        worker's lock); False when ``timeout_s`` passed first."""
        deadline = None if timeout_s is None else time.perf_counter() + timeout_s
        queue = self.queue
        while queue.pending():
            left = None if deadline is None else deadline - time.perf_counter()
            if left is not None and left <= 0:
                return False
            if queue.threaded:
                queue.wait(left)
            else:
                with self._slot.lock:
                    queue.run_one()
        return True

    def run_pending(self, budget_s: float) -> int:
        """Run queued units in this thread, under the worker's lock, until ``budget_s`` is spent
        (at least one when any is pending): the step-boundary capture a CUDA engine calls
        between steps. Returns how many ran."""
        with self._slot.lock:
            return self.queue.run_for(budget_s)

    def stop(self, timeout_s: float | None = 60.0) -> bool:
        """Stop capturing in the background: no further unit runs (pending sizes serve eager)
        and the one in progress is waited for up to ``timeout_s``; True when none runs any more.
        The compile process (if any) ends too."""
        process = self._compile_process
        return self.queue.stop(timeout_s, interrupt=process.close if process is not None else None)

    # ---- compile processes -------------------------------------------------------------------
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
        nothing is served beside them (a fill before serving), since each takes a core. The
        queue runs as many background threads as processes (at least `MAX_THREADS`)."""
        self.compile_process.set_size(n)
        self.queue.max_threads = max(MAX_THREADS, n)

    def use_backend(self, backend: str) -> None:
        """The backend later reloads capture with (a host whose own states capture: a
        schedule's bands), without capturing anything now."""
        self.backend = backend

    def _close_compile_processes(self) -> None:
        if self._compile_process is not None:
            self._compile_process.close()

    def compile_process_figures(self) -> dict[str, Any] | None:
        """The compile process's counts and seconds (None when it never ran)."""
        return None if self._compile_process is None else self._compile_process.as_dict()
