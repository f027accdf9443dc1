"""`SpecDecodeEngine`: a small, exact speculative-decoding engine with continuous batching.

One `step()` (DESIGN.md §7): admit waiting requests (prefill + draft extend); draft through a
draftgraph worker; `build_tree`; one target forward over every request's tree (tree mask);
greedy acceptance; commit the accepted K/V; draft extend over the committed tokens. Every
emitted token is the target's greedy choice, so the output equals `greedy_generate`'s.

Long-running use: a caller takes each result with `pop_result` (the engine then forgets the
request; a finished request keeps its tokens only, no tensors), `abort_request` stops a request
at the next step boundary, and a failure while admitting one request (its prefill) fails that
request alone (`RequestFailed`), returning its slot. A fault inside the batched step raises
from `step` with nothing half-committed; the next step serves the same requests.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import torch

from draftgraph.graphs import capture_batch_sizes
from draftgraph.graphs.spans import span
from draftgraph.runtime import AdaptiveStepController, ReloadError, RuntimeArgs, VerifyTree, build_tree
from draftgraph.runtime.counting import read_consistent
from draftgraph.runtime.reload import PreparedReload
from draftgraph.runtime.schedule import SpeculationSchedule
from draftgraph.runtime.stored_steps import source_counts
from draftgraph.runtime.weights import WeightRefit

from ..models.eagle_head import EagleDraftHead
from ..models.greedy import prefill
from ..models.multi_layer import MultiLayerDraft
from .acceptance import AcceptanceMonitor, AcceptanceWatch
from .drafting import KEEP_TOPK, EagleDrafter, MultiLayerDrafter
from .profile_windows import engine_step
from .requests import Request, RequestFailed
from .scheduling import BandScheduler, check_schedule, reload_state_specs
from .stats import EngineStats
from .verify import accept_greedy, verify_mask

__all__ = ["SpecDecodeEngine", "MAX_VERIFY_WIDTH"]

logger = logging.getLogger(__name__)

MAX_VERIFY_WIDTH = 32  # the widest tree (N) a reload may ask for; admission reserves room for it
DEFAULT_SLOTS = 16


CAPTURE_MODES = ("background", "blocking")
DEFAULT_WATCH = AcceptanceWatch()  # frozen: one shared default
CUDA_CAPTURE_BUDGET_S = 0.05  # step-boundary capture time per step (CUDA units)


class SpecDecodeEngine:
    """Speculative decoding of ``target`` with ``draft`` (an `EagleDraftHead` or a
    `MultiLayerDraft`) under ``args``; ``backend`` is the worker's graph backend ("auto",
    "cuda", "compile", "trace") or "eager" (no graphs). ``adaptive_steps``: candidate S values
    switched by an `AdaptiveStepController` fed the real acceptance (None: fixed S).

    ``capture="background"`` (default): the constructor queues every graph (the active state's
    sizes first, then the adaptive candidates') and returns at once; steps run eager until
    their graph is ready, counted by reason. ``"blocking"``: every graph is captured before the
    constructor returns. A reload under background capture swaps when the new state's graphs
    are ready (``swap``) or at once, serving eager meanwhile (``release_first``).

    The engine serves a **copy** of ``draft`` (it owns the copy's cache): loading weights into the
    model you passed changes nothing; use `update_draft_weights`. ``acceptance_watch``: when to
    warn that the drafter stopped helping (`AcceptanceWatch`; None: never).

    ``schedule`` (a `SpeculationSchedule`, its text form, or ``args.schedule``): S follows the
    batch size, 0 meaning a plain target decode; each band's candidates are chosen by its own
    adaptive controller (give candidates per band, ``"1:3|4|5"``, instead of ``adaptive_steps``),
    and each band's states capture only the batch sizes it can reach."""

    def __init__(self, args: RuntimeArgs, target: Any, draft: Any, backend: str = "auto",
                 adaptive_steps: Sequence[int] | None = None, eos_id: int | None = None,
                 capture: str = "background",
                 acceptance_watch: AcceptanceWatch | None = DEFAULT_WATCH,
                 schedule: SpeculationSchedule | str | None = None) -> None:
        self._t0 = time.perf_counter()
        if capture not in CAPTURE_MODES:
            raise ValueError(f"capture={capture!r}: must be one of {list(CAPTURE_MODES)}")
        if not isinstance(args, RuntimeArgs):
            raise TypeError(f"args={type(args).__name__}: must be a RuntimeArgs")
        if not (hasattr(target, "new_cache") and hasattr(target, "cfg")):
            raise TypeError(f"target={type(target).__name__}: must be a TargetModel")
        self.args = args
        self.target = target
        self.backend = backend
        self.eos_id = eos_id
        self.max_slots = args.max_running_requests or DEFAULT_SLOTS
        self.cache = target.new_cache(self.max_slots + 1)  # slot 0: the dummy slot
        draft = copy.deepcopy(draft)  # the engine owns its draft's cache
        if isinstance(draft, EagleDraftHead):
            self.drafter: EagleDrafter | MultiLayerDrafter = EagleDrafter(args, draft, self.max_slots + 1)
        elif isinstance(draft, MultiLayerDraft):
            self.drafter = MultiLayerDrafter(args, draft, self.max_slots + 1)
        else:
            raise TypeError(f"draft={type(draft).__name__}: must be an EagleDraftHead or a MultiLayerDraft")
        self._check_spec(args)
        self.worker = self.drafter.worker
        worker_weights = getattr(self.worker, "weights", None)  # the eagle worker refits its model
        self._weights = worker_weights if worker_weights is not None else WeightRefit(draft)
        self._acceptance = AcceptanceMonitor(acceptance_watch) if acceptance_watch is not None else None
        # one way in: every reload of this worker (ours, its own request_reload, a signal
        # handler's) is taken at our step boundary and checked against our limits when asked
        self.worker.attach_host("a SpecDecodeEngine")
        self.worker.add_args_check(self._check_spec)
        if isinstance(schedule, str):
            schedule = SpeculationSchedule.parse(schedule)
        self._schedule: SpeculationSchedule | None = schedule if schedule is not None else args.schedule
        if self._schedule is not None:
            if adaptive_steps:
                raise ValueError(f"adaptive_steps={list(adaptive_steps)} and schedule="
                                 f"{self._schedule.text()!r}: give the candidates per band in the "
                                 f"schedule (\"1:3|4|5\") instead")
            self._check_schedule(args)
            self.worker.add_args_check(self._check_schedule)
        self.capture = capture
        self._background = capture == "background" and backend != "eager"
        self._prepared: PreparedReload | None = None  # a reload waiting for its graphs
        if backend != "eager":
            if self._schedule is None:
                self.worker.capture_graphs(backend, background=self._background)
            else:  # the band states capture their own sizes; the active state none
                self.worker.graph_backend = backend
        self._adaptive_steps = tuple(adaptive_steps) if adaptive_steps else ()
        self.worker.add_args_check(self._check_reload_memory)
        self.coordinator: Any = None
        self._generation_seen = self.worker.generation
        self.controller: AdaptiveStepController | None = None
        self.scheduler: BandScheduler | None = None
        self._rebuild_adaptive()
        self._stats = EngineStats()
        self._next_id = 0
        self._waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._live: dict[int, Request] = {}  # waiting or running, by id
        self._finished: dict[int, Request] = {}  # ended, not yet taken by pop_result
        self._just_finished: list[int] = []  # ids that ended in the current step
        self._aborts: set[int] = set()  # applied at the next step boundary
        # guards _live, _finished and _aborts against another thread's abort_request,
        # result or pop_result while a request ends (held for a few dict operations)
        self._requests_lock = threading.Lock()
        self._free = list(range(self.max_slots, 0, -1))
        self.served: list[int] = []  # generation served at every step (with a coordinator)
        self.step_index = 0  # step() calls so far: the next step's index (profiling windows, ranges)
        self.profiler: Any = None  # a StepProfiler (step_profiler.py) while one is attached
        self.startup_s = time.perf_counter() - self._t0  # construction to the first servable step

    def attach_coordinator(self, coordinator: Any) -> None:
        """Serve under a `RankCoordinator` (several ranks): its `step()` runs at every step
        boundary, reloads are proposed through it and adaptive switches take rank 0's choice."""
        self.coordinator = coordinator
        self._release_adaptive()
        self._rebuild_adaptive()

    # ---- configuration -----------------------------------------------------------------------
    def _check_spec(self, args: RuntimeArgs) -> None:
        spec = args.speculative
        if spec.topk > KEEP_TOPK:
            raise ValueError(f"speculative.topk={spec.topk}: the engine keeps {KEEP_TOPK} candidates")
        if spec.num_draft_tokens > MAX_VERIFY_WIDTH:
            raise ValueError(f"speculative.num_draft_tokens={spec.num_draft_tokens}: the engine "
                             f"verifies at most {MAX_VERIFY_WIDTH} tokens per request")

    def _check_schedule(self, args: RuntimeArgs) -> None:
        """The schedule served under ``args`` (its own, else the engine's) must fit its spec and
        the drafter: ValueError naming the band and the rule."""
        schedule = args.schedule or self._schedule
        if schedule is not None:
            layers = getattr(getattr(self.drafter, "draft_model", None), "max_steps", None)
            check_schedule(schedule, args.speculative, layers)

    def _check_reload_memory(self, args: RuntimeArgs) -> None:
        """Every state a reload to ``args`` builds (its own, the adaptive or band candidates),
        summed, within the operator's memory limit: ValueError before any is built."""
        self.worker.check_states_budget(args, reload_state_specs(
            args.speculative, self._adaptive_steps, args.schedule or self._schedule))

    def _scheduled(self, args: RuntimeArgs) -> bool:
        """True when a schedule will serve ``args`` (its band states capture; the args' own
        state needs no graphs)."""
        return args.schedule is not None or self._schedule is not None

    def _release_adaptive(self) -> None:
        """Release the adaptive controller's or the schedule's states not active now."""
        if self.controller is not None:
            self.controller.release()
        if self.scheduler is not None:
            self.scheduler.release()

    def _rebuild_adaptive(self) -> None:
        """A controller (adaptive_steps) or a band scheduler (schedule) for what the worker
        serves now (after construction, a reload, a coordinator attached)."""
        if self.args.schedule is not None:
            self._schedule = self.args.schedule
        if self._schedule is None:
            self.controller = self._new_controller()
            return
        grid = capture_batch_sizes(self.args.decode, limit=self.args.max_running_requests) \
            if self.args.decode.max_bs is not None or self.args.decode.bs is not None else []
        self.scheduler = BandScheduler(self.worker, self._schedule, grid,
                                       None if self.backend == "eager" else self.backend,
                                       background=self._background, coordinator=self.coordinator)

    def _new_controller(self) -> AdaptiveStepController | None:
        if not self._adaptive_steps:
            return None
        spec = self.worker.spec
        if spec.tree_choices is not None:  # a static tree's depth is part of its shape: fixed S
            return None
        cands: list[Any] = list(self._adaptive_steps) if spec.is_chain else [
            (s, spec.num_draft_tokens) for s in self._adaptive_steps
            if spec.num_draft_tokens - 1 <= spec.topk + (s - 1) * spec.topk ** 2]
        if not cands:
            return None
        capture = [] if self.backend == "eager" else None
        backend = "auto" if self.backend == "eager" else self.backend
        return AdaptiveStepController(self.worker, cands, capture_bs=capture, backend=backend,
                                      coordinator=self.coordinator, background=self._background)

    def request_reload(self, new_args: RuntimeArgs, policy: str = "swap") -> None:
        """Check now, with every check construction runs (the drafter's limits, the engine's,
        the memory budget): a reload that cannot be served raises ValueError / TypeError here
        and nothing is left pending. Applied at the start of the next step (safe from a signal
        handler); a newer request supersedes one not yet applied (counted and logged). The
        worker's own `request_reload` (e.g. `install_reload_signal(engine.worker, ...)`) is
        the same way in."""
        self.worker.check_reload(new_args, policy)
        if self.coordinator is not None:
            self.coordinator.propose_reload(new_args, policy)
            return
        self.worker.request_reload(new_args, policy)

    def update_draft_weights(self, state_dict: Any, *, strict: bool = True) -> int:
        """Refit the draft: check every tensor of ``state_dict`` now (keys, shapes, dtypes,
        devices, finite values: ValueError / TypeError naming the key, nothing changed), then
        copy it **in place** into the engine's draft at the next step boundary, so parameter
        addresses never move and every captured graph (trace, compile, CUDA) stays valid with no
        recapture. Safe from another thread or a signal handler, like `request_reload`; requests
        in flight keep going. Values above `MAX_ABS_WEIGHT` are refused (a finite 1e38 would
        overflow the draft); every applied update resets the draft's carried state (its cache:
        free slots zeroed, non-finite values cleared; the requests' draft inputs likewise), so
        one bad update cannot outlive the next good one. ``strict=False`` updates a subset of
        the keys (at least one: a state dict that shares none is refused). Returns the weights
        version the draft has once it is applied (``stats()["draft_weights"]``)."""
        return self._weights.request(state_dict, strict)

    def _take_reload(self) -> None:
        """At the step boundary: apply the worker's pending reload request, or with several
        ranks propose it to every rank."""
        pending = self.worker.take_reload_request()
        if pending is None:
            return
        if self.coordinator is None:
            with span("apply_reload"):
                self._apply_reload(*pending)
            return
        log = self.worker.reload_log
        try:
            self.coordinator.propose_reload(*pending)
        except Exception as exc:  # another proposal in flight: this one is not applied
            log.record(pending[1], time.perf_counter(), ok=False, error=repr(exc))
            self._reload_rejected(exc)
        else:
            log.requested -= 1  # the coordinator's prepare counts it again, on every rank

    def _apply_reload(self, new_args: RuntimeArgs, policy: str) -> None:
        if self._background:
            self._prepare_reload(new_args, policy)
            return
        self._release_adaptive()
        try:
            prepared = self.worker.prepare_reload(new_args, policy, requested=True,
                                                  graphs=not self._scheduled(new_args))
        except (ReloadError, ValueError) as exc:
            self._reload_rejected(exc)
            self._rebuild_adaptive()
        else:
            self._commit_reload(prepared)

    def _reload_rejected(self, exc: BaseException) -> None:
        logger.error("reload rejected, the previous state keeps serving: %s", exc)
        self._stats.record_reload({"ok": False, "error": str(exc)})

    def _reload_done(self, new_args: RuntimeArgs) -> None:
        self.args = new_args
        self._generation_seen = self.worker.generation
        self._stats.record_reload({"ok": True, **self.worker.reload_history[-1]})
        self._rebuild_adaptive()

    def _prepare_reload(self, new_args: RuntimeArgs, policy: str) -> None:
        """Background capture: build the new state with queued graphs; ``release_first`` swaps
        now (eager until ready), ``swap`` when they are ready (`_commit_prepared`)."""
        if self._prepared is not None:  # a newer request supersedes one still capturing
            self.worker.discard_reload(self._prepared, f"superseded by a reload to {new_args.speculative}",
                                       superseded=True)
            self._prepared = None
        if policy == "release_first":
            self._release_adaptive()
        try:
            prepared = self.worker.prepare_reload(new_args, policy, self.backend, background=True,
                                                  requested=True, graphs=not self._scheduled(new_args))
        except (ReloadError, ValueError) as exc:
            self._reload_rejected(exc)
            if policy == "release_first":
                self._rebuild_adaptive()
            return
        if policy == "release_first":
            self._commit_reload(prepared)
        else:
            self._prepared = prepared

    def _commit_reload(self, prepared: PreparedReload) -> None:
        self._release_adaptive()
        try:
            self.worker.commit_reload(prepared)
        except ReloadError as exc:
            self.worker.discard_reload(prepared, str(exc))
            self._reload_rejected(exc)
            self._rebuild_adaptive()
        else:
            self._reload_done(prepared.args)

    def _commit_prepared(self) -> None:
        """At a step boundary: swap in a prepared reload whose graphs are all ready (or drop it
        when one of its captures failed: build-then-swap stays transactional)."""
        prepared = self._prepared
        if prepared is None or not prepared.ready:
            return
        self._prepared = None
        failed = prepared.failed_sizes
        if failed:
            reason = f"capture failed at sizes {sorted(failed)}: {next(iter(failed.values()))}"
            self.worker.discard_reload(prepared, reason)
            self._reload_rejected(ReloadError(reason))
            return
        self._commit_reload(prepared)

    # ---- requests ------------------------------------------------------------------------------
    def add_request(self, prompt_ids: Sequence[int], max_new_tokens: int) -> int:
        """Queue a request; returns its id. Ids must be ints in [0, vocab)."""
        v, limit = self.target.cfg.vocab_size, self.target.cfg.max_len
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens!r}: must be an int >= 1")
        ids = list(prompt_ids)
        if not ids:
            raise ValueError("prompt_ids=[]: a prompt needs at least one token")
        for i, t in enumerate(ids):
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < v:
                raise ValueError(f"prompt_ids[{i}]={t!r}: token ids must be ints in [0, {v})")
        if len(ids) + max_new_tokens + MAX_VERIFY_WIDTH > limit:
            raise ValueError(f"prompt of {len(ids)} + max_new_tokens={max_new_tokens}: must leave "
                             f"{MAX_VERIFY_WIDTH} positions of max_len={limit} for the verify tree")
        with self._requests_lock:
            rid = self._next_id
            self._next_id += 1
            req = Request(rid, ids, max_new_tokens)
            self._live[rid] = req
            self._waiting.append(req)
        return rid

    @property
    def tokens_generated(self) -> int:
        """Tokens emitted since the engine was built or its stats were reset."""
        return self._stats.snapshot(since_mark=True)["tokens_generated"]

    def has_work(self) -> bool:
        return bool(self._waiting or self.running)

    def next_batch_size(self) -> int:
        """The batch the next step would serve if no request ends or is aborted before it: the
        running requests plus the waiting ones admission has free slots for."""
        return len(self.running) + min(len(self._waiting), len(self._free))

    def result(self, rid: int) -> list[int]:
        """Tokens generated so far for ``rid`` (waiting, running, or ended and not yet taken);
        RequestFailed for a failed request, KeyError for an unknown or taken id."""
        with self._requests_lock:
            req = self._finished.get(rid) or self._live.get(rid)
            if req is None:
                raise KeyError(f"request id {rid!r}: unknown (never added, or taken by pop_result)")
        self._raise_failed(req)
        return list(req.output)

    def pop_result(self, rid: int) -> list[int] | None:
        """Take the tokens of ended request ``rid`` (finished, or aborted: its tokens so far);
        the engine then forgets it. None while it is waiting or running. RequestFailed (the
        cause chained) for a failed request, which is then forgotten too; KeyError for an
        unknown id or one already taken."""
        with self._requests_lock:
            req = self._finished.pop(rid, None)
            if req is None:
                if rid in self._live:
                    return None
                raise KeyError(f"request id {rid!r}: unknown (never added, or taken by pop_result)")
        self._raise_failed(req)
        return req.output

    def abort_request(self, rid: int) -> bool:
        """Stop request ``rid`` at the next step boundary: a waiting one is never admitted, a
        running one frees its slot (and K/V rows); its tokens so far stay for `pop_result`.
        True when it was waiting or running, False when it had already ended; KeyError for an
        unknown or taken id. Safe from another thread, also against a request ending at that
        moment (False: already finished); a request ending in the step that is running when the
        abort is asked finishes normally (True was returned, the abort finds it ended)."""
        with self._requests_lock:
            if rid in self._finished:
                return False
            if rid not in self._live:
                raise KeyError(f"request id {rid!r}: unknown (never added, or taken by pop_result)")
            self._aborts.add(rid)
        return True

    @staticmethod
    def _raise_failed(req: Request) -> None:
        if req.error is not None:
            err = req.error
            raise RequestFailed(req.rid, f"request id {req.rid}: failed while admitting it "
                                         f"({type(err).__name__}: {err})") from err

    def _apply_aborts(self) -> None:
        """End the requests `abort_request` asked for (at a step boundary)."""
        with self._requests_lock:
            aborts, self._aborts = self._aborts, set()
        for rid in aborts:
            req = self._live.get(rid)
            if req is None:  # ended meanwhile
                continue
            if req.slot < 0:
                self._waiting.remove(req)
            else:
                self.running.remove(req)
            req.aborted = req.done = True
            self._stats.add("requests_aborted")
            self._end(req)

    @torch.no_grad()
    def _admit(self) -> None:
        """Prefill waiting requests into free slots. A failure of one request's prefill (target
        or drafter) returns its slot and fails that request alone; an interrupt (a
        BaseException that is not an Exception) puts the request back at the head of the
        queue, its slot freed, and propagates."""
        while self._waiting and self._free:
            req = self._waiting.popleft()
            req.slot = self._free.pop()
            try:
                logits, hidden = prefill(self.target, self.cache, req.slot, req.prompt)
                req.seq_len = len(req.prompt)
                req.bonus = int(logits[-1].argmax())
                req.emit([req.bonus], self.eos_id)
                if not req.done:
                    self.drafter.prefill(req, hidden)
            except BaseException as exc:
                self._free.append(req.slot)
                req.slot, req.seq_len, req.bonus, req.done = -1, 0, -1, False
                req.output.clear()
                req.release()
                if not isinstance(exc, Exception):
                    self._waiting.appendleft(req)
                    raise
                self._fail(req, exc)
                continue
            self._stats.add("tokens_generated", len(req.output))
            if req.done:
                self._finish(req)
            else:
                self.running.append(req)

    def _fail(self, req: Request, exc: Exception) -> None:
        """Mark ``req`` failed by ``exc`` (logged with its traceback, then kept without it)."""
        logger.error("request %d failed while admitting it; the engine serves the others",
                     req.rid, exc_info=exc)
        cause: BaseException | None = exc
        while cause is not None:  # the tracebacks hold the failing frames and their tensors
            cause.__traceback__ = None
            cause = cause.__cause__ or cause.__context__
        req.error = exc
        req.done = True
        self._stats.add("requests_failed")
        self._end(req)

    def _finish(self, req: Request) -> None:
        self._stats.add("requests_finished")
        self._end(req)

    def _end(self, req: Request) -> None:
        """Move an ended request from live to finished: its slot freed, its tensors dropped."""
        if req.slot >= 0:
            self._free.append(req.slot)
        req.slot = -1
        req.release()
        with self._requests_lock:  # one move: another thread sees it live or finished, never neither
            self._finished[req.rid] = req
            self._live.pop(req.rid, None)
        self._just_finished.append(req.rid)

    # ---- the step ------------------------------------------------------------------------------
    def step(self) -> list[int]:
        """One engine step; returns the ids of requests that ended in it (finished, aborted or
        failed: take them with `pop_result`). A ``step`` range (profile_windows.py) holds one
        range per stage of ``stats()["stage_s"]``."""
        slot = self.worker.slot
        slot.enter_step()  # reloads of our worker may run in this thread, now
        try:
            return engine_step(self, self._step)
        finally:
            slot.leave_step()

    def _boundary(self) -> None:
        """Between steps: draft weights, reloads (requested, prepared, coordinated), step-boundary
        capture, and the engine following whatever its worker now serves."""
        if self._weights.pending:
            with self.worker.slot.lock, span("update_draft_weights"):
                if self._weights.apply_pending():
                    self.drafter.reset_carried_state(self.running)
        self._take_reload()
        if self._prepared is not None:
            with span("commit_reload") if self._prepared.ready else contextlib.nullcontext():
                self._commit_prepared()
        queue = self.worker.capture_queue
        if self._background and not queue.threaded and queue.pending():
            self.worker.capture_pending(CUDA_CAPTURE_BUDGET_S)  # CUDA: units at step boundaries
        if self.coordinator is not None:
            self.served.append(self.coordinator.step())
        if self.worker.generation != self._generation_seen:  # reloaded outside _apply_reload
            self._generation_seen = self.worker.generation
            self.args = self.worker.args
            self._release_adaptive()
            self._rebuild_adaptive()

    @torch.no_grad()
    def _step(self) -> list[int]:
        st = self._stats
        self._just_finished = []
        self._boundary()
        if self._aborts:
            self._apply_aborts()
        with st.timed("admit"):
            self._admit()
        reqs = self.running
        if not reqs:
            return sorted(self._just_finished)
        # a schedule's band at S=0: a plain target decode, one token per request
        off = self.scheduler is not None and self.scheduler.begin_step(len(reqs)) == 0
        spec = self.worker.spec
        b, n = len(reqs), 1 if off else spec.num_draft_tokens
        dev = self.cache.k[0].device
        if not off:
            with st.timed("draft"):
                parent_list, top_idx, draft_tokens = self.drafter.draft(reqs)
        with st.timed("build_tree"):
            lens = torch.tensor([r.seq_len for r in reqs], device=dev)
            bonus = torch.tensor([r.bonus for r in reqs], device=dev)
            tree = _root_only_tree(bonus, lens) if off else build_tree(
                bonus, parent_list, top_idx, draft_tokens, lens, spec.layout_topk, spec.num_steps, n)
        with st.timed("verify"):
            slots = torch.tensor([r.slot for r in reqs], device=dev)
            write = lens[:, None] + torch.arange(n, device=dev)[None]
            mask = verify_mask(tree, lens, int(lens.max()) + n)
            logits, hidden = self.target(tree.tokens.view(b, n), tree.positions.view(b, n), write,
                                         slots, mask, self.cache)
        with st.timed("accept_commit"):
            acc = accept_greedy(tree, logits.argmax(-1))
            emitted = self._commit(reqs, acc)
        st.count_verify(b, n, not off, [len(p) for p in acc.paths], emitted)
        if self._acceptance is not None and not off:
            self._acceptance.observe(sum(len(p) for p in acc.paths) / b, self._weights.version)
        with st.timed("extend"):
            alive = [i for i, r in enumerate(reqs) if not r.done]
            if alive:
                self.drafter.extend(reqs, hidden, acc, lens.tolist(), alive)
        for r in reqs:
            if r.done:
                self._finish(r)
        self.running = [r for r in reqs if not r.done]
        if self.controller is not None:
            with st.timed("adapt"):
                self.controller.step(sum(len(p) - 1 for p in acc.paths) / b)
        elif self.scheduler is not None and not off:
            with st.timed("adapt"):
                self.scheduler.observe(sum(len(p) - 1 for p in acc.paths) / b)
        return sorted(self._just_finished)

    def _commit(self, reqs: list[Request], acc: Any) -> int:
        """Move accepted K/V to consecutive positions, advance seq_len, emit tokens; returns
        the tokens emitted (counted with the step's other figures by the caller)."""
        slots, src, dst = [], [], []
        emitted = 0
        for r, path, toks in zip(reqs, acc.paths, acc.tokens):
            for depth, node in enumerate(path):
                if node != depth:
                    slots.append(r.slot)
                    src.append(r.seq_len + node)
                    dst.append(r.seq_len + depth)
            r.seq_len += len(path)
            r.bonus = toks[-1]
            r.verify_steps += 1
            r.accepted += len(path)
            before = len(r.output)
            r.emit(toks, self.eos_id)
            emitted += len(r.output) - before
        if slots:
            dev = self.cache.k[0].device
            self.cache.move(torch.tensor(slots, device=dev), torch.tensor(src, device=dev),
                            torch.tensor(dst, device=dev))
        return emitted

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
        """Generate for every prompt (continuous batching); outputs in prompt order, each taken
        with `pop_result` (the engine keeps none). RequestFailed (the first) after all are
        taken when a request failed."""
        ids = [self.add_request(p, max_new_tokens) for p in prompts]
        while self.has_work():
            self.step()
        outs: list[list[int]] = []
        failed: RequestFailed | None = None
        for i in ids:
            try:
                outs.append(self.pop_result(i))
            except RequestFailed as exc:
                failed = failed or exc
        if failed is not None:
            raise failed
        return outs

    # ---- report --------------------------------------------------------------------------------
    def reset_stats(self) -> None:
        """Start the engine's figures in `stats` afresh (tokens, steps, acceptance, stage
        seconds, recent reloads), e.g. after a warm-up; the worker's counters and the requests
        are left as they are. The exported Prometheus counters keep rising (a counter never
        goes down within a process): they are totals for the life of the engine."""
        self._stats.mark()

    def stats(self) -> dict[str, Any]:
        """Engine figures plus the worker's counters and per-state statistics. Safe from any
        thread (a metrics scrape while serving): the engine's figures are one snapshot taken
        under their lock, the worker's are re-read when a step changed them mid-read."""
        return read_consistent(self._read_stats)

    def _read_stats(self) -> dict[str, Any]:
        c = self.worker.counters.as_dict()
        snap = self._stats.snapshot(since_mark=True)  # one consistent copy (safe from any thread)
        recent = snap.pop("reloads")
        out = snap
        out.update(graph_replays=c["graph_replays"], eager_fallbacks=c["graph_eager_fallbacks"],
                   eager_steps=c["eager_steps"], fast_path_hits=c["fast_path_hits"],
                   worker=c, spec=list(self.worker.spec.key), backend=self.backend,
                   steps_per_state=dict(self.controller.steps_per_state) if self.controller else {},
                   schedule=self.scheduler.as_dict() if self.scheduler is not None else None,
                   state=self.worker.state.describe(), **self.startup())
        # totals for the life of the worker, records of the latest reloads only
        out["reloads"] = {**self.worker.reload_log.totals(), "recent": recent}
        out["draft_weights"] = self._weights.as_dict()
        out["acceptance_watch"] = self._acceptance.as_dict() if self._acceptance is not None else None
        return out

    def close(self, timeout_s: float | None = 60.0) -> bool:
        """Stop background capture (waiting up to ``timeout_s``, never longer, for a unit in
        progress; pending units are cancelled, counted failed); the engine keeps serving, eager
        where graphs are missing. True when no capture runs any more; False (and a warning)
        when a unit still runs after the timeout: its daemon thread is left behind."""
        return self.worker.stop_capture(timeout_s)

    def startup(self) -> dict[str, Any]:
        """Start-up as a user feels it: ``startup_s`` (construction to the first servable step),
        ``graphs_ready_s`` (construction until no capture unit is pending; None while some are),
        ``capture_s`` / ``compile_s`` (totals over every state: capture includes compile),
        ``states`` (per state: S, k, N, capture and compile seconds, sizes ready / pending /
        failed), ``eager_steps_by_reason``, the queued units run and failed so far, and where the
        live graphs came from (`runtime.stored_steps.source_counts`: compiled, loaded from the
        compiled-code store, shared)."""
        states = self._states()
        queue = self.worker.capture_queue
        idle = queue.idle_since if queue.pending() == 0 else None
        # units loaded from the compiled-code store are ready when construction ends
        ready = None if idle is None else max(getattr(self, "startup_s", 0.0), idle - self._t0)
        return {
            "capture": self.capture,
            "startup_s": self.startup_s,
            "graphs_ready_s": ready if self.backend != "eager" else 0.0,
            "capture_s": sum(s.capture_s for s in states),
            "compile_s": sum(s.compile_s for s in states),
            "states": [_describe_capture(s) for s in states],
            "eager_steps_by_reason": dict(self.worker.counters.eager_steps_by_reason),
            "capture_units_run": queue.units_run, "capture_units_failed": queue.units_failed,
            "capture_units_cancelled": queue.units_cancelled,
            **source_counts(states, self.worker.compile_process_figures()),
        }

    def _states(self) -> list[Any]:
        """The active state, the adaptive candidates and a reload being prepared (no repeats)."""
        found = [self.worker.state]
        if self.controller is not None:
            found += list(self.controller.states.values())
        if self.scheduler is not None:
            found += self.scheduler.states()
        if self._prepared is not None:
            found.append(self._prepared.state)
        out: list[Any] = []
        for s in found:
            if all(s is not o for o in out):
                out.append(s)
        return out


def _root_only_tree(bonus: torch.Tensor, lens: torch.Tensor) -> VerifyTree:
    """The verify tree of a step without speculation: each request's bonus token alone (N=1)."""
    b = bonus.shape[0]
    none = torch.full((b, 1), -1, dtype=torch.long, device=bonus.device)
    return VerifyTree(tokens=bonus.clone(), positions=lens.clone(), parents=none,
                      tree_mask=torch.ones(b, 1, 1, dtype=torch.bool, device=bonus.device),
                      retrieve_index=torch.arange(b, device=bonus.device)[:, None],
                      retrieve_next_token=none, retrieve_next_sibling=none)


def _describe_capture(state: Any) -> dict[str, Any]:
    """One state's capture figures for `SpecDecodeEngine.startup`."""
    graphs = state.graphs
    ready = list(graphs.captured_sizes) if graphs is not None else []
    pending = list(graphs.pending_sizes) if graphs is not None else []
    failed = sorted(graphs.failed_sizes) if graphs is not None else []
    spec = state.spec
    return {"num_steps": spec.num_steps, "topk": spec.topk, "num_draft_tokens": spec.num_draft_tokens,
            "capture_s": state.capture_s, "compile_s": state.compile_s, "sizes_ready": ready,
            "sizes_pending": pending, "sizes_failed": failed}
