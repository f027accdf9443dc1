"""What the engine can serve: checks every args it is built with or reloaded to must pass.

Installed as the worker's args checks, so a reload from any path (the engine's, the worker's
own `request_reload`, a signal handler's) is refused when asked, with a ValueError naming the
field, the value and the rule, and nothing is left pending.
"""

from __future__ import annotations

from collections.abc import Callable

from draftgraph.runtime import RuntimeArgs
from draftgraph.runtime.schedule import SpeculationSchedule
from draftgraph.runtime.worker import DraftWorker

from .drafting import KEEP_TOPK
from .scheduling import check_schedule, reload_state_specs

__all__ = ["EngineLimits", "MAX_VERIFY_WIDTH"]

MAX_VERIFY_WIDTH = 32  # the widest tree (N) a reload may ask for; admission reserves room for it


class EngineLimits:
    """The engine's limits for ``worker``: ``max_steps`` the drafter's most S (a multi-layer
    draft's layers; None for none), ``schedule`` the engine's schedule at construction (None for
    none; ``current_schedule`` later, once the engine follows reloads), ``adaptive_steps`` its
    adaptive candidates (for the memory budget)."""

    def __init__(self, worker: DraftWorker, max_steps: int | None, schedule: SpeculationSchedule | None,
                 adaptive_steps: tuple[int, ...]) -> None:
        self.worker = worker
        self.max_steps = max_steps
        self.current_schedule: Callable[[], SpeculationSchedule | None] = lambda: schedule
        self.installs_schedule = schedule is not None
        self.adaptive_steps = adaptive_steps

    def install(self) -> None:
        """Every later reload of the worker is checked here too."""
        self.worker.reloads.add_check(self.check_spec)
        if self.installs_schedule:
            self.worker.reloads.add_check(self.check_schedule)
        self.worker.reloads.add_check(self.check_memory)

    def check_spec(self, args: RuntimeArgs) -> None:
        spec = args.speculative
        if spec.topk > KEEP_TOPK:
            raise ValueError(f"speculative.topk={spec.topk}: the engine keeps {KEEP_TOPK} candidates")
        if spec.num_draft_tokens > MAX_VERIFY_WIDTH:
            raise ValueError(f"speculative.num_draft_tokens={spec.num_draft_tokens}: the engine "
                             f"verifies at most {MAX_VERIFY_WIDTH} tokens per request")

    def check_schedule(self, args: RuntimeArgs) -> None:
        """The schedule served under ``args`` (its own, else the engine's) must fit its spec and
        the drafter: ValueError naming the band and the rule."""
        schedule = args.schedule or self.current_schedule()
        if schedule is not None:
            check_schedule(schedule, args.speculative, self.max_steps)

    def check_memory(self, args: RuntimeArgs) -> None:
        """Every state a reload to ``args`` builds (its own, the adaptive or band candidates),
        summed, within the operator's memory limit: ValueError before any is built."""
        self.worker.budget.check_states(args, reload_state_specs(
            args.speculative, self.adaptive_steps, args.schedule or self.current_schedule()))
