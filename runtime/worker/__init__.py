"""Everything that lives and dies with a runtime state: the draft workers, the state and its slot,
capture off the serving path, reload, the memory budget, the counters, adaptive S, weights.

The wing's face: the workers, the contract hosts program against (`DraftWorker`), and the names
other wings read, each defined in the module named beside it.
"""

from .adaptive import AdaptiveStepController
from .base import EagleDraftWorkerBase
from .contract import DraftWorker
from .counting import read_consistent
from .eagle import EagleDraftWorker
from .host_phases import GraphStep, phase_totals
from .kind import WorkerKind
from .multi_layer import MultiLayerEagleDraftWorker
from .phase_key import PhaseKey
from .reload import RELOAD_POLICIES
from .reload_types import CommitStatus, PreparedState, ReloadError
from .state import EAGER_REASONS, DraftCounters, RuntimeState, StateStats
from .state_slot import PendingReload, ReloadRequest
from .stored_steps import compiled_unit_seconds, source_counts
from .weights import StaleWeightsError, WeightRefit

__all__ = ["AdaptiveStepController", "CommitStatus", "DraftCounters", "DraftWorker", "EAGER_REASONS",
           "EagleDraftWorker", "EagleDraftWorkerBase", "GraphStep", "MultiLayerEagleDraftWorker", "PendingReload",
           "PhaseKey", "PreparedState", "RELOAD_POLICIES", "ReloadError", "ReloadRequest", "RuntimeState",
           "StaleWeightsError", "StateStats", "WeightRefit", "WorkerKind", "compiled_unit_seconds", "phase_totals",
           "read_consistent", "source_counts"]
