"""Prometheus metrics: a collector that reads the counters that already exist, at scrape time.

A serving step pays nothing: nothing here runs per step. `register_worker_metrics` (any draft
worker), `register_sglang_metrics` (the SGLang drop-in's handle) and, from
`draftgraph.runtime.engine.metrics`, `register_engine_metrics` (the engine, its worker and its
rank coordinator) add a source to one collector per registry, so several workers or ranks share
one family per name and are told apart by ``labels``. Each returns a `MetricsHandle` whose
`unregister` removes the source. Names and types: `METRICS` (and docs/metrics.md).

`prometheus_client` is the optional extra ``metrics``; it is imported only by this module.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import Metric

from draftgraph.runtime.worker import EAGER_REASONS, phase_totals, read_consistent

__all__ = ["METRICS", "MetricsHandle", "Samples", "register_coordinator_metrics",
           "register_sglang_metrics", "register_worker_metrics"]

logger = logging.getLogger(__name__)

# name (counters without `_total`) -> (type, help). The one list: collectors, docs and tests use it.
METRICS: dict[str, tuple[str, str]] = {
    # worker
    "draftgraph_graph_replays": ("counter", "Draft steps served by a graph replay."),
    "draftgraph_eager_steps": ("counter", "Draft steps run eagerly, by reason."),
    "draftgraph_fast_path_hits": ("counter", "Draft steps whose outputs were the topology buffers' views."),
    "draftgraph_tree_path_calls": ("counter", "Draft steps that organized a tree."),
    "draftgraph_capacity_fallbacks": ("counter", "Fast-path steps beyond the topology buffers' rows."),
    "draftgraph_state_switches": ("counter", "Switches of the active runtime state."),
    "draftgraph_topology_rebuilds": ("counter", "Topology-buffer rebuilds."),
    "draftgraph_reloads": (
        "counter", "Reloads, by result (ok, failed, superseded: replaced by a newer request first)."),
    "draftgraph_reload_requests": ("counter", "Reloads requested, each counted once: when its build starts, "
                                              "or when superseded before it."),
    "draftgraph_generation": ("gauge", "Committed reloads so far (the serving generation)."),
    "draftgraph_active_num_steps": ("gauge", "Draft steps S of the active state."),
    "draftgraph_active_num_draft_tokens": ("gauge", "Verify width N of the active state."),
    # per live state
    "draftgraph_state_capture_seconds": ("gauge", "Seconds spent capturing the state's graphs."),
    "draftgraph_state_graph_bytes": ("gauge", "Device memory the state's graphs hold."),
    "draftgraph_state_graph_kernel_nodes": ("gauge", "Kernel nodes of the state's graph of one size."),
    "draftgraph_state_graph_replays": ("counter", "Graph replays under the state."),
    "draftgraph_state_pad_rows": ("counter", "Pad rows the state's replays carried (padding waste)."),
    "draftgraph_state_replayed_rows": ("counter", "Rows the state's replays ran, pad rows included."),
    "draftgraph_state_steps": ("counter", "Draft steps served under the state (replays + eager)."),
    "draftgraph_state_eager_steps": ("counter", "Draft steps the state ran eagerly."),
    "draftgraph_state_debug_checks": ("counter", "Debug comparisons (replay against eager) of the state."),
    "draftgraph_state_active": ("gauge", "1 for the active state, 0 for a candidate or a prepared reload."),
    "draftgraph_phase_graphs": ("gauge", "Live graphs of a host phase (verify, extend), all states, sizes and tiers."),
    "draftgraph_phase_graph_replays": ("counter", "Steps of a host phase replayed from its graphs."),
    "draftgraph_phase_eager_steps": ("counter", "Steps of a host phase run eagerly, by reason."),
    "draftgraph_phase_capture_seconds": ("counter", "Seconds spent capturing a host phase (compiling included)."),
    "draftgraph_phase_graph_bytes": ("gauge", "Graph memory of a host phase's live graphs."),
    # engine
    "draftgraph_spec_decode_drafts": ("counter", "Drafts verified (one per request per verify step)."),
    "draftgraph_spec_decode_draft_tokens": ("counter", "Draft tokens verified."),
    "draftgraph_spec_decode_accepted_tokens": ("counter", "Draft tokens accepted (bonus tokens not counted)."),
    "draftgraph_spec_decode_accepted_tokens_per_pos": (
        "counter", "Drafts whose draft token at this position (0-based) was accepted."),
    "draftgraph_spec_decode_mean_acceptance_length": (
        "gauge", "1 + accepted tokens / drafts: tokens committed per request per verify step that drafted."),
    "draftgraph_engine_steps": ("counter", "Engine steps that verified a batch."),
    "draftgraph_tokens_generated": ("counter", "Tokens emitted to requests."),
    "draftgraph_requests_finished": ("counter", "Requests that finished (length or end of sequence)."),
    "draftgraph_requests_aborted": ("counter", "Requests ended by abort_request."),
    "draftgraph_requests_failed": ("counter", "Requests that failed while admitted."),
    "draftgraph_stage_seconds": ("counter", "Host wall seconds spent per engine stage."),
    "draftgraph_startup_seconds": ("gauge", "Seconds from engine construction to the first servable step."),
    "draftgraph_draft_weights_version": (
        "gauge", "Draft weights version: in-place updates applied (update_draft_weights)."),
    "draftgraph_draft_weights_updated_timestamp_seconds": (
        "gauge", "Unix time of the last draft weights update (0 before any)."),
    "draftgraph_acceptance_low": ("gauge", "1 while the acceptance watch finds the drafter no longer helping."),
    "draftgraph_draft_misfit_warnings": ("counter", "Warnings that the draft head's first drafted token is "
                                                    "accepted for under 5% of requests (a head that does not fit "
                                                    "its target: format, layers, vocabulary)."),
    "draftgraph_graphs_ready_seconds": (
        "gauge", "Seconds from engine construction until no capture unit was pending (absent until then)."),
    "draftgraph_graph_units": (
        "gauge", "Live graph units (one state's step at one size) by where their code came from: compiled, "
        "recorded (no compile), loaded (compiled-code store), shared (an identical graph's code)."),
    "draftgraph_compile_process_seconds": (
        "counter", "Seconds spent compiling in the compile subprocess."),
    "draftgraph_compile_process_compiles": ("counter", "Graphs the compile subprocess compiled."),
    "draftgraph_compile_process_deaths": (
        "counter", "Times the compile subprocess died mid-compile (its size served eager)."),
    # several ranks
    "draftgraph_coordinator_polls": ("counter", "Coordinator polls on this rank."),
    "draftgraph_coordinator_poll_seconds": ("counter", "Wall seconds this rank spent polling."),
    "draftgraph_coordinator_reload_votes": ("counter", "Reloads this rank voted on (committed or aborted)."),
    "draftgraph_coordinator_reloads": ("counter", "Decided reloads by result (committed, aborted, rejected)."),
    "draftgraph_coordinator_forged_values": (
        "counter", "Store values this rank refused for a MAC that does not check (written by no rank of the run)."),
    "draftgraph_coordinator_stale_values": (
        "counter", "Signed store values of another moment this rank refused (a replayed proposal or free slot)."),
}

_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_RESERVED = {"num_steps", "num_draft_tokens", "topology", "size", "reason", "result", "position", "stage",
             "rank", "active", "source", "phase"}


class Samples:
    """What one scrape produces: samples added by family name, families built at the end."""

    def __init__(self) -> None:
        self._families: dict[str, Metric] = {}

    def add(self, name: str, labels: Mapping[str, str], value: float) -> None:
        """One sample of family ``name`` (a key of `METRICS`)."""
        fam = self._families.get(name)
        if fam is None:
            kind, doc = METRICS[name]
            fam = self._families[name] = Metric(name, doc, kind)
        fam.add_sample(name + "_total" if fam.type == "counter" else name, dict(labels), float(value))

    def families(self) -> list[Metric]:
        """The families in `METRICS` order."""
        return [self._families[n] for n in METRICS if n in self._families]


Reader = Callable[[Samples, dict[str, str]], None]



class _RegistryCollector:
    """The one collector of a registry: every registered source, read at each scrape."""

    def __init__(self) -> None:
        self.sources: list[tuple[tuple[object, ...], dict[str, str], Reader]] = []

    def describe(self) -> list[Metric]:
        return []  # several sources share names: no clash check (the sources are checked here)

    def collect(self) -> Iterator[Metric]:
        out = Samples()
        for _, labels, reader in list(self.sources):
            reader(out, labels)
        yield from out.families()


_collectors: dict[int, tuple[CollectorRegistry, _RegistryCollector]] = {}
_lock = threading.Lock()


class MetricsHandle:
    """Returned by every ``register_*``: `unregister` removes the source (idempotent)."""

    def __init__(self, registry: CollectorRegistry, source: object, labels: dict[str, str]) -> None:
        self.registry = registry
        self.labels = labels
        self._source: object | None = source

    @property
    def registered(self) -> bool:
        """True until `unregister`."""
        return self._source is not None

    def unregister(self) -> None:
        """Stop exporting this source; the registry's collector goes with its last source."""
        with _lock:
            source, self._source = self._source, None
            if source is None:
                return
            entry = _collectors.get(id(self.registry))
            if entry is None:
                return
            coll = entry[1]
            coll.sources = [s for s in coll.sources if s[0][0] is not source]
            if not coll.sources:
                self.registry.unregister(coll)
                del _collectors[id(self.registry)]

    def __enter__(self) -> MetricsHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unregister()


