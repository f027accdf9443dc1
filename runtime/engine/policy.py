"""The engine's step policy: which state serves a step, and what acceptance it saw.

One object answers both questions whatever chooses S: a fixed spec (`FixedPolicy`), an
`AdaptiveStepController` over candidate S values (`AdaptivePolicy`), or a speculation schedule's
bands, each with its own candidates (`scheduling.BandScheduler`); a 0 among the adaptive
candidates puts the policy behind a `PayoffGate` (plain steps while speculation does not pay).
The step calls
``begin(batch_size)`` (S for this step, 0 = a plain target decode; its state made active) and,
after a step that drafted, ``observe(accepted)`` (mean accepted draft tokens per request, the
bonus not counted). `build_policy` makes the policy for what the worker serves now; the engine
makes a new one after every reload.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from draftgraph.graphs import capabilities, capture_batch_sizes
from draftgraph.runtime import AdaptiveStepController, RuntimeArgs
from draftgraph.runtime.schedule import SpeculationSchedule
from draftgraph.runtime.worker import DraftWorker

from .payoff import PayoffGate, PlainSteps
from .scheduling import BandScheduler

__all__ = ["AdaptivePolicy", "FixedPolicy", "StepPolicy", "build_policy"]


class StepPolicy(Protocol):
    """What the engine's step asks of a policy (see the module docstring)."""

    def begin(self, batch_size: int) -> int: ...

    def observe(self, accepted: float) -> None: ...

    def states(self) -> list[Any]: ...

    def release(self) -> None: ...

    def as_dict(self) -> dict[str, Any]: ...


class FixedPolicy:
    """The worker's own state serves every step."""

    def __init__(self, worker: DraftWorker) -> None:
        self.worker = worker

    def begin(self, batch_size: int) -> int:
        return self.worker.spec.num_steps

    def observe(self, accepted: float) -> None:
        return None

    def states(self) -> list[Any]:
        return []

    def release(self) -> None:
        return None

    def as_dict(self) -> dict[str, Any]:
        return {"steps_per_state": {}, "schedule": None}


class AdaptivePolicy:
    """An `AdaptiveStepController`: each observation moves its average, and the state it picks
    then is made active for the next step (so the first step serves the worker's own S)."""

    def __init__(self, controller: AdaptiveStepController) -> None:
        self.controller = controller
        self.driven = False  # True once a `PayoffGate` serves its own S: observations only feed the average

    @property
    def candidate_steps(self) -> tuple[int, ...]:
        return self.controller.candidate_steps

    def serve(self, s: int) -> int:
        """Serve candidate ``s`` from now on (the gate's measured choice, not the rule's)."""
        self.driven = True
        return self.controller.serve(s)

    def begin(self, batch_size: int) -> int:
        return self.controller.worker.spec.num_steps

    def observe(self, accepted: float) -> None:
        if self.driven:
            self.controller.observe(accepted)
        else:
            self.controller.step(accepted)

    def states(self) -> list[Any]:
        return list(self.controller.states.values())

    def release(self) -> None:
        self.controller.release()

    def as_dict(self) -> dict[str, Any]:
        return {"steps_per_state": dict(self.controller.steps_per_state), "schedule": None}


def build_policy(worker: DraftWorker, args: RuntimeArgs, schedule: SpeculationSchedule | None,
                 adaptive_steps: Sequence[int], backend: str, background: bool,
                 coordinator: Any = None) -> StepPolicy:
    """The policy for what ``worker`` serves now under ``args``: the schedule's bands when there is
    a schedule, else an adaptive controller over ``adaptive_steps`` (chains and dynamic trees
    whose N fits; a static tree's depth is fixed), else the fixed spec; a 0 among
    ``adaptive_steps`` puts that policy behind a `PayoffGate` (its plain steps from a target-only
    state of their own when the worker captures the host's phases). A backend that captures nothing
    (eager) gets no capture sizes."""
    eager = not capabilities(backend).captures
    if schedule is not None:
        grid = capture_batch_sizes(args.decode, limit=args.max_running_requests) \
            if args.decode.max_bs is not None or args.decode.bs is not None else []
        return BandScheduler(worker, schedule, grid, None if eager else backend,
                             background=background, coordinator=coordinator)
    if 0 in adaptive_steps:
        if coordinator is not None:
            raise ValueError(f"adaptive_steps={list(adaptive_steps)}: 0 (plain steps when speculation does not pay, "
                             f"chosen by this process's clock) cannot serve a rank group; give a schedule instead")
        inner = build_policy(worker, args, None, [s for s in adaptive_steps if s], backend, background)
        plain = None
        if not eager and worker.capture.phase_provider is not None:  # plain steps from their own phases
            sizes = capture_batch_sizes(args.decode, limit=args.max_running_requests)
            plain = PlainSteps(worker, worker.build_target_state(sizes, backend, background=background))
        return PayoffGate(inner, plain=plain)
    spec = worker.spec
    if not adaptive_steps or spec.tree_choices is not None:
        return FixedPolicy(worker)
    cands: list[Any] = list(adaptive_steps) if spec.is_chain else [
        (s, spec.num_draft_tokens) for s in adaptive_steps
        if spec.num_draft_tokens - 1 <= spec.topk + (s - 1) * spec.topk ** 2]
    if not cands:
        return FixedPolicy(worker)
    return AdaptivePolicy(AdaptiveStepController(
        worker, cands, capture_bs=[] if eager else None, backend="auto" if eager else backend,
        coordinator=coordinator, background=background))
