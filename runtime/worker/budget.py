"""Memory bound of a worker state, checked before anything is allocated.

A worker builds every state (the first, an override, `build_runtime_state`, a reload) through one
place, and that place first estimates what the state will own and refuses, naming the fields and
the figure, when it exceeds ``RuntimeArgs.max_state_bytes`` (default ``DEFAULT_MAX_STATE_BYTES``,
1 GiB). The estimate is arithmetic on the configuration only (no topology is built, no size
grid enumerated), so a hopeless configuration is refused in microseconds with memory unchanged.

What is counted (bytes; ``C`` = topology rows, `chain_capacity`; ``R`` = the largest capture size,
0 without graphs; ``N``, ``S``, ``k`` of the spec):

- topology buffers (static topologies: a chain or ``tree_choices``): organize outputs
  ``C * (W + N - 1) * 8`` (W = N - 1, or 0 at depth 1) and verify constants
  ``C * (N * N + 4 * N * 8) + N * 8`` (tree mask, parents, retrieve index, next token/sibling);
- static graph inputs: ``R * (k * 4 + k * 8 + row_input_bytes)`` (topk_p, topk_index, and the
  worker's per-row input, e.g. hidden_states ``H * itemsize``);
- graph outputs: ``R * (N - 1) * 8`` for a static topology (the draft tokens; the rest are
  views of the topology buffers); for a dynamic tree ``R * ((1 + (S-1)k) * 8 + 2 (N-1) * 8 +
  M * 20)`` with ``M = k + (S-1)k^2`` candidates (their scores, tokens and parents).

Activations inside a step are not counted: the estimate is what the state holds between steps.

A reload is budgeted whole (`check_states_budget`): every state it builds (its own, and an
engine's adaptive or schedule candidates, each sized for the new args) is estimated and summed,
each static topology's buffers once (they are shared), and the sum is checked before any state
is built. The limit is the operator's: a worker keeps the ``max_state_bytes`` it was constructed
with, and a reload's own ``max_state_bytes`` can only lower it (the smaller of the two applies),
never raise it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from draftgraph.runtime.config import RuntimeArgs, SpeculativeConfig, chain_capacity, max_tree_candidates

__all__ = ["StateBudget", "StateBytes", "check_state_budget", "check_states_budget", "estimate_state_bytes",
           "largest_capture_size"]


@dataclass(frozen=True)
class StateBytes:
    """Estimated bytes of one state, by part."""

    topology: int
    graph_inputs: int
    graph_outputs: int

    @property
    def total(self) -> int:
        """All parts."""
        return self.topology + self.graph_inputs + self.graph_outputs


def estimate_state_bytes(spec: SpeculativeConfig, capacity: int, rows: int, row_input_bytes: int = 0
                         ) -> StateBytes:
    """Bytes a state of ``spec`` owns with ``capacity`` topology rows and graphs up to ``rows``
    (0: none); ``row_input_bytes``: the worker's per-row static input besides topk_p/topk_index."""
    n, s, k = spec.num_draft_tokens, spec.num_steps, spec.topk
    topology = 0
    if spec.is_static:
        width = n - 1 if s > 1 else 0
        topology = capacity * ((width + n - 1) * 8 + n * n + 4 * n * 8) + n * 8
        out_row = (n - 1) * 8
    else:
        cands = max_tree_candidates(s, k)
        out_row = (1 + (s - 1) * k) * 8 + 2 * (n - 1) * 8 + cands * 20
    return StateBytes(topology, rows * (k * 4 + k * 8 + row_input_bytes), rows * out_row)


