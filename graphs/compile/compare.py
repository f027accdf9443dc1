"""Run the recorded graph and its compiled code on copies of the same inputs, and compare bitwise.

Before compiled code replaces a size's FX replay, both run once on separate copies of the same
inputs (static inputs and every captured constant, lifted to graph inputs by `lift_constants`)
and must agree bitwise: every output and every in-place write into an input. The copies mean
the check never touches memory a serving step may be using.

Two ways to copy: `copies` clones each tensor (a per-size compile takes the same inputs as its
recording), `isolated_world` copies each distinct storage once and rebuilds every input as the
same view of its copy, so two graphs whose inputs alias differently (a per-size recording holds
a ``[:b]`` view of a constant, the symbolic code the whole tensor) can run on separate copies
and be compared storage by storage (`worlds_differ`). `compare_on_copies` and
`compare_on_worlds` are the two checks; `first_difference` names what differs.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, fx

from ..core.backend_trace import evict_fx_sources

__all__ = ["compare_on_copies", "compare_on_worlds", "copies", "first_difference", "isolated_world",
           "lift_constants", "shares_storage", "worlds_differ"]


def lift_constants(gm: fx.GraphModule) -> tuple[fx.GraphModule, tuple[Tensor, ...]]:
    """A copy of ``gm`` whose captured tensors (get_attr nodes) are extra inputs after the
    static ones, and those tensors in order: the compiled function then reads them as
    arguments, so it can be checked on copies and run on the real ones."""
    graph = copy.deepcopy(gm.graph)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    anchor = placeholders[-1] if placeholders else None
    lifted: dict[str, fx.Node] = {}
    tensors: list[Tensor] = []
    for node in list(graph.nodes):
        if node.op != "get_attr":
            continue
        target = str(node.target)
        value = getattr(gm, target)
        if not isinstance(value, Tensor):
            raise TypeError(f"captured constant {target} is a {type(value).__name__}, not a tensor")
        if target not in lifted:
            if anchor is None:
                with graph.inserting_before(next(iter(graph.nodes))):
                    anchor = graph.placeholder(f"const_{len(tensors)}")
            else:
                with graph.inserting_after(anchor):
                    anchor = graph.placeholder(f"const_{len(tensors)}")
            lifted[target] = anchor
            tensors.append(value)
        node.replace_all_uses_with(lifted[target])
        graph.erase_node(node)
    graph.lint()
    module = fx.GraphModule(torch.nn.Module(), graph)
    evict_fx_sources({module.forward.__code__.co_filename})  # runs without them; FX would keep them
    return module, tuple(tensors)


def shares_storage(tensors: tuple[Tensor, ...]) -> bool:
    """True when two inputs share memory (the compiled function would assume they do not)."""
    seen: set[int] = set()
    for t in tensors:
        try:
            key = t.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):
            return True
        if key == 0 and t.numel() == 0:
            continue
        if key in seen:
            return True
        seen.add(key)
    return False


def copies(tensors: Sequence[Tensor]) -> list[Tensor]:
    """Fresh copies with the same values, shapes and strides."""
    return [t.clone() for t in tensors]


def first_difference(name: str, want: Sequence[Tensor], got: Sequence[Any]) -> str | None:
    """Where ``got`` differs from ``want`` bitwise (dtype, shape or a value); None when equal."""
    if len(want) != len(got):
        return f"{name}: {len(got)} tensors, expected {len(want)}"
    for i, (a, b) in enumerate(zip(want, got)):
        if not isinstance(b, Tensor) or a.dtype != b.dtype or a.shape != b.shape:
            kind = type(b).__name__ if not isinstance(b, Tensor) else f"{b.dtype} {tuple(b.shape)}"
            return f"{name} {i}: {kind}, expected {a.dtype} {tuple(a.shape)}"
        if not torch.equal(a, b) and not (a.is_floating_point() and torch.equal(a.isnan(), b.isnan())
                                          and torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))):
            return f"{name} {i}: values differ"
    return None


def isolated_world(tensors: Sequence[Tensor]) -> tuple[list[Tensor], dict[int, Tensor]]:
    """``tensors`` rebuilt over fresh copies of their storages (one copy per distinct storage,
    so aliasing is kept); (the rebuilt tensors, original storage address -> its copy as uint8)."""
    storages: dict[int, Any] = {}
    flat: dict[int, Tensor] = {}
    rebuilt: list[Tensor] = []
    for t in tensors:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key not in storages:
            storages[key] = storage.clone()
            flat[key] = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storages[key])
        view = torch.empty(0, dtype=t.dtype, device=t.device)
        view.set_(storages[key], t.storage_offset(), t.size(), t.stride())
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


def _as_tuple(out: Any) -> tuple[Any, ...]:
    return (out,) if isinstance(out, Tensor) else tuple(out)


def compare_on_copies(reference: Callable[..., Any], compiled: Callable[..., Any], inputs: Sequence[Tensor]
                      ) -> str | None:
    """Run ``reference`` and ``compiled`` on two copies of one snapshot of ``inputs``; what differs
    (outputs, or an input after the step), else None. One snapshot copied twice: serving may
    write the live cache between two copies of it (seen beside serving: "input after the step 17:
    values differ" at size 4). Call under `torch.no_grad`."""
    snapshot = copies(inputs)
    want_in = copies(snapshot)
    got_in = copies(snapshot)
    want = _as_tuple(reference(*want_in))
    got = _as_tuple(compiled(*got_in))
    return first_difference("output", want, got) or first_difference("input after the step", want_in, got_in)


def compare_on_worlds(reference: Callable[..., Any], reference_inputs: Sequence[Tensor],
                      compiled: Callable[..., Any], compiled_inputs: Sequence[Tensor], shared: int) -> str | None:
    """Run ``reference`` over ``reference_inputs`` and ``compiled`` over ``compiled_inputs``, each in
    an `isolated_world` of one snapshot of all of them (the first ``shared`` inputs are common to
    both: the static rows); what differs (outputs, or a storage both read), else None. Exceptions
    of either run propagate. Call under the recording lock and `torch.no_grad`."""
    own = list(reference_inputs[shared:])
    theirs = list(compiled_inputs[shared:])
    snapshot, _ = isolated_world((*reference_inputs[:shared], *own, *theirs))  # one snapshot, copied twice
    n, m = shared, len(own)
    want_in, want_mem = isolated_world(snapshot[:n + m])
    got_in, got_mem = isolated_world((*snapshot[:n], *snapshot[n + m:]))
    want = _as_tuple(reference(*want_in))
    got = _as_tuple(compiled(*got_in))
    return first_difference("output", want, got) or worlds_differ(want_mem, got_mem)
