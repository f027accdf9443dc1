"""One compile per step, not per size (the default): record with a symbolic batch dimension.

`record_symbolic` records a flat step once with dim 0 of every static input symbolic (a
`FakeTensorMode` with a `ShapeEnv`; the tensors the step closes over stay real constants), and
`compile_symbolic` compiles that graph once with inductor
(``standalone_compile(dynamic_shapes="from_graph")``). The compile backend then replays the one
compiled function at every captured size, checked bitwise per size against that size's own
FX recording (`isolated_world`, `worlds_differ`); the compile may run in the compile process
(`compile_worker`), and the code is stored once for every size (`compiled_entry.entry_key` with
no size). ``DRAFTGRAPH_COMPILE_SYMBOLIC=0`` compiles each size on its own instead. Measured on the default EAGLE draft
forwards (scripts/symbolic_probe.py): bitwise equal to per-size code, +5..+20% per replay.

`isolated_world` copies every distinct storage the inputs use once, and rebuilds each input as
the same view of its copy: two graphs whose inputs alias differently (a per-size recording
holds a ``[:b]`` view of a constant, the symbolic one the whole tensor) can then be run on
separate copies and compared storage by storage, never touching live memory.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, fx

from .cancel import check_cancelled
from .hostsync import HostSyncGuard
from .protocol import FlatStep

__all__ = ["compile_symbolic", "isolated_world", "record_symbolic", "symbolic_default", "worlds_differ"]

_ENV = "DRAFTGRAPH_COMPILE_SYMBOLIC"


def symbolic_default() -> bool:
    """``DRAFTGRAPH_COMPILE_SYMBOLIC`` ("1"/"0", default "1") as a bool (ValueError otherwise)."""
    value = os.environ.get(_ENV, "1").strip() or "1"
    if value not in ("0", "1"):
        raise ValueError(f"{_ENV}={value!r}: must be '0' or '1'")
    return value == "1"


def record_symbolic(fn: FlatStep, args: Sequence[Tensor], hint: int, size: int
                    ) -> tuple[fx.GraphModule, list[Tensor]]:
    """make_fx ``fn`` with dim 0 of each of ``args`` symbolic (example size ``hint`` >= 2, so the
    symbol is not specialized to 0 or 1), under the host-sync guard; (graph, fake inputs).
    Call with the recording lock held."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    if hint < 2:
        raise ValueError(f"hint={hint}: must be >= 2 (sizes 0 and 1 specialize)")
    check_cancelled(size)  # setting up symbols makes no torch call the guard would see
    mode = FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True)
    mode.cache_enabled = False  # its dispatch cache is process-wide: entries of each record stayed
    fakes = []
    for a in args:
        if a.dim() == 0:
            raise ValueError("a static input has no batch dimension")
        like = torch.empty_strided((hint, *a.shape[1:]), a.stride(), dtype=a.dtype, device=a.device)
        context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] + [DimDynamic.STATIC] * (a.dim() - 1))
        fakes.append(mode.from_tensor(like, symbolic_context=context))

    def traced(*static: Tensor) -> tuple[Tensor, ...]:
        with HostSyncGuard(size):
            return fn(*static)

    with mode:
        gm = make_fx(traced, tracing_mode="fake", _allow_non_fake_inputs=True)(*fakes)
    return gm, fakes


def compile_symbolic(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Inductor's one compile of a symbolic graph (fake inputs, then real constants)."""
    from torch._inductor import standalone_compile

    from .aten_reductions import register_inductor_lowerings

    register_inductor_lowerings()
    return standalone_compile(gm, example_inputs, dynamic_shapes="from_graph")


def isolated_world(tensors: Sequence[Tensor]) -> tuple[list[Tensor], dict[int, Tensor]]:
    """``tensors`` rebuilt over fresh copies of their storages (one copy per distinct storage,
    so aliasing is kept); (the rebuilt tensors, original storage address -> its copy as uint8)."""
    copies: dict[int, Any] = {}
    flat: dict[int, Tensor] = {}
    rebuilt: list[Tensor] = []
    for t in tensors:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key not in copies:
            copies[key] = storage.clone()
            flat[key] = torch.empty(0, dtype=torch.uint8, device=t.device).set_(copies[key])
        view = torch.empty(0, dtype=t.dtype, device=t.device)
        view.set_(copies[key], t.storage_offset(), t.size(), t.stride())
        rebuilt.append(view)
    return rebuilt, flat


def worlds_differ(want: dict[int, Tensor], got: dict[int, Tensor]) -> str | None:
    """Which storage both worlds copied differs bytewise after the step (None when all are equal);
    a storage only one side reads (a constant only one recording made) is not compared."""
    for key in want.keys() & got.keys():
        a, b = want[key], got[key]
        if a.shape != b.shape or not torch.equal(a, b):
            return f"a storage of {a.numel()} bytes differs after the step"
    return None