def largest_capture_size(args: RuntimeArgs) -> int:
    """The largest batch size a worker captures for ``args`` (0: none), without enumerating the
    size grid: min(max(bs) or max_bs, max_running_requests); 0 when disabled or neither is set."""
    decode = args.decode
    if decode.disabled or (decode.max_bs is None and decode.bs is None):
        return 0
    largest = max(decode.bs) if decode.bs else decode.max_bs
    if not largest:
        return 0
    limit = args.max_running_requests
    return largest if limit is None else min(largest, limit)


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def check_state_budget(args: RuntimeArgs, spec: SpeculativeConfig, rows: int, row_input_bytes: int = 0,
                       limit: int | None = None) -> StateBytes:
    """The estimate for a state of ``spec`` under ``args``; ValueError naming the fields and the
    figure when it exceeds ``limit`` (default ``args.max_state_bytes``)."""
    capacity = chain_capacity(args)
    est = estimate_state_bytes(spec, capacity, rows, row_input_bytes)
    limit = args.max_state_bytes if limit is None else limit
    if est.total > limit:
        raise ValueError(
            f"a state for num_steps={spec.num_steps}, topk={spec.topk}, "
            f"num_draft_tokens={spec.num_draft_tokens} with {capacity} topology rows "
            f"(max(cuda_graph_config.decode.max_bs, max_running_requests)) and graphs up to batch "
            f"size {rows} needs about {_mib(est.total)} (topology {_mib(est.topology)}, graph inputs "
            f"{_mib(est.graph_inputs)}, graph outputs {_mib(est.graph_outputs)}): over "
            f"max_state_bytes={limit} ({_mib(limit)}); lower those fields or raise max_state_bytes "
            f"(the operator's configuration: a reload can only lower it)"
        )
    return est


def check_states_budget(args: RuntimeArgs, specs: list[SpeculativeConfig], rows: int, limit: int,
                        row_input_bytes: int = 0) -> int:
    """The estimated bytes of every state in ``specs`` under ``args`` (graphs up to ``rows``),
    summed, each static topology's buffers counted once; ValueError naming the states, the sum
    and ``limit`` when the sum exceeds it. Nothing is allocated."""
    capacity = chain_capacity(args)
    total, topologies = 0, set()
    for spec in specs:
        est = estimate_state_bytes(spec, capacity, rows, row_input_bytes)
        key = spec.topology
        shared = key is not None and key in topologies
        if key is not None:
            topologies.add(key)
        total += est.total - (est.topology if shared else 0)
    if total > limit:
        steps = ", ".join(str(s.num_steps) for s in specs)
        raise ValueError(
            f"a reload to max_running_requests={args.max_running_requests}, "
            f"cuda_graph_config.decode.max_bs={args.decode.max_bs} ({capacity} topology rows) builds "
            f"{len(specs)} states (num_steps {steps}: its own and the adaptive or schedule candidates) "
            f"needing about {_mib(total)} together: over max_state_bytes={limit} ({_mib(limit)}, the "
            f"operator's limit; a reload can only lower it); lower max_running_requests / max_bs")
    return total


class StateBudget:
    """One worker's memory limit per state and per reload: the operator's ``max_state_bytes``
    (the worker's construction args; a reload's own value only lowers it), the worker's bytes per
    row of static graph input, and whether it captures a draft step at all (no rows when not)."""

    def __init__(self, limit: int, row_input_bytes: int, captures_graphs: bool) -> None:
        self._limit = limit
        self._row_input_bytes = row_input_bytes
        self._captures_graphs = captures_graphs

    @property
    def limit(self) -> int:
        """The operator's limit: the ``max_state_bytes`` the worker was constructed with."""
        return self._limit

    def limit_for(self, args: RuntimeArgs) -> int:
        """The limit under ``args``: its ``max_state_bytes`` when lower than the operator's."""
        return min(args.max_state_bytes, self._limit)

    def check_state(self, args: RuntimeArgs, spec: SpeculativeConfig, rows: int | None = None) -> None:
        """Refuse one state of ``spec`` under ``args`` with graphs up to ``rows`` (None: the args'
        largest capture size) over `limit_for`: ValueError, before anything is built."""
        if not self._captures_graphs:
            rows = 0
        elif rows is None:
            rows = largest_capture_size(args)
        check_state_budget(args, spec, rows, self._row_input_bytes, limit=self.limit_for(args))

    def check_states(self, args: RuntimeArgs, specs: Sequence[SpeculativeConfig]) -> int:
        """Refuse a reload to ``args`` whose states (``specs``: every state it builds, graphs up to
        ``args``' largest capture size) need more than `limit_for` together: ValueError, nothing
        allocated. Returns the estimated bytes."""
        rows = largest_capture_size(args) if self._captures_graphs else 0
        return check_states_budget(args, list(specs), rows, self.limit_for(args), self._row_input_bytes)
