"""Shared builders for the tests: the default models (trained once, cached), their greedy
references, runtime arguments, engines and tiny draft workers.

Fixtures that need set-up and tear-down (`make_engine`, `make_worker`, `nvtx_off`,
`trained_models`, `python_O`) are in conftest.py and build with these functions; module-level
helpers and module-scoped fixtures call the functions directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from draftgraph.runtime import (
    CudaGraphConfig,
    EagleDraftWorker,
    PhaseGraphConfig,
    RuntimeArgs,
    SpeculativeConfig,
)
from draftgraph.runtime.engine import SpecDecodeEngine
from draftgraph.runtime.models import default_models, greedy_generate
from draftgraph.runtime.models.corpus import held_out_prompts
from draftgraph.runtime.testing import TinyDraftModel

MAX_NEW = 24


@lru_cache(maxsize=2)
def models(draft: str = "eagle"):
    return default_models(seed=0, draft=draft)


@lru_cache(maxsize=1)
def prompts() -> tuple[tuple[int, ...], ...]:
    """16 held-out prompts of varied lengths (8..96 bytes)."""
    return tuple(tuple(p) for p in held_out_prompts(16, seed=5, min_len=8, max_len=96))


@lru_cache(maxsize=1)
def reference() -> list[list[int]]:
    target, _ = models()
    return greedy_generate(target, [list(p) for p in prompts()], MAX_NEW)


def engine_args(spec: SpeculativeConfig | None = None, *, max_bs: int | None = 4,
                bs: Sequence[int] | None = None, running: int | None = 4, **kw: Any) -> RuntimeArgs:
    """RuntimeArgs for a test engine: ``spec`` (default a chain of 3), graphs up to ``max_bs``
    (or exactly the sizes ``bs``), ``running`` request slots; ``kw`` are further RuntimeArgs fields."""
    phase = PhaseGraphConfig(bs=tuple(bs)) if bs is not None else PhaseGraphConfig(max_bs=max_bs)
    return RuntimeArgs(spec or SpeculativeConfig(3, 1), CudaGraphConfig(phase), max_running_requests=running, **kw)


def build_engine(spec: SpeculativeConfig | None = None, *, args: RuntimeArgs | None = None,
                 backend: str = "eager", capture: str = "blocking", draft: str = "eagle",
                 max_bs: int | None = 4, bs: Sequence[int] | None = None, running: int | None = 4,
                 **engine_kw: Any) -> SpecDecodeEngine:
    """A SpecDecodeEngine over the default models (``draft``: "eagle" or "multi_layer"), with
    ``args`` or `engine_args` of the rest; ``capture="blocking"``: graphs from step 1."""
    target, head = models(draft)
    args = args if args is not None else engine_args(spec, max_bs=max_bs, bs=bs, running=running)
    return SpecDecodeEngine(args, target, head, backend=backend, capture=capture, **engine_kw)


def tiny_worker(spec: SpeculativeConfig | None = None, *, bs: Sequence[int] | None = (1, 2, 4),
                running: int | None = None, backend: str | None = "trace", device: str = "cpu",
                model: TinyDraftModel | None = None) -> EagleDraftWorker:
    """An EagleDraftWorker over a seeded TinyDraftModel (vocab 64, hidden 32) with graphs of the
    sizes ``bs`` captured by ``backend`` (None: nothing captured)."""
    args = RuntimeArgs(spec or SpeculativeConfig(3, 1),
                       CudaGraphConfig(PhaseGraphConfig(bs=tuple(bs))) if bs is not None else None,
                       max_running_requests=running, device=device)
    w = EagleDraftWorker(args, model or TinyDraftModel(vocab_size=64, hidden_size=32, seed=0, device=device))
    if backend is not None and backend != "eager":
        w.capture_graphs(backend)
    return w