def check_labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    """The extra labels as a dict of str; ValueError naming a bad name."""
    if labels is None:
        return {}
    if not isinstance(labels, Mapping):
        raise TypeError(f"labels={labels!r}: must be a mapping of label name to value")
    out: dict[str, str] = {}
    for k, v in labels.items():
        if not isinstance(k, str) or not _LABEL.match(k) or k.startswith("__"):
            raise ValueError(f"labels key {k!r}: must match [a-zA-Z_][a-zA-Z0-9_]* without a leading __")
        if k in _RESERVED:
            raise ValueError(f"labels key {k!r}: reserved by draftgraph's series ({sorted(_RESERVED)})")
        out[k] = str(v)
    return out


def register_source(source: object, reader: Reader, registry: CollectorRegistry | None,
                    labels: Mapping[str, str] | None, also: tuple[object, ...] = ()) -> MetricsHandle:
    """Add ``reader`` (called at each scrape with the samples and ``labels``) for ``source``;
    ``also``: objects it reads as well (an engine's worker), which no other source may cover."""
    registry = REGISTRY if registry is None else registry
    if not isinstance(registry, CollectorRegistry):
        raise TypeError(f"registry={type(registry).__name__}: must be a prometheus_client CollectorRegistry")
    extra = check_labels(labels)
    with _lock:
        entry = _collectors.get(id(registry))
        if entry is None:
            coll = _RegistryCollector()
            registry.register(coll)
            _collectors[id(registry)] = (registry, coll)
        else:
            coll = entry[1]
        mine = (source, *also)
        for others, other_labels, _ in coll.sources:
            for obj in mine:
                if any(obj is o for o in others):
                    raise ValueError(f"{type(obj).__name__} at {id(obj):#x}: already registered in this "
                                     "registry (an engine covers its worker; unregister the handle first)")
            if other_labels == extra:
                raise ValueError(f"labels={extra}: another source in this registry has the same labels; pass "
                                 "labels that tell them apart, e.g. {'worker': 'a'}")
        coll.sources.append((mine, extra, reader))
    return MetricsHandle(registry, source, extra)


