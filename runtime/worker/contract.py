"""What a host (the engine, a rank coordinator) may use of a draft worker: `DraftWorker`.

The engine and the coordinator type their worker against this `Protocol`, never against a
concrete class, and use nothing of it that is not named here, down the whole attribute path:
the collaborators the worker holds (``slot``, ``reloads``, ``capture``, ``budget``) are typed
with their faces (`runtime.worker.faces`), and tests/worker/test_worker_contract.py walks every
path the hosts (runtime/engine/, serve/, sglang/, ranks/, commands/, prometheus/, scripts/) take through
a worker against them. Hosts assign nothing through the worker. `EagleDraftWorker` and
`MultiLayerEagleDraftWorker` both satisfy it; ``drafting`` (`DraftingFace`) is an EAGLE
worker's only, read with ``getattr(worker, "drafting", None)`` (`OPTIONAL_MEMBERS`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from draftgraph.runtime.config import RuntimeArgs, SpeculativeConfig
from draftgraph.runtime.draft_io import DraftResult
from draftgraph.runtime.worker.faces import BudgetFace, CaptureFace, DraftingFace, ReloadsFace, SlotFace
from draftgraph.runtime.worker.state import DraftCounters, RuntimeState
from draftgraph.runtime.worker.weights import WeightRefit

__all__ = ["CONTRACT_MEMBERS", "OPTIONAL_MEMBERS", "DraftWorker"]


@runtime_checkable
class DraftWorker(Protocol):
    """A draft worker as its host sees it (see the module docstring)."""

    slot: SlotFace
    """The state slot: the lock steps and reloads take, and the host's step markers."""
    reloads: ReloadsFace
    """Reload requests, the two-phase prepare / commit / discard, the host's checks, the log."""
    capture: CaptureFace
    """Graph capture of the worker's states: the queue, waiting, step-boundary units, stop."""
    budget: BudgetFace
    """The memory limit per state and per reload (the host checks its own states against it)."""
    weights: WeightRefit | None
    """In-place draft-weight updates (None when the draft model has none)."""

    @property
    def args(self) -> RuntimeArgs:
        """The arguments the worker was built or last reloaded with."""

    @property
    def state(self) -> RuntimeState:
        """The active runtime state."""

    @property
    def spec(self) -> SpeculativeConfig:
        """The active draft shape (S, k, N)."""

    @property
    def generation(self) -> int:
        """Committed reloads so far."""

    @property
    def counters(self) -> DraftCounters:
        """A snapshot of the worker's counters over all its states."""

    def live_states(self) -> list[RuntimeState]:
        """Every state of the worker not garbage collected yet."""

    def draft_forward(self, draft_input: Any) -> DraftResult:
        """One draft step of the active state (a graph replay or eager)."""

    def capture_graphs(self, backend: str = "auto", background: bool = False) -> RuntimeState:
        """Capture (or queue) the active state's graphs with ``backend``."""

    def build_runtime_state(self, num_steps: int, num_draft_tokens: int | None = None,
                            capture_bs: Sequence[int] | None = None, backend: str = "auto", *,
                            topk: int | None = None, tree_choices: Any = None,
                            background: bool = False) -> RuntimeState:
        """Build and capture a state for (S, N) beside the active one."""

    def build_target_state(self, capture_bs: Sequence[int], backend: str = "auto", *,
                           background: bool = False) -> RuntimeState:
        """Build and capture the state of a plain target step (S = 0)."""

    def apply_runtime_state(self, state: RuntimeState) -> None:
        """Switch to a built state in O(1)."""

    def reload(self, new_args: RuntimeArgs, policy: str = "swap", backend: str | None = None) -> None:
        """Replace the active state with one built from ``new_args`` now."""

    def request_reload(self, new_args: RuntimeArgs, policy: str = "swap") -> None:
        """Validate now, reload at the next step boundary."""


CONTRACT_MEMBERS = frozenset({
    "slot", "reloads", "capture", "budget", "weights", "args", "state", "spec", "generation", "counters",
    "live_states", "draft_forward", "capture_graphs", "build_runtime_state", "build_target_state",
    "apply_runtime_state", "reload", "request_reload",
})  # every name `DraftWorker` declares (tests/worker/test_worker_contract.py checks the two agree)

OPTIONAL_MEMBERS: dict[str, type] = {"drafting": DraftingFace}
"""Members only some workers have (read with getattr and a default), and their faces."""
