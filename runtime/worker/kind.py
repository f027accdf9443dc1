"""`WorkerKind`: the one small Protocol a new kind of draft worker implements.

`EagleDraftWorkerBase` owns everything a worker shares (the slot, states, reloads, capture,
the budget, overrides); what differs between kinds is given to it as one object, not as
private hooks to override: the kind's args rules, the bytes per row of its static inputs, its
capturable draft step and where that step's compiled code is stored. A worker subclass then
only adds its ``draft_forward`` (and whatever it serves besides).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from draftgraph.runtime.config import RuntimeArgs

if TYPE_CHECKING:
    from draftgraph.runtime.worker.host_phases import GraphStep
    from draftgraph.runtime.worker.state import RuntimeState

__all__ = ["WorkerKind"]


class WorkerKind(Protocol):
    """What one kind of draft worker tells the base (see the module docstring)."""

    captures_graphs: bool
    """False: nothing to capture (its step launches no kernel); `graph_step` is never called."""

    def check_args(self, args: RuntimeArgs) -> None:
        """Refuse args this kind cannot serve: ValueError / TypeError naming the field."""

    def row_input_bytes(self) -> int:
        """Bytes per row of the static graph inputs besides topk_p / topk_index (the budget's)."""

    def graph_step(self, state: RuntimeState, max_size: int, args: RuntimeArgs) -> GraphStep:
        """The capturable draft step of ``state`` over static inputs of ``max_size`` rows."""

    def stored_code(self, state: RuntimeState, compiler: Any, args: RuntimeArgs) -> Any:
        """Where ``state``'s compiled step is stored and loaded from (`StoredCode`), or None."""