# ---- readers --------------------------------------------------------------------------------------
def _topology_kind(spec: Any) -> str:
    if spec.topk == 1:
        return "chain"
    return "static_tree" if spec.tree_choices is not None else "dynamic_tree"


def read_worker(worker: Any, out: Samples, labels: dict[str, str]) -> None:
    """A worker's counters (one snapshot) and its live states (one `StateStats` each)."""
    c = read_consistent(lambda: worker.counters)
    add = out.add
    add("draftgraph_graph_replays", labels, c.graph_replays)
    for reason in sorted(set(EAGER_REASONS) | set(c.eager_steps_by_reason)):
        add("draftgraph_eager_steps", {**labels, "reason": reason}, c.eager_steps_by_reason.get(reason, 0))
    add("draftgraph_fast_path_hits", labels, c.fast_path_hits)
    add("draftgraph_tree_path_calls", labels, c.tree_path_calls)
    add("draftgraph_capacity_fallbacks", labels, c.capacity_fallbacks)
    add("draftgraph_state_switches", labels, c.switches)
    add("draftgraph_topology_rebuilds", labels, c.rebuilds)
    add("draftgraph_reloads", {**labels, "result": "ok"}, c.reloads)
    add("draftgraph_reloads", {**labels, "result": "failed"}, c.failed_reloads)
    log = getattr(getattr(worker, "reloads", None), "log", None)
    if log is not None:
        totals = log.totals()
        add("draftgraph_reloads", {**labels, "result": "superseded"}, totals["superseded"])
        add("draftgraph_reload_requests", labels, totals["requested"])
    active = worker.state
    add("draftgraph_generation", labels, worker.generation)
    plain = getattr(active, "target_only", False)  # a plain target step's state: S = 0, width 1
    add("draftgraph_active_num_steps", labels, 0 if plain else active.spec.num_steps)
    add("draftgraph_active_num_draft_tokens", labels, 1 if plain else active.spec.num_draft_tokens)
    merged: dict[tuple[str, str, str], list[Any]] = {}
    for state in worker.live_states():
        spec = state.spec
        key = (("0", "1", "target_only") if getattr(state, "target_only", False) else
               (str(spec.num_steps), str(spec.num_draft_tokens), _topology_kind(spec)))
        st = read_consistent(lambda s=state: s.stats)
        debug = state.replays.debug_checks
        rows = read_consistent(lambda s=state: sum(size * u.replays for size, u in list(s.replays.sizes.items())))
        row = merged.setdefault(key, [0.0, 0, {}, 0, 0, 0, 0, 0, 0, 0])
        row[0] += st.capture_s
        row[1] += st.capture_bytes
        for size, nodes in st.nodes.items():
            if nodes is not None:
                row[2][size] = row[2].get(size, 0) + nodes
        row[3] += st.graph_replays
        row[4] += st.pad_rows
        row[5] += st.steps
        row[6] += st.eager_steps
        row[7] += debug
        row[8] = max(row[8], int(state is active))
        row[9] += rows
    for (s, n, kind), row in sorted(merged.items()):
        sl = {**labels, "num_steps": s, "num_draft_tokens": n, "topology": kind}
        add("draftgraph_state_capture_seconds", sl, row[0])
        add("draftgraph_state_graph_bytes", sl, row[1])
        for size, nodes in sorted(row[2].items()):
            add("draftgraph_state_graph_kernel_nodes", {**sl, "size": str(size)}, nodes)
        add("draftgraph_state_graph_replays", sl, row[3])
        add("draftgraph_state_pad_rows", sl, row[4])
        add("draftgraph_state_replayed_rows", sl, row[9])
        add("draftgraph_state_steps", sl, row[5])
        add("draftgraph_state_eager_steps", sl, row[6])
        add("draftgraph_state_debug_checks", sl, row[7])
        add("draftgraph_state_active", sl, row[8])
    phases = read_consistent(lambda: phase_totals(worker.live_states()))
    for phase, t in sorted(phases.items()):
        pl = {**labels, "phase": phase}
        add("draftgraph_phase_graphs", pl, t["graphs"])
        add("draftgraph_phase_graph_replays", pl, t["replays"])
        for reason in sorted(set(EAGER_REASONS) | set(t["eager_steps_by_reason"])):
            add("draftgraph_phase_eager_steps", {**pl, "reason": reason}, t["eager_steps_by_reason"].get(reason, 0))
        add("draftgraph_phase_capture_seconds", pl, t["capture_s"])
        add("draftgraph_phase_graph_bytes", pl, t["capture_bytes"])


