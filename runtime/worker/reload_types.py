"""The values and roles a reload's transaction names (`reload.Reloads`): its error, what a worker
and a host give it (`StateFactory`, `ReloadHost`), a state built aside (`PreparedState`) and what
a commit did (`CommitStatus`)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol

from draftgraph.runtime.config import RuntimeArgs
from draftgraph.runtime.worker.state_slot import ReloadRequest

if TYPE_CHECKING:
    from draftgraph.runtime.worker.state import RuntimeState

__all__ = ["CommitStatus", "PreparedState", "ReloadError", "ReloadHost", "StateFactory"]


class ReloadError(RuntimeError):
    """A reload failed; the cause is chained and the worker state is described in the message."""


class StateFactory(Protocol):
    """What a worker gives its `Reloads`: its own args rules and a new state (no graphs)."""

    def check_args(self, args: RuntimeArgs) -> None:
        """Refuse args this worker cannot serve (ValueError / TypeError naming the field)."""

    def new_state(self, args: RuntimeArgs, generation: int) -> RuntimeState:
        """A complete state for ``args`` at ``generation`` (its budget already checked)."""


class ReloadHost(Protocol):
    """Who drives the worker's steps (the engine's step boundary): it holds the requests."""

    name: str

    def hold_reload(self, request: ReloadRequest) -> ReloadRequest | None:
        """Keep ``request`` for the next step boundary; the request it supersedes, if any."""

    def reload_stamp(self) -> tuple[int, int]:
        """(epoch, step) stamped on each record: the host's statistics since its last reset."""


class CommitStatus(Enum):
    """What a `Reloads.commit` did; only a background one (``background=True``) may hold."""

    COMMITTED = "committed"  # the new state serves
    HOLDING = "holding"  # its graphs are still captured off the serving thread: call again next boundary
    LANDED_UNREADY = "landed_unready"  # swapped in (``land=True``) before every graph was ready


@dataclass(frozen=True)
class PreparedState:
    """A state built aside by `Reloads.prepare`: not serving until committed."""

    args: RuntimeArgs
    policy: str
    state: Any
    generation: int  # the worker's generation it was prepared against
    start: float  # perf_counter at the start of the prepare

    @property
    def ready(self) -> bool:
        """True when no capture unit of the new state is pending (always, unless prepared with
        ``background=True``)."""
        graphs = self.state.graphs
        return graphs is None or not graphs.pending_sizes

    @property
    def failed_sizes(self) -> dict[int, str]:
        """Sizes whose queued capture failed (they would serve eager)."""
        graphs = self.state.graphs
        return graphs.failed_sizes if graphs is not None else {}
