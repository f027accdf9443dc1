"""The engine's graph phases: target verify and draft extend, captured per runtime state.

`EnginePhases` is the worker's `PhaseProvider`: for a state's spec (S, N) it hands over, per KV
window tier, a verify step at width N and (EAGLE drafts) an extend step at width S + 1, each over
its own static rows; for a plain target step's state (S = 0) both at width 1. The worker
captures, swaps and releases them with the state, so a step reads the verify graph of the very
state that drafted it.

KV length is data. A graph attends over a fixed window of ``lk`` cache positions (its tier) and
reads the lengths from its static rows: mask, write positions and RoPE come from them, so one
capture serves every length up to its tier. A step picks the smallest tier >= max length + N;
admission keeps every request within the cache (`RequestTable`), whose length is the largest
tier. A graph never serves a length past its tier: the step runs the next tier's graph.

Verify: tokens / positions [b, N], lens / slots [b], tree_mask [b, N, N] and the rows' sampling
parameters (temperature, top_p, top_k, min_p, seed [b]) -> each node's token [b, N] (the sampled
accept policy's: greedy rows the argmax, so mixed batches share the graph) and hidden [b, N, d]
(K/V written at seq_len + node). Extend: the verify's hidden [b, N, d],
acceptance path / tokens [b, W], length / lens / slots [b], alive [b] -> the next draft feature
[b, d] and its top candidates p / ids [b, keep]. Pad rows read and write the dummy slot 0.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

import torch

from draftgraph.graphs import Miss, capabilities, resolve_backend, span, spans_active
from draftgraph.runtime import SpeculativeConfig
from draftgraph.runtime.sampling import SamplingRows
from draftgraph.runtime.worker import GraphStep, PhaseKey

from .accept_policy import SAMPLED_ACCEPT, AcceptPolicy
from .drafting import EagleDrafter, MultiLayerDrafter
from .held_extends import holds_plain_extends
from .model_seam import DraftTarget
from .slot_state import StepBatch
from .verify import Acceptance, tree_verify_mask

__all__ = ["EnginePhases", "PHASE_NAMES", "default_graph_phases", "default_tiers", "engine_phases"]

PHASE_NAMES = ("verify", "extend")
# the verify graph's per-row sampling inputs (`SamplingRows`' fields), in input order
_SAMPLING_FIELDS = (("temperature", torch.float64), ("top_p", torch.float64), ("top_k", torch.long),
                    ("min_p", torch.float64), ("seed", torch.long))


def default_graph_phases(backend: str) -> tuple[str, ...]:
    """The phases captured by default on a resolved ``backend``: all of them on "cuda" (the
    launch overhead they remove is most of a small batch's step); none on the CPU backends, where
    measured they do not pay (docs/performance.md: "trace" replays the verify at 0.6-0.9x eager
    and "compile" keeps its FX replay, the compiled verify not being bit-equal), while every
    phase costs a capture per size and tier. Ask for them with ``graph_phases``."""
    return PHASE_NAMES if capabilities(backend).replays_on_device else ()


def default_tiers(cache_len: int) -> tuple[int, ...]:
    """KV window tiers for a cache of ``cache_len`` positions: a quarter, a half and all of it
    (the window costs attention time in proportion; measured in docs/phases.md), or all of it
    alone when a quarter is under 64 positions."""
    quarter = cache_len // 4
    return (quarter, cache_len // 2, cache_len) if quarter >= 64 else (cache_len,)


class EnginePhases:
    """The phases of one engine: ``target`` with its K/V ``cache``, the ``drafter`` (an extend
    phase when it ``graphs_extend``), KV window ``tiers`` (ascending, the last = cache length)
    and the ``phases`` to capture (a subset of `PHASE_NAMES`).

    ``choose_in_graph``: the verify graph picks each node's token itself (the sampled policy,
    which gives greedy rows the argmax: one graph for every batch, no launch after it, what a
    device-replay backend wants); False: the graph returns the logits and the step's own policy
    picks after the replay (on the CPU the sampled policy's full-vocabulary sort costs about 2 ms
    a row, paid by an all-greedy batch too; outside the graph a greedy batch takes the argmax
    alone, and a sampled one the same `choose_tokens` as the eager road)."""

    def __init__(self, target: DraftTarget, cache: Any, drafter: EagleDrafter | MultiLayerDrafter,
                 tiers: Sequence[int],
                 phases: Sequence[str] = PHASE_NAMES, choose_in_graph: bool = True) -> None:
        tiers = tuple(tiers)
        bad = [t for t in tiers if isinstance(t, bool) or not isinstance(t, int) or t < 1]
        if bad:
            raise TypeError(f"tiers={list(tiers)}: {bad[0]!r} is not an int >= 1 (KV window lengths)")
        if not tiers or list(tiers) != sorted(set(tiers)) or tiers[-1] != cache.max_len:
            raise ValueError(f"tiers={list(tiers)}: must be ascending, unique, and end at the cache "
                             f"length {cache.max_len}")
        unknown = sorted(set(phases) - set(PHASE_NAMES))
        if unknown:
            raise ValueError(f"phases={list(phases)}: unknown {unknown}; valid names are {list(PHASE_NAMES)}")
        self.target = target
        self.cache = cache
        self.drafter = drafter
        self.tiers = tiers
        self.phases = tuple(p for p in PHASE_NAMES if p in phases)
        self.has_extend = "extend" in self.phases and drafter.graphs_extend
        self.choose_in_graph = bool(choose_in_graph)

    # ---- the provider -------------------------------------------------------------------------
    def __call__(self, spec: SpeculativeConfig | None, max_size: int) -> dict[str, GraphStep]:
        """Phase name -> `GraphStep` for ``spec`` at ``max_size`` rows (see the module docstring);
        ``spec`` None: a plain target step's (S = 0: the verify at width 1, and an extend at width 1
        unless plain steps hold the drafter's extend, `holds_plain_extends`)."""
        n, width = (1, 1) if spec is None else (spec.num_draft_tokens, spec.num_steps + 1)
        extend = self.has_extend and not (spec is None and holds_plain_extends(self.drafter))  # held: none
        steps: dict[str, GraphStep] = {}
        for lk in self.tiers:
            if "verify" in self.phases:
                steps[PhaseKey("verify", lk).name] = self._verify_step(n, lk, max_size)
            if extend:
                step = self.drafter.extend_step(n, width, lk, max_size, self.target.hidden_size, self.target.dtype)
                steps[PhaseKey("extend", lk).name] = step._replace(
                    structure=self.structure("extend", n=n, width=width, lk=lk), constants=self.constants)
        return steps

    def tier(self, batch: StepBatch, width: int) -> int:
        """The smallest tier holding every request's window (max length + ``width``)."""
        need = batch.max_len + width
        for lk in self.tiers:
            if lk >= need:
                return lk
        raise ValueError(f"a request at length {batch.max_len} with {width} tree tokens needs {need} "
                         f"cache positions; the cache has {self.tiers[-1]} (admission keeps requests within it)")

    def structure(self, phase: str, **shape: int) -> str:
        """What a phase's compiled code depends on besides its shapes: the models' classes and
        configurations, the cache, the phase and its widths (the store's key, with the source
        digest and the shapes)."""
        def config(model: Any) -> Any:
            cfg = None if model is None else model.cfg
            return dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else repr(cfg)

        head = self.drafter.head
        return json.dumps({"phase": phase, **shape, "choose_in_graph": self.choose_in_graph,
                           "target": type(self.target).__qualname__,
                           "target_config": config(self.target), "draft": type(head).__qualname__,
                           "draft_config": config(head), "cache": [self.cache.slots, self.cache.max_len],
                           "dtype": str(self.target.dtype), "device": str(self.cache.k[0].device)},
                          sort_keys=True, default=repr)

    def constants(self) -> dict[str, torch.Tensor]:
        """Every tensor a phase may read besides its inputs, by stable name: the target's and the
        draft's parameters and buffers and both K/V caches (never baked into stored code)."""
        out: dict[str, torch.Tensor] = {}
        head = self.drafter.head
        for prefix, model in (("target", self.target), ("draft", head)):
            if isinstance(model, torch.nn.Module):
                out.update({f"{prefix}.{n}": t for n, t in model.named_parameters()})
                out.update({f"{prefix}.{n}": t for n, t in model.named_buffers()})
        for prefix, cache in (("cache", self.cache), ("draft_cache", None if head is None else head.cache)):
            if cache is not None:
                out.update({f"{prefix}.k.{i}": t for i, t in enumerate(cache.k)})
                out.update({f"{prefix}.v.{i}": t for i, t in enumerate(cache.v)})
        return out

    def _verify_step(self, n: int, lk: int, rows: int) -> GraphStep:
        dev = self.cache.k[0].device
        long = torch.long
        static = {
            "tokens": torch.zeros(rows, n, dtype=long, device=dev),
            "positions": torch.zeros(rows, n, dtype=long, device=dev),
            "lens": torch.zeros(rows, dtype=long, device=dev),
            "slots": torch.zeros(rows, dtype=long, device=dev),
            "tree_mask": torch.ones(rows, n, n, dtype=torch.bool, device=dev),
            **{f: torch.zeros(rows, dtype=t, device=dev) for f, t in _SAMPLING_FIELDS},
        }
        target, cache, choose = self.target, self.cache, self.choose_in_graph

        def verify(tokens: torch.Tensor, positions: torch.Tensor, lens: torch.Tensor, slots: torch.Tensor,
                   tree_mask: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor,
                   min_p: torch.Tensor, seed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            width = tokens.shape[1]
            write = lens[:, None] + torch.arange(width, device=lens.device)[None]
            mask = tree_verify_mask(tree_mask, lens, lk)
            logits, hidden = target(tokens, positions, write, slots, mask, cache)
            if not choose:  # the step's policy picks after the replay
                return logits, hidden
            rows = SamplingRows(temperature, top_p, top_k, min_p, seed)
            return SAMPLED_ACCEPT.choose(logits, positions, rows), hidden

        # pad rows: slot 0 (the dummy), length 0, each node sees itself (no empty softmax row), greedy
        pads = {"tokens": 0, "positions": 0, "lens": 0, "slots": 0, "tree_mask": 1,
                **{f: 1 if f == "top_p" else 0 for f, _ in _SAMPLING_FIELDS}}
        return GraphStep(verify, static, pads, self.structure("verify", n=n, lk=lk), self.constants)

    # ---- running a phase ---------------------------------------------------------------------
    @staticmethod
    def run(state: Any, name: str, inputs: dict[str, torch.Tensor], eager: Any) -> Any:
        """Phase ``name`` of ``state`` on ``inputs`` (in the step's static-input order): its graph
        for the padded batch, or ``eager()`` counted by reason. The graph's outputs are views the
        next replay of the phase overwrites."""
        phases = state.replayable_phases()
        b = next(iter(inputs.values())).shape[0]
        found = phases.lookup(name, b) if phases is not None else Miss("no_graphs")
        if type(found) is tuple:
            manager, plan = found
            if spans_active():  # what ran, as the step's ``served`` range says it for the draft
                with span("phase", phase=name, bs=b, mode="graph", padded=plan.padded):
                    pass
            return manager.replay_trusted(plan, tuple(inputs.values()))
        if phases is not None:
            phases.count_eager(name, found.reason)
        if spans_active():
            with span("phase", phase=name, bs=b, mode="eager", reason=found.reason):
                pass
        return eager()

    def verify(self, state: Any, batch: StepBatch, tree: Any, n: int, eager: Any, policy: AcceptPolicy
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """(each node's token [b, N], hidden [b, N, d]) of the verify tree, from the state's graph
        for the batch's tier, or ``eager()`` (which returns the same, by the step's ``policy``;
        the same ``policy`` picks from a graph's logits when the graph does not choose)."""
        if "verify" not in self.phases:
            return eager()
        b = batch.size
        rows = batch.sampling
        inputs = {"tokens": tree.tokens.view(b, n), "positions": tree.positions.view(b, n), "lens": batch.lens,
                  "slots": batch.slots, "tree_mask": tree.tree_mask,
                  "temperature": rows.temperature, "top_p": rows.top_p, "top_k": rows.top_k, "min_p": rows.min_p,
                  "seed": rows.seed}
        name = PhaseKey("verify", self.tier(batch, n)).name
        if self.choose_in_graph:
            return self.run(state, name, inputs, eager)
        out = self.run(state, name, inputs, lambda: None)  # None: no graph served (counted by reason)
        if out is None:
            return eager()
        logits, hidden = out
        return policy.choose(logits, inputs["positions"], rows), hidden

    def extend(self, state: Any, batch: StepBatch, hidden: torch.Tensor, acc: Acceptance,
               alive: torch.Tensor, eager: Any) -> Any:
        """The next draft inputs (feature [b, d], p [b, keep], ids [b, keep]) from the state's
        extend graph, or None after ``eager()`` (which writes them itself)."""
        if not self.has_extend:
            eager()
            return None
        width = acc.path.shape[1]
        inputs = {"hidden": hidden, "path": acc.path, "tokens": acc.tokens, "length": acc.length,
                  "lens": batch.lens, "slots": batch.slots, "alive": alive}

        def run_eager() -> None:
            eager()

        return self.run(state, PhaseKey("extend", self.tier(batch, width)).name, inputs, run_eager)


def engine_phases(target: DraftTarget, cache: Any, drafter: EagleDrafter | MultiLayerDrafter, backend: str,
                  graph_phases: Sequence[str] | None, kv_tiers: Sequence[int] | None) -> EnginePhases | None:
    """The verify / extend phases every captured state of an engine holds (None: the eager
    backend, or no phase asked for); ``graph_phases`` None: `default_graph_phases` of the
    backend; ``kv_tiers`` None: `default_tiers` of the cache."""
    if not capabilities(backend, device=cache.k[0].device).captures:
        return None
    if graph_phases is None:
        graph_phases = default_graph_phases(resolve_backend(backend, device=cache.k[0].device))
    elif isinstance(graph_phases, str) or not all(isinstance(p, str) for p in graph_phases):
        raise TypeError(f"graph_phases={graph_phases!r}: must be a sequence of phase names or None")
    if not graph_phases:
        return None
    tiers = default_tiers(cache.max_len) if kv_tiers is None else tuple(kv_tiers)
    on_device = capabilities(backend, device=cache.k[0].device).replays_on_device
    return EnginePhases(target, cache, drafter, tiers, graph_phases, choose_in_graph=on_device)