def read_sglang_handle(handle: Any, out: Samples, labels: dict[str, str]) -> None:
    """The SGLang drop-in's fast-path counters."""
    c = handle.counters
    out.add("draftgraph_fast_path_hits", labels, c.fast_path_hits)
    out.add("draftgraph_tree_path_calls", labels, c.tree_path_calls)
    out.add("draftgraph_capacity_fallbacks", labels, c.capacity_fallbacks)
    out.add("draftgraph_topology_rebuilds", labels, c.rebuilds)


def read_coordinator(coordinator: Any, out: Samples, labels: dict[str, str]) -> None:
    """A rank coordinator's polls and reload decisions, with its rank as a label."""
    st = coordinator.stats
    rl = {**labels, "rank": str(coordinator.rank)}
    out.add("draftgraph_coordinator_polls", rl, st.polls)
    out.add("draftgraph_coordinator_poll_seconds", rl, st.poll_s)
    out.add("draftgraph_coordinator_reload_votes", rl, st.reloads + st.aborted)
    for result, n in (("committed", st.reloads), ("aborted", st.aborted), ("rejected", st.rejected)):
        out.add("draftgraph_coordinator_reloads", {**rl, "result": result}, n)
    out.add("draftgraph_coordinator_forged_values", rl, st.forged)
    out.add("draftgraph_coordinator_stale_values", rl, st.stale)


# ---- registration ---------------------------------------------------------------------------------
def register_worker_metrics(worker: Any, registry: CollectorRegistry | None = None,
                            labels: Mapping[str, str] | None = None) -> MetricsHandle:
    """Export a draft worker's counters and per-state figures (default: the global registry)."""
    if not callable(getattr(worker, "live_states", None)):
        raise TypeError(f"worker={type(worker).__name__}: must be a draftgraph draft worker (live_states)")
    return register_source(worker, lambda out, lb: read_worker(worker, out, lb), registry, labels)


def register_sglang_metrics(handle: Any, registry: CollectorRegistry | None = None,
                            labels: Mapping[str, str] | None = None) -> MetricsHandle:
    """Export the fast-path counters of an `install_chain_buffers` handle."""
    if not hasattr(handle, "counters") or not hasattr(handle, "uninstall"):
        raise TypeError(f"handle={type(handle).__name__}: must be the handle install_chain_buffers returned")
    return register_source(handle, lambda out, lb: read_sglang_handle(handle, out, lb), registry, labels)


def register_coordinator_metrics(coordinator: Any, registry: CollectorRegistry | None = None,
                                 labels: Mapping[str, str] | None = None) -> MetricsHandle:
    """Export a `RankCoordinator`'s polls and reload decisions (the engine's collector includes
    them when a coordinator is attached)."""
    return register_source(coordinator, lambda out, lb: read_coordinator(coordinator, out, lb), registry,
                           labels)
