"""Frozen, validated configuration: speculative shape, graph capture phases, runtime arguments.

`PhaseGraphConfig` / `CudaGraphConfig` mirror the shape of SGLang's ``cuda_graph_config``; SGLang's
own objects become a `RuntimeArgs` through one route, `draftgraph.runtime.sglang.config.
runtime_args_from_sglang` (that module imports this one, never the other way).

Bounds (`draftgraph.runtime.bounds`): `SpeculativeConfig` refuses values past ``MAX_NUM_STEPS``
(64), ``MAX_TOPK`` (64) and ``MAX_NUM_DRAFT_TOKENS`` (1024); a worker refuses to build a state whose estimated bytes
(`draftgraph.runtime.worker.budget`) exceed ``RuntimeArgs.max_state_bytes`` (default
``DEFAULT_MAX_STATE_BYTES``, 1 GiB), before allocating anything.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any

import torch

from draftgraph.runtime.bounds import DEFAULT_MAX_STATE_BYTES, MAX_NUM_DRAFT_TOKENS, MAX_NUM_STEPS, MAX_TOPK
from draftgraph.runtime.tree_choices import Choices, StaticTopology, chain_choices, check_tree_choices

from .schedule import SpeculationSchedule
from .validation import (
    ConfigTypeError,
    require_int,
    require_optional_positive_int,
    require_positive_int,
)

__all__ = [
    "SpeculativeConfig",
    "PhaseGraphConfig",
    "CudaGraphConfig",
    "RuntimeArgs",
    "chain_capacity",
    "max_tree_candidates",
]


def max_tree_candidates(num_steps: int, topk: int) -> int:
    """Number of draft candidates a (S, k) draft produces: k + (S-1)*k^2."""
    return topk + (num_steps - 1) * topk * topk


def _check_max_tokens(n: int) -> None:
    if n > MAX_NUM_DRAFT_TOKENS:
        raise ValueError(f"num_draft_tokens={n!r}: must be <= MAX_NUM_DRAFT_TOKENS={MAX_NUM_DRAFT_TOKENS}")


@dataclass(frozen=True)
class SpeculativeConfig:
    """Draft shape: S = num_steps, k = topk, N = num_draft_tokens (verify width incl. the root).

    N defaults to S + 1 when topk == 1 (a chain); it is required for a dynamic tree (topk > 1).
    ``tree_choices`` (paths of child ranks, see `check_tree_choices`) makes the tree static; it
    is stored sorted by (depth, path) and N is derived from it. A chain (topk == 1) is the static
    tree ((0,), (0, 0), ..), its only valid tree: both spellings give one config (equal, with
    tree_choices None).

    Maxima (documented bounds, so no configuration allocates without one): num_steps <=
    ``MAX_NUM_STEPS`` (64), topk <= ``MAX_TOPK`` (64), num_draft_tokens <=
    ``MAX_NUM_DRAFT_TOKENS`` (1024, so at most 1023 tree_choices).
    """

    num_steps: int
    topk: int
    num_draft_tokens: int | None = None
    tree_choices: Choices | None = None

    def __post_init__(self) -> None:
        s = require_int("num_steps", self.num_steps)
        k = require_int("topk", self.topk)
        if s < 1:
            raise ValueError(f"num_steps={s!r}: must be >= 1")
        if k < 1:
            raise ValueError(f"topk={k!r}: must be >= 1")
        if s > MAX_NUM_STEPS:
            raise ValueError(f"num_steps={s!r}: must be <= MAX_NUM_STEPS={MAX_NUM_STEPS}")
        if k > MAX_TOPK:
            raise ValueError(f"topk={k!r}: must be <= MAX_TOPK={MAX_TOPK}")
        n = self.num_draft_tokens
        if n is not None:
            require_int("num_draft_tokens", n)
            _check_max_tokens(n)
        if self.tree_choices is not None:
            count = len(self.tree_choices) if isinstance(self.tree_choices, (list, tuple)) else None
            if count is not None and count + 1 > MAX_NUM_DRAFT_TOKENS:
                raise ValueError(f"tree_choices has {count} paths: num_draft_tokens = paths + 1 "
                                 f"must be <= MAX_NUM_DRAFT_TOKENS={MAX_NUM_DRAFT_TOKENS}")
            choices = check_tree_choices(self.tree_choices, s, k, n)
            _check_max_tokens(len(choices) + 1)
            object.__setattr__(self, "num_draft_tokens", len(choices) + 1)
            object.__setattr__(self, "tree_choices", None if k == 1 else choices)
            return
        if n is None:
            if k != 1:
                raise ValueError(
                    f"num_draft_tokens=None with topk={k}: required when topk > 1 "
                    f"(it defaults to num_steps + 1 only for a chain, topk == 1)"
                )
            n = s + 1
            object.__setattr__(self, "num_draft_tokens", n)
        require_int("num_draft_tokens", n)
        if n < 2:
            raise ValueError(f"num_draft_tokens={n!r}: must be >= 2 (the root plus at least one draft)")
        if k == 1 and n != s + 1:
            raise ValueError(
                f"num_draft_tokens={n!r} with topk=1 and num_steps={s}: a chain needs "
                f"num_draft_tokens == num_steps + 1 = {s + 1}"
            )
        bound = max_tree_candidates(s, k)
        if n - 1 > bound:
            raise ValueError(
                f"num_draft_tokens={n!r} with num_steps={s}, topk={k}: num_draft_tokens - 1 "
                f"must be <= topk + (num_steps - 1) * topk^2 = {bound}"
            )

    @property
    def is_chain(self) -> bool:
        """True for topk == 1 (then N == S + 1 by validation)."""
        return self.topk == 1

    @property
    def is_static(self) -> bool:
        """True when the topology is a constant of the config: a chain or tree_choices."""
        return self.topk == 1 or self.tree_choices is not None

    @functools.cached_property
    def topology(self) -> StaticTopology | None:
        """The static topology (the chain for topk == 1); None for a dynamic tree."""
        if self.tree_choices is not None:
            return StaticTopology(self.tree_choices)
        return StaticTopology(chain_choices(self.num_steps)) if self.topk == 1 else None

    @property
    def layout_topk(self) -> int:
        """The topk `build_tree` decodes this config's draft outputs with: 1 for a static
        layout (chain or static tree, DESIGN.md §8), topk for a dynamic tree."""
        return 1 if self.is_static else self.topk

    @property
    def key(self) -> tuple[int, int, int, Choices | None]:
        """Hashable (S, k, N, tree_choices) identity of the draft shape."""
        return (self.num_steps, self.topk, self.num_draft_tokens, self.tree_choices)

    def with_steps(self, num_steps: int, num_draft_tokens: int | None = None) -> SpeculativeConfig:
        """A copy with other S (and N; for a chain N follows S when not given).

        A static tree's depth is fixed by its tree_choices: changing it raises ValueError."""
        if self.tree_choices is not None and num_steps != self.num_steps:
            raise ValueError(
                f"num_steps={num_steps!r}: a static tree's depth is set by its tree_choices "
                f"(depth {self.num_steps}); build a config with new tree_choices instead"
            )
        if self.tree_choices is not None:
            return self
        if num_draft_tokens is None and self.topk != 1:
            num_draft_tokens = self.num_draft_tokens
        return SpeculativeConfig(num_steps, self.topk, num_draft_tokens)


