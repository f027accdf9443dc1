"""The engine's side of a `SpeculationSchedule`: which band and which S serve each step.

Per band with speculation on, one state per candidate S, each capturing only the batch sizes its
band can reach (`band_capture_sizes`), and an `AdaptiveStepController` over those states that
picks among the band's candidates from the acceptance it observes in that band. A band at S=0
drafts nothing: its steps are plain target decodes (the engine's step builds a one-node tree),
and the drafter still extends over every committed token, so speculation resumes where it left.
With graphs, such a band has one state of its own (`build_target_state`, at the band's sizes),
holding the width-1 verify and extend phases; it is made active for the band's steps like any
band state, so a width-1 step never reads a width-N graph, nor the reverse.

Under a `RankCoordinator` the (band, S) pair is the coordinator's shared choice (the leader's
as of the latest poll), so every rank serves the same state at the same step whatever its own
batch size.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from draftgraph.graphs.spans import span
from draftgraph.runtime import AdaptiveStepController, RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.schedule import ScheduleBand, SpeculationSchedule
from draftgraph.runtime.worker import DraftWorker

__all__ = [
    "BandScheduler", "band_capture_sizes", "band_state_sizes", "check_schedule", "reload_state_specs",
    "resolve_schedule",
]

logger = logging.getLogger(__name__)

_CODE = 1000  # a shared choice encodes band * _CODE + S + 1 (S <= 64; 0 is "no choice")


def band_capture_sizes(grid: Sequence[int], band: ScheduleBand) -> list[int]:
    """The capture sizes a band can reach: the grid's sizes within [min_bs, max_bs] and the
    smallest one above max_bs when max_bs itself is not captured (its padded size)."""
    lo, hi = band.min_bs, band.max_bs
    inside = [g for g in grid if g >= lo and (hi is None or g <= hi)]
    if hi is not None and hi not in inside:
        above = [g for g in grid if g > hi]
        if above:
            inside.append(above[0])
    return sorted(set(inside))


def band_state_sizes(grid: Sequence[int], band: ScheduleBand, graphs: bool, phases: bool) -> list[int]:
    """The sizes the states of ``band`` capture: none without ``graphs`` (the eager backend); a
    band with speculation on, `band_capture_sizes`; an off band (S=0), the same sizes for its plain
    target state's width-1 verify and extend when the host captures ``phases``, else none (it has
    no draft step to capture)."""
    if not graphs or (band.off and not phases):
        return []
    return band_capture_sizes(grid, band)


def resolve_schedule(schedule: SpeculationSchedule | str | None, args: RuntimeArgs,
                     adaptive_steps: Sequence[int] | None) -> SpeculationSchedule | None:
    """The schedule an engine serves: ``schedule`` (its text form parsed), else ``args.schedule``.
    ValueError beside ``adaptive_steps``: a schedule gives its candidates per band."""
    if isinstance(schedule, str):
        schedule = SpeculationSchedule.parse(schedule)
    schedule = schedule if schedule is not None else args.schedule
    if schedule is not None and adaptive_steps:
        raise ValueError(f"adaptive_steps={list(adaptive_steps)} and schedule={schedule.text()!r}: give "
                         f"the candidates per band in the schedule (\"1:3|4|5\") instead")
    return schedule


def check_schedule(schedule: SpeculationSchedule, spec: SpeculativeConfig, max_steps: int | None) -> None:
    """Every S of every band must be servable with ``spec``'s topk / N / topology: ValueError
    naming the band and the rule. ``max_steps``: the drafter's limit (a multi-layer draft's
    layers), None for none."""
    for i, band in enumerate(schedule.bands):
        where = f"schedule band {i} ({band.label()})"
        for s in band.steps:
            if s == 0:
                continue
            if max_steps is not None and s > max_steps:
                raise ValueError(f"{where}: S={s}: the multi-layer draft has {max_steps} layers (S <= {max_steps})")
            if spec.tree_choices is not None and s != spec.num_steps:
                raise ValueError(f"{where}: S={s}: a static tree's depth is fixed at {spec.num_steps}; "
                                 f"change its topology through a reload, not the schedule")
            try:
                SpeculativeConfig(s, spec.topk, None if spec.is_chain else spec.num_draft_tokens)
            except ValueError as exc:
                raise ValueError(f"{where}: S={s} with topk={spec.topk}, "
                                 f"num_draft_tokens={spec.num_draft_tokens}: {exc}") from None


def reload_state_specs(spec: SpeculativeConfig, adaptive_steps: Sequence[int],
                       schedule: SpeculationSchedule | None) -> list[SpeculativeConfig]:
    """Every state an engine builds for a reload to ``spec``: its own, then one per schedule
    band's S (each band has its states) or per adaptive candidate (the one equal to ``spec`` is
    the reloaded state itself). For the memory budget of the whole reload."""
    if schedule is not None:
        steps = [s for band in schedule.bands for s in band.steps if s > 0]
    elif spec.tree_choices is None:
        steps = [s for s in adaptive_steps if s != spec.num_steps]
    else:
        steps = []
    specs = [spec]
    for s in steps:
        try:
            specs.append(SpeculativeConfig(s, 1) if spec.is_chain else
                         SpeculativeConfig(s, spec.topk, spec.num_draft_tokens))
        except ValueError:  # not a candidate of this spec (the engine skips it too)
            continue
    return specs


class BandScheduler:
    """Band states and controllers of one schedule on one worker (see the module docstring)."""

    def __init__(self, worker: DraftWorker, schedule: SpeculationSchedule, grid: Sequence[int], backend: str | None,
                 background: bool = False, coordinator: Any = None) -> None:
        self.worker = worker
        self.schedule = schedule
        self.bands = schedule.bands
        self.coordinator = coordinator
        spec = worker.spec
        self.controllers: list[AdaptiveStepController | None] = []
        self.targets: list[Any] = []  # per band: its plain target step's state (S=0 bands with sizes)
        self.sizes: list[list[int]] = []
        for band in self.bands:
            sizes = band_state_sizes(grid, band, backend is not None, worker.capture.phase_provider is not None)
            if band.off:  # graphs only for the host's width-1 phases
                self.sizes.append(sizes)
                self.controllers.append(None)
                self.targets.append(worker.build_target_state(sizes, backend or "auto", background=background)
                                    if sizes else None)
                continue
            self.sizes.append(sizes)
            self.targets.append(None)
            cands: list[Any] = list(band.steps) if spec.is_chain else [(s, spec.num_draft_tokens) for s in band.steps]
            self.controllers.append(AdaptiveStepController(
                worker, cands, capture_bs=sizes, backend=backend or "auto", background=background))
        self.band: int | None = None
        self.s = 0
        self.served = [0] * len(self.bands)
        self.band_switches = 0
        self.steps = 0
        self.steps_per_state: dict[str, int] = {}

    def _local(self, batch_size: int) -> tuple[int, int]:
        band = self.schedule.band_index(batch_size, self.band)
        ctrl = self.controllers[band]
        return band, (ctrl.choose() if ctrl is not None else 0)

    def begin(self, batch_size: int) -> int:
        """Take this step's band and S (0: speculation off) and make its state active."""
        band, s = self._local(batch_size)
        if self.coordinator is not None:
            band, s = self._shared(band, s)
        if self.band is not None and band != self.band:
            self.band_switches += 1
        self.band, self.s = band, s
        self.steps += 1
        self.served[band] += 1
        key = f"{self.bands[band].label()}:S={s}"
        self.steps_per_state[key] = self.steps_per_state.get(key, 0) + 1
        ctrl = self.controllers[band]
        state = ctrl.states[s] if ctrl is not None else self.targets[band]
        if state is not None and self.worker.state is not state:
            with span("adaptive_switch", num_steps=s):
                self.worker.apply_runtime_state(state)
        return s

    def _shared(self, band: int, s: int) -> tuple[int, int]:
        """The coordinator's shared (band, S) for this step; ``(band, s)`` is this rank's own pick.

        Encoded ``band * _CODE + S + 1``: a word's choice 0 means "no choice", and band 0 at
        S=0 (a band that does not speculate) must still be a choice. A code that names no state
        of this schedule (one made under another schedule) is never indexed: it is logged and
        the schedule's initial choice, equal on every rank, is served instead."""
        first = self.controllers[0]
        initial = (first.choose() if first is not None else 0) + 1
        code = self.coordinator.shared_choice(band * _CODE + s + 1, initial=initial)
        band, s = divmod(code - 1, _CODE)
        if self._servable(band, s):
            return band, s
        logger.error("shared choice %d (band %d, S=%d) names no state of schedule %s: serving its "
                     "initial choice", code, band, s, self.schedule.text())
        return divmod(initial - 1, _CODE)

    def _servable(self, band: int, s: int) -> bool:
        if not 0 <= band < len(self.bands):
            return False
        ctrl = self.controllers[band]
        return s == 0 if ctrl is None else s in ctrl.states

    def observe(self, accepted: float) -> None:
        """Feed the band served this step its acceptance (accepted draft tokens per request)."""
        ctrl = self.controllers[self.band] if self.band is not None else None
        if ctrl is not None and self.s > 0:
            ctrl.observe(accepted)

    def states(self) -> list[Any]:
        """Every band state, plain target steps' included (for the start-up figures)."""
        drafting = [st for c in self.controllers if c is not None for st in c.states.values()]
        return drafting + [st for st in self.targets if st is not None]

    def release(self) -> None:
        """Release every band state not active now."""
        for c in self.controllers:
            if c is not None:
                c.release()
        for st in self.targets:
            if st is not None and st is not self.worker.state:
                st.release()

    def as_dict(self) -> dict[str, Any]:
        """``steps_per_state`` and ``schedule``: steps served per band, band switches (and per
        100 steps), steps per (band, S)."""
        return {"steps_per_state": {}, "schedule": self.describe()}

    def describe(self) -> dict[str, Any]:
        """Steps served per band, band switches (and per 100 steps), steps per (band, S)."""
        return {
            "schedule": self.schedule.text(), "hysteresis": self.schedule.hysteresis,
            "bands": [{"band": b.label(), "steps": list(b.steps), "capture_sizes": self.sizes[i],
                       "served": self.served[i]} for i, b in enumerate(self.bands)],
            "band_switches": self.band_switches,
            "switches_per_100_steps": 100.0 * self.band_switches / self.steps if self.steps else 0.0,
            "steps_per_state": dict(self.steps_per_state),
        }
