"""The faces of a draft worker's collaborators: what a host may use of each, as a `Protocol`.

`runtime.worker.contract.DraftWorker` types its collaborators with these, so the whole path a
host walks (``worker.capture.queue.pending()``, ``worker.reloads.commit(...)``) is written
down: tests/worker/test_worker_contract.py walks the hosts' attribute paths against them.
Anything not named here is the collaborator's own business. Values a face returns (a
`RuntimeState`, a `PreparedState`, `DraftCounters`) are plain classes read through their
public attributes. Hosts call these members and assign none of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from draftgraph.runtime.config import RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.draft_io import DraftResult
from draftgraph.runtime.worker.host_phases import GraphStep, PhaseProvider
from draftgraph.runtime.worker.reload_types import CommitStatus, PreparedState, ReloadHost
from draftgraph.runtime.worker.state import RuntimeState
from draftgraph.runtime.worker.state_slot import ReloadRequest

__all__ = ["BudgetFace", "CaptureFace", "CaptureQueueFace", "DraftingFace", "ReloadLogFace", "ReloadsFace",
           "SlotFace"]


class SlotFace(Protocol):
    """The state slot as a host sees it: the lock and its step markers."""

    lock: Any  # a threading.RLock: steps, weights updates and reloads take it

    def enter_step(self) -> None:
        """The host's thread starts a step (reloads may run in it)."""

    def leave_step(self) -> None:
        """The host's step ended."""


class ReloadLogFace(Protocol):
    """The one log of reloads."""

    def totals(self) -> dict[str, int]:
        """Lifetime counts: requested, applied, failed, superseded."""

    def recent(self, epoch: int) -> list[dict[str, Any]]:
        """The records a host stamped with ``epoch``."""


class ReloadsFace(Protocol):
    """The reload transaction (`runtime.worker.reload.Reloads`)."""

    log: ReloadLogFace

    def add_check(self, check: Callable[[RuntimeArgs], None]) -> None:
        """Add a host's limit to every reload's checks."""

    def attach_host(self, host: ReloadHost) -> None:
        """``host`` drives the steps and holds the requests."""

    def check(self, new_args: Any, policy: str = "swap") -> ReloadRequest:
        """Every check, nothing changed: the checked request."""

    def request(self, new_args: RuntimeArgs, policy: str = "swap") -> None:
        """Check now; the host (or the worker's next step) applies it."""

    def prepare(self, new: RuntimeArgs | ReloadRequest, policy: str = "swap", backend: str | None = None, *,
                background: bool = False, graphs: bool = True) -> PreparedState:
        """Build the new state aside."""

    def commit(self, prepared: PreparedState | ReloadRequest, *, backend: str | None = None,
               graphs: bool = True, background: bool = False, land: bool = False) -> CommitStatus:
        """Swap it in (a request: build, then swap; ``background``: called again each boundary
        until its graphs are ready, ``HOLDING`` meanwhile)."""

    @property
    def capturing_state(self) -> Any:
        """The state a background commit is capturing aside, or None."""

    def discard(self, prepared: PreparedState, reason: str, *, superseded: bool = False) -> None:
        """Release a prepared state, recording why."""


class CaptureQueueFace(Protocol):
    """The background capture queue's figures (read only)."""

    threaded: bool
    idle_since: float | None
    units_run: int
    units_failed: int
    units_cancelled: int
    unit_s: float
    compile_units: int
    compile_unit_s: float
    unfinished_s: float
    max_wait_s: float

    def pending(self) -> int:
        """Units queued or running."""

    def running_s(self) -> float | None:
        """How long the unit running now has run (None: none)."""

    def paced(self) -> bool:
        """True when units wait between them (serving beside them)."""


class CaptureFace(Protocol):
    """Graph capture of the worker's states (`runtime.worker.state_capture.StateCapture`)."""

    queue: CaptureQueueFace
    phase_provider: PhaseProvider | None

    def use_backend(self, backend: str) -> None:
        """The backend later reloads capture with."""

    def set_phase_provider(self, provider: PhaseProvider | None) -> None:
        """The host's phases captured beside each draft step."""

    def set_compile_processes(self, n: int) -> None:
        """Compile in up to ``n`` processes (and as many queue threads)."""

    def ready(self) -> bool:
        """True when no unit is pending."""

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait for every queued unit."""

    def run_pending(self, budget_s: float) -> int:
        """Run step-boundary units for up to ``budget_s`` seconds."""

    def stop(self, timeout_s: float | None = 60.0) -> bool:
        """Stop background capture."""

    def compile_process_figures(self) -> dict[str, Any] | None:
        """The compile process's counts and seconds."""


class BudgetFace(Protocol):
    """The memory limit per state (`runtime.worker.budget.StateBudget`)."""

    def check_states(self, args: RuntimeArgs, specs: Sequence[SpeculativeConfig]) -> int:
        """Refuse a reload whose states need more than the limit together."""


class DraftingFace(Protocol):
    """An EAGLE worker's step (`runtime.worker.eagle_step.EagleDrafting`; ``worker.drafting``,
    None on other workers): what benchmarks and the rank fingerprint use of it."""

    row_layout: Any

    def step(self, state: RuntimeState, topk_p: torch.Tensor, topk_index: torch.Tensor, hidden: Any, *,
             count: bool = True) -> DraftResult:
        """One organized draft step of ``state``."""

    def tokens(self, state: RuntimeState, topk_p: torch.Tensor, topk_index: torch.Tensor,
               hidden: Any) -> torch.Tensor:
        """The draft tokens of one step, not organized."""

    def tree_lists(self, num_steps: int, topk: int, topk_p: torch.Tensor, topk_index: torch.Tensor,
                   hidden: Any) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        """The general draft loop's per-step lists."""

    def graph_step(self, state: RuntimeState, max_size: int, device: str, organize: bool = True) -> GraphStep:
        """The capturable step over static inputs."""
