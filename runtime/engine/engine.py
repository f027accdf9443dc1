"""`SpecDecodeEngine`: a small, exact speculative-decoding engine with continuous batching.

One `step()` (DESIGN.md §7): at the step boundary, reloads, weights and capture units
(`boundary.StepBoundary`); admit waiting requests (prefill + draft extend); then the pipeline
(`pipeline.StepPipeline`): draft through a draftgraph worker, `build_tree`, one target forward
over every request's tree (tree mask), acceptance by the request's policy (`accept_policy`: greedy,
or sampled with keyed random numbers), commit the accepted K/V, draft extend over the committed
tokens. Every emitted token is the target's own choice, so the output equals `greedy_generate`'s
(or, seeded, `sampled_generate`'s: docs/sampling.md). The batch lives on the device by slot
(`slot_state.SlotState`); the requests (`request_table.RequestTable`) keep Python bookkeeping; the step policy
(`policy.StepPolicy`) says which state serves each step; `report.EngineReport` answers for the
figures; `capture_setup` starts the graphs. This class only wires them together and is the
one door of the engine (requests, the step, reloads, weights, figures): one job, a facade.

Long-running use: a caller takes each result with `pop_result` (the engine then forgets the
request), `abort_request` stops a request at the next step boundary, and a failure while
admitting one request (its prefill) fails that request alone (`RequestFailed`), returning its
slot. A fault inside the batched step raises from `step` with nothing half-committed.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from draftgraph.runtime import RuntimeArgs, SamplingParams
from draftgraph.runtime.sampling import per_prompt
from draftgraph.runtime.schedule import SpeculationSchedule
from draftgraph.runtime.worker import DraftWorker, WeightRefit

from .acceptance import AcceptanceMonitor, AcceptanceWatch
from .boundary import StepBoundary
from .capture_choice import CaptureChoice
from .capture_setup import fill_graphs, start_capture
from .drafting import KEEP_TOPK, EagleDrafter, MultiLayerDrafter, make_drafter
from .limits import MAX_VERIFY_WIDTH, EngineLimits
from .model_seam import DraftTarget, check_members
from .pipeline import StepPipeline
from .policy import FixedPolicy
from .profiling import engine_step
from .report import EngineReport
from .request_table import RequestTable
from .requests import RequestFailed
from .scheduling import resolve_schedule
from .seeding import SeedSource
from .slot_state import SlotState
from .stats import EngineStats, accept_length

__all__ = ["SpecDecodeEngine", "MAX_VERIFY_WIDTH"]

DEFAULT_SLOTS = 16
CAPTURE_MODES = ("auto", "background", "fill", "blocking")
DEFAULT_WATCH = AcceptanceWatch()  # frozen: one shared default


class SpecDecodeEngine:
    """Speculative decoding of ``target`` (a `DraftTarget`) with ``draft`` (a `DraftHead`: a
    published EAGLE head, `Eagle1Head` / `Eagle3Head`; or a `MultiLayerDraft`) under ``args``;
    the models are checked against the protocols here (`model_seam`: a TypeError naming a missing
    member). ``backend`` is the worker's graph backend ("auto", "cuda", "compile", "trace") or
    "eager" (no graphs). ``adaptive_steps``: candidate S values
    switched by an `AdaptiveStepController` fed the real acceptance (None: fixed S).

    ``capture="background"`` (default): the constructor queues every graph (the active state's
    sizes first, then the adaptive candidates') and returns at once; steps run eager until
    their graph is ready, counted by reason. ``"blocking"``: every graph is captured before the
    constructor returns. A reload under background capture swaps when the new state's graphs
    are ready (``swap``) or at once, serving eager meanwhile (``release_first``). ``"fill"``: every
    graph is queued and waited for before the constructor returns, compiled in one process per
    usable core (`capture_choice`); ``progress(engine)`` (e.g. the CLI's bar) does the waiting
    when given. ``"auto"``: "fill" on a CPU with few cores (a capture beside serving there slows
    serving below the eager backend), else "background"; `startup` says which and why.

    The engine serves a **copy** of ``draft`` (it owns the copy's cache): loading weights into the
    model you passed changes nothing; use `update_draft_weights`. ``acceptance_watch``: when to
    warn that the drafter stopped helping (`AcceptanceWatch`; None: never).

    ``schedule`` (a `SpeculationSchedule`, its text form, or ``args.schedule``): S follows the
    batch size, 0 meaning a plain target decode; each band's candidates are chosen by its own
    adaptive controller (give candidates per band, ``"1:3|4|5"``, instead of ``adaptive_steps``),
    and each band's states capture only the batch sizes it can reach.

    ``graph_phases`` (names of `PHASE_NAMES`, "verify" and "extend"): the target verify and draft
    extend captured per state beside the draft step, one graph per size and KV window tier
    (``kv_tiers``, ascending, ending at the cache length; default `default_tiers`); None: both on
    CUDA, none on the CPU backends (docs/phases.md).

    ``sampling_seed``: seeds the generator giving an unseeded sampled request its seed (logged)."""

    def __init__(self, args: RuntimeArgs, target: DraftTarget, draft: Any, backend: str = "auto",
                 adaptive_steps: Sequence[int] | None = None, eos_id: int | None = None,
                 capture: str = "background",
                 acceptance_watch: AcceptanceWatch | None = DEFAULT_WATCH,
                 schedule: SpeculationSchedule | str | None = None,
                 graph_phases: Sequence[str] | None = None, kv_tiers: Sequence[int] | None = None,
                 progress: Callable[[SpecDecodeEngine], None] | None = None, sampling_seed: int | None = None) -> None:
        t0 = time.perf_counter()
        self.seeds = SeedSource(sampling_seed)
        if capture not in CAPTURE_MODES:
            raise ValueError(f"capture={capture!r}: must be one of {list(CAPTURE_MODES)}")
        if not isinstance(args, RuntimeArgs):
            raise TypeError(f"args={type(args).__name__}: must be a RuntimeArgs")
        check_members(target, DraftTarget, "target")  # the typed seam: a TypeError naming what is missing
        target.check_backend(backend)  # a target refusing a graph backend
        self.target = target
        self.backend = backend
        self.max_slots = args.max_running_requests or DEFAULT_SLOTS
        self.cache = target.new_cache(self.max_slots + 1)  # slot 0: the dummy slot
        draft = copy.deepcopy(draft)  # the engine owns its draft's cache
        self.drafter: EagleDrafter | MultiLayerDrafter = make_drafter(args, draft, self.max_slots + 1, target)
        schedule = resolve_schedule(schedule, args, adaptive_steps)
        adaptive = tuple(adaptive_steps) if adaptive_steps else ()
        self.worker: DraftWorker = self.drafter.worker
        limits = EngineLimits(self.worker, self.drafter.max_steps, schedule, adaptive)
        limits.check_spec(args)
        if schedule is not None:
            limits.check_schedule(args)
        limits.install()
        setup = start_capture(self.worker, target, self.cache, self.drafter, backend, capture, schedule,
                              graph_phases, kv_tiers)
        self.capture_choice: CaptureChoice = setup.choice
        self.capture = capture = setup.choice.mode  # "none" on the eager backend
        self.phases, background = setup.phases, setup.background
        # the eagle worker refits its model; the multi-layer draft is refitted here
        weights = self.worker.weights if self.worker.weights is not None else WeightRefit(draft)
        self._counts = EngineStats()
        self.slot_state = SlotState(self.max_slots + 1, self.drafter.feature_dim, KEEP_TOPK, self.cache.k[0].device)
        self.requests = RequestTable(self.max_slots, target.cfg.vocab_size, target.cfg.max_len,
                                     MAX_VERIFY_WIDTH, self._counts)
        self.boundary = StepBoundary(self.worker, weights, self._counts, args, schedule, adaptive, backend,
                                     background, self._reset_carried_state)
        limits.current_schedule = lambda: self.boundary.schedule
        self.pipeline = StepPipeline(target, self.cache, self.drafter, self.slot_state, eos_id, self._counts,
                                     self.phases)
        self.acceptance = AcceptanceMonitor(acceptance_watch) if acceptance_watch is not None else None
        self.report = EngineReport(t0, self._counts, self.boundary, self.acceptance, backend, capture)
        self.step_index = 0  # step() calls so far: the next step's index (profiling windows, ranges)
        self.profiler: Any = None  # a StepProfiler (profiling.py) while one is attached
        if capture == "fill":
            fill_graphs(self.worker, None if progress is None else lambda: progress(self))
        self.report.mark_started()

    # ---- what the engine serves ---------------------------------------------------------------
    @property
    def args(self) -> RuntimeArgs:
        """The arguments served now (they follow every reload)."""
        return self.boundary.args

    @property
    def policy(self) -> Any:
        """The step policy: which state serves each step (`policy.StepPolicy`)."""
        return self.boundary.policy

    @property
    def coordinator(self) -> Any:
        return self.boundary.coordinator

    @property
    def served(self) -> list[int]:
        """Generation served at every step (with a coordinator)."""
        return self.boundary.served

    @property
    def running(self) -> list[Any]:
        """The running requests, in batch order."""
        return self.requests.running

    @property
    def startup_s(self) -> float:
        return self.report.startup_s

    def attach_coordinator(self, coordinator: Any) -> None:
        """Serve under a `RankCoordinator` (several ranks): its `step()` runs at every step
        boundary, reloads are proposed through it and adaptive switches take rank 0's choice."""
        self.boundary.attach_coordinator(coordinator)

    def request_reload(self, new_args: RuntimeArgs, policy: str = "swap") -> None:
        """Check now, with every check construction runs (the drafter's limits, the engine's,
        the memory budget): a reload that cannot be served raises ValueError / TypeError here
        and nothing is left pending. Applied at the start of the next step (safe from a signal
        handler); a newer request supersedes one not yet applied (counted and logged). The
        worker's own `request_reload` (e.g. `install_reload_signal(engine.worker, ...)`) is
        the same way in."""
        self.worker.reloads.request(new_args, policy)  # checked there, held by our boundary

    def update_draft_weights(self, state_dict: Any, *, strict: bool = True) -> int:
        """Refit the draft: check every tensor of ``state_dict`` now (keys, shapes, dtypes,
        devices, finite values: ValueError / TypeError naming the key, nothing changed), then
        copy it **in place** into the engine's draft at the next step boundary, so parameter
        addresses never move and every captured graph (trace, compile, CUDA) stays valid with no
        recapture. Safe from another thread or a signal handler, like `request_reload`; requests
        in flight keep going. Values above `MAX_ABS_WEIGHT` are refused (a finite 1e38 would
        overflow the draft); every applied update resets the draft's carried state (its cache:
        free slots zeroed, non-finite values cleared; the carried draft inputs likewise), so
        one bad update cannot outlive the next good one. ``strict=False`` updates a subset of
        the keys (at least one: a state dict that shares none is refused). Returns the weights
        version the draft has once it is applied (``stats()["draft_weights"]``)."""
        return self.boundary.weights.request(state_dict, strict)

    def _reset_carried_state(self) -> None:
        self.drafter.reset_carried_state(self.slot_state, [r.slot for r in self.running])

    # ---- requests ------------------------------------------------------------------------------
    def add_request(self, prompt_ids: Sequence[int], max_new_tokens: int, sampling: SamplingParams | None = None
                    ) -> int:
        """Queue a request; returns its id. Ids must be ints in [0, vocab). ``sampling``: how it
        draws (None: greedy); a sampled request without a seed gets one (`SeedSource`, logged)."""
        rid = self.requests.add(prompt_ids, max_new_tokens, used := self.seeds.resolve(sampling))
        self.seeds.log(rid, sampling, used)
        return rid

    def result(self, rid: int, start: int = 0) -> list[int]:
        """Tokens generated so far for ``rid`` (waiting, running, or ended and not yet taken), from
        ``start`` on; RequestFailed for a failed request, KeyError for an unknown or taken id."""
        return self.requests.result(rid, start)

    def pop_result(self, rid: int) -> list[int] | None:
        """Take the tokens of ended request ``rid`` (then forgotten); None while it is live;
        RequestFailed (cause chained) for a failed one; KeyError for an unknown or taken id."""
        return self.requests.pop_result(rid)

    def abort_request(self, rid: int) -> bool:
        """Stop ``rid`` at the next step boundary (its tokens so far stay for `pop_result`): True
        when it was live, False when it had already ended; KeyError for an unknown or taken id.
        Safe from another thread, also against a request ending at that moment."""
        return self.requests.abort(rid)

    def has_work(self) -> bool:
        return self.requests.has_work()

    def next_batch_size(self) -> int:
        """The batch the next step would serve if no request ends or is aborted before it."""
        return self.requests.next_batch_size()

    @property
    def tokens_generated(self) -> int:
        """Tokens emitted since the engine was built or its stats were reset."""
        return self._counts.snapshot(since_mark=True)["tokens_generated"]

    # ---- the step ------------------------------------------------------------------------------
    def step(self) -> list[int]:
        """One engine step; returns the ids of requests that ended in it (take them with
        `pop_result`). A ``step`` range (profiling.py) holds one range per stage."""
        slot = self.worker.slot
        slot.enter_step()  # reloads of our worker may run in this thread, now
        try:
            index, self.step_index = self.step_index, self.step_index + 1
            return engine_step(index, self.profiler, self._step)
        finally:
            slot.leave_step()

    @torch.no_grad()
    def _step(self) -> list[int]:
        table, counts = self.requests, self._counts
        self.boundary.run()
        table.begin_step()
        with counts.timed("admit"):
            self.pipeline.admit(table)
        reqs = table.running
        if not reqs:
            return table.ended()
        policy = self.boundary.policy
        s = policy.begin(len(reqs))
        acc = self.pipeline.step(reqs, self.worker, s)
        table.retire_done()
        if s:
            accepted = sum(acc.lengths) - len(reqs)
            if self.acceptance is not None:
                first = sum(length >= 2 for length in acc.lengths)  # the first drafted token accepted
                self.acceptance.observe(accept_length(accepted, len(reqs)), self.boundary.weights.version,
                                        (first, len(reqs)))
            if not isinstance(policy, FixedPolicy):
                with counts.timed("adapt"):
                    policy.observe(accepted / len(reqs))
        return table.ended()

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 sampling: SamplingParams | Sequence[SamplingParams | None] | None = None) -> list[list[int]]:
        """Generate for every prompt (``sampling``: one for all, or one each); outputs in prompt order,
        each taken with `pop_result`. RequestFailed (the first) after all are taken if one failed."""
        ids = [self.add_request(p, max_new_tokens, s) for p, s in zip(prompts, per_prompt(sampling, len(prompts)))]
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
        are left as they are. The exported Prometheus counters keep rising."""
        self._counts.mark()

    def stats(self) -> dict[str, Any]:
        """Engine figures plus the worker's counters and per-state statistics. Safe from any
        thread (a metrics scrape while serving). ``models``: what the target and the draft say
        of themselves when they can (a transformers target's shape, a published head's format
        and the target layers it reads)."""
        out = self.report.stats()
        models = {}
        for name, model in (("target", self.target), ("draft", self.drafter.head)):
            if model is not None:  # a multi-layer draft has no head and says nothing
                models[name] = model.describe()
        if models:
            out["models"] = models
        return out

    def startup(self) -> dict[str, Any]:
        """Start-up as a user feels it (`EngineReport.startup`), and ``capture_choice``: the
        capture mode served and why (`capture_choice.CaptureChoice`)."""
        return {**self.report.startup(), "capture_choice": self.capture_choice.as_dict()}

    def close(self, timeout_s: float | None = 60.0) -> bool:
        """Stop background capture (`StateCapture.stop`: pending units
        cancelled, a unit in progress waited for up to ``timeout_s``); the engine keeps serving,
        eager where graphs are missing. False (and a warning) when a unit still runs."""
        return self.worker.capture.stop(timeout_s)