@dataclass(frozen=True)
class PhaseGraphConfig:
    """Graph capture settings of one phase (decode): max batch size, explicit sizes, or off.

    ``bs`` is stored as a sorted tuple; when both are given ``max_bs`` must equal ``max(bs)``;
    when only ``bs`` is given ``max_bs`` is set to ``max(bs)``.
    """

    max_bs: int | None = None
    bs: tuple[int, ...] | None = None
    disabled: bool = False

    def __post_init__(self) -> None:
        require_optional_positive_int("cuda_graph_config.decode.max_bs", self.max_bs)
        if not isinstance(self.disabled, bool):
            raise ConfigTypeError(
                f"cuda_graph_config.decode.disabled={self.disabled!r}: must be a bool"
            )
        if self.bs is None:
            return
        if isinstance(self.bs, (str, bytes)) or not hasattr(self.bs, "__iter__"):
            raise ConfigTypeError(
                f"cuda_graph_config.decode.bs={self.bs!r}: must be a sequence of ints"
            )
        sizes = tuple(self.bs)
        for i, b in enumerate(sizes):
            require_positive_int(f"cuda_graph_config.decode.bs[{i}]", b)
        if not sizes:
            raise ValueError("cuda_graph_config.decode.bs=(): must not be empty (use disabled=True)")
        if list(sizes) != sorted(set(sizes)):
            raise ValueError(
                f"cuda_graph_config.decode.bs={list(sizes)!r}: must be sorted ascending and unique"
            )
        object.__setattr__(self, "bs", sizes)
        if self.max_bs is None:
            object.__setattr__(self, "max_bs", sizes[-1])
        elif self.max_bs != sizes[-1]:
            raise ValueError(
                f"cuda_graph_config.decode.max_bs={self.max_bs!r}: must equal max(bs)={sizes[-1]} "
                f"when bs={list(sizes)!r} is given"
            )


@dataclass(frozen=True)
class CudaGraphConfig:
    """Graph capture settings per phase; only decode is used by draftgraph."""

    decode: PhaseGraphConfig = field(default_factory=PhaseGraphConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.decode, PhaseGraphConfig):
            raise ConfigTypeError(
                f"cuda_graph_config.decode={self.decode!r}: must be a PhaseGraphConfig"
            )


@dataclass(frozen=True)
class RuntimeArgs:
    """Everything a draft worker needs: draft shape, graph settings, request pool, device, and
    ``max_state_bytes``: the most bytes a worker may allocate for one state (topology buffers,
    static graph inputs and outputs; estimated before allocating, see
    `draftgraph.runtime.worker.budget`), default ``DEFAULT_MAX_STATE_BYTES`` (1 GiB); raise it to
    serve larger configurations. ``schedule``: a `SpeculationSchedule` (S by batch size, for
    the engine; a worker serves ``speculative`` and ignores it)."""

    speculative: SpeculativeConfig
    cuda_graph_config: CudaGraphConfig | None = None
    max_running_requests: int | None = None
    device: str = "cpu"
    max_state_bytes: int = DEFAULT_MAX_STATE_BYTES
    schedule: SpeculationSchedule | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.speculative, SpeculativeConfig):
            raise ConfigTypeError(
                f"speculative={self.speculative!r}: must be a SpeculativeConfig"
            )
        if self.cuda_graph_config is not None and not isinstance(self.cuda_graph_config, CudaGraphConfig):
            raise ConfigTypeError(
                f"cuda_graph_config={self.cuda_graph_config!r}: must be a CudaGraphConfig or None"
            )
        require_optional_positive_int("max_running_requests", self.max_running_requests)
        require_positive_int("max_state_bytes", self.max_state_bytes)
        if self.schedule is not None:
            if not isinstance(self.schedule, SpeculationSchedule):
                raise ConfigTypeError(f"schedule={self.schedule!r}: must be a SpeculationSchedule or None")
        try:
            dev = torch.device(self.device)
        except (RuntimeError, TypeError) as exc:
            raise ValueError(f"device={self.device!r}: not a torch device ({exc})") from None
        object.__setattr__(self, "device", str(dev))

    @property
    def decode(self) -> PhaseGraphConfig:
        """The decode phase's graph settings (defaults when no cuda_graph_config is set)."""
        return self.cuda_graph_config.decode if self.cuda_graph_config else PhaseGraphConfig()

    def replace(self, **changes: Any) -> RuntimeArgs:
        """A validated copy with some fields changed."""
        return dataclasses.replace(self, **changes)


def chain_capacity(args: RuntimeArgs) -> int:
    """Rows of the chain buffers: max(decode.max_bs or 0, max_running_requests or 0, 1)."""
    return max(args.decode.max_bs or 0, args.max_running_requests or 0, 1)
