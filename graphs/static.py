"""Owner of a manager's static input buffers: validation, batch loading and padding.

Every buffer is an input (copied into before each replay). The graphs read the first
``size`` rows of each; a batch of b rows is copied into rows [0, b) and rows
[b, padded) are filled with the input's pad value. The buffers must not be rebound,
resized or freed while a graph captured over them lives (debug mode checks this).

The replay path is host work a graph exists to remove, so it is prepared once per batch
size: a `LoadPlan` holds the row views to copy into, the pad views and the exact shape,
dtype and device every input must have, and `LoadPlan.match` checks a batch against it
with identity and equality tests only. Anything it does not accept goes to the full
check (`StaticInputs.batch_size`), which names what is wrong.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from types import MappingProxyType

import torch
from torch import Tensor

__all__ = ["LoadPlan", "StaticInputs"]

PadValue = int | float | bool


def _check_pad_values(names: tuple[str, ...], pad_values: Mapping[str, PadValue] | None) -> dict[str, PadValue]:
    """Pad value per input (default 0), rejecting unknown names and non-numbers."""
    pads: dict[str, PadValue] = dict.fromkeys(names, 0)
    if pad_values is None:
        return pads
    if not isinstance(pad_values, Mapping):
        raise TypeError(f"pad_values={pad_values!r}: must be a mapping of input name to number")
    for name, value in pad_values.items():
        if name not in pads:
            raise ValueError(f"pad_values[{name!r}]: no static input of that name (inputs: {list(names)})")
        if not isinstance(value, (int, float, bool)):
            raise TypeError(f"pad_values[{name!r}]={value!r}: must be an int, float or bool")
        pads[name] = value
    return pads


def _tuple_getter(names: tuple[str, ...]) -> Callable[[Mapping[str, Tensor]], tuple[Tensor, ...]]:
    """``inputs -> tuple of inputs[name]`` in ``names`` order (itemgetter, a 1-tuple for one name)."""
    if len(names) > 1:
        return operator.itemgetter(*names)
    name = names[0]
    return lambda inputs: (inputs[name],)


class StaticInputs:
    """Named static input tensors allocated at ``rows`` (the largest capture size) or more."""

    def __init__(self, tensors: Mapping[str, Tensor], pad_values: Mapping[str, PadValue] | None, rows: int) -> None:
        if not isinstance(tensors, Mapping) or not tensors:
            raise ValueError(f"static_inputs={tensors!r}: must be a non-empty mapping of name to tensor")
        for name, t in tensors.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise ValueError(f"static_inputs key {name!r}: must be a str usable as a keyword argument")
            if not isinstance(t, Tensor):
                raise TypeError(f"static_inputs[{name!r}] is {type(t).__name__}: must be a torch.Tensor")
            if t.dim() == 0 or t.shape[0] < rows:
                raise ValueError(
                    f"static_inputs[{name!r}] has shape {tuple(t.shape)}: dim 0 must be >= the largest "
                    f"capture size {rows}"
                )
        self.names: tuple[str, ...] = tuple(tensors)
        self.tensors: Mapping[str, Tensor] = MappingProxyType(dict(tensors))
        self.pads = _check_pad_values(self.names, pad_values)
        self._get = _tuple_getter(self.names)

    def plan(self, b: int, padded: int) -> LoadPlan:
        """The prepared load of a batch of ``b`` rows into a graph of ``padded`` rows."""
        if not 1 <= b <= padded or padded > min(t.shape[0] for t in self.tensors.values()):
            raise ValueError(f"plan(b={b}, padded={padded}): need 1 <= b <= padded <= the static rows")
        return LoadPlan(self, b, padded)

    @property
    def device(self) -> torch.device:
        """Device of the first static input."""
        return self.tensors[self.names[0]].device

    def devices(self) -> set[torch.device]:
        """Every device the static inputs live on."""
        return {t.device for t in self.tensors.values()}

    def views(self, size: int) -> tuple[Tensor, ...]:
        """The first ``size`` rows of each static input, in name order."""
        return tuple(self.tensors[n][:size] for n in self.names)

    def shadow_views(self, size: int) -> tuple[Tensor, ...]:
        """Pad-filled stand-ins for `views(size)` (new tensors, same shapes, strides and dtypes):
        recording a step over them never reads or writes the live rows, so a capture can run
        beside serving and the recorded graph then replays over `views(size)`."""
        out = []
        for n in self.names:
            base = self.tensors[n]
            twin = torch.empty_strided(base.size(), base.stride(), dtype=base.dtype, device=base.device)
            twin.fill_(self.pads[n])
            out.append(twin[:size])
        return tuple(out)

    def clones(self, size: int) -> dict[str, Tensor]:
        """Copies of the first ``size`` rows of each static input."""
        return {n: self.tensors[n][:size].clone() for n in self.names}

    def data_ptrs(self) -> dict[str, int]:
        """``data_ptr()`` of each static input."""
        return {n: t.data_ptr() for n, t in self.tensors.items()}

    def batch_size(self, inputs: Mapping[str, Tensor]) -> int:
        """Validate a batch against the static inputs (names, trailing shape, dtype, device); return b."""
        if not isinstance(inputs, Mapping):
            raise TypeError(f"inputs is {type(inputs).__name__}: must be a mapping of name to tensor")
        missing = [n for n in self.names if n not in inputs]
        extra = [n for n in inputs if n not in self.tensors]
        if missing or extra:
            raise ValueError(f"inputs: missing {missing}, unexpected {extra}; expected names {list(self.names)}")
        rows = {n: self._check_one(n, inputs[n]) for n in self.names}
        b = rows[self.names[0]]
        if any(r != b for r in rows.values()):
            raise ValueError(f"inputs: batch sizes (dim 0) differ across inputs: {rows}; all must be equal")
        if b == 0:
            raise ValueError("inputs: batch size b=0: a batch must have at least one row")
        return b

    def _check_one(self, name: str, t: object) -> int:
        """Rows of input ``name`` after checking its type, trailing shape, dtype and device."""
        ref = self.tensors[name]
        if not isinstance(t, Tensor):
            raise TypeError(f"inputs[{name!r}] is {type(t).__name__}: must be a torch.Tensor")
        if t.dim() != ref.dim() or t.shape[1:] != ref.shape[1:]:
            raise ValueError(
                f"inputs[{name!r}] has shape {tuple(t.shape)}: must be b rows of trailing shape "
                f"{tuple(ref.shape[1:])} like the static input {tuple(ref.shape)}"
            )
        if t.dtype != ref.dtype:
            raise TypeError(f"inputs[{name!r}] has dtype {t.dtype}: must be {ref.dtype} like the static input")
        if t.device != ref.device:
            raise ValueError(f"inputs[{name!r}] is on {t.device}: must be on {ref.device} like the static input")
        return t.shape[0]

    def ordered(self, inputs: Mapping[str, Tensor]) -> tuple[Tensor, ...]:
        """The batch's tensors in name order (after `batch_size` accepted it)."""
        return tuple(inputs[n] for n in self.names)


class LoadPlan:
    """One batch size's load, prepared once: row views [0, b), pad views [b, padded) and checks.

    ``match(inputs)`` is the replay path's whole input check: an exact ``dict`` holding the
    static names and nothing else, each value an exact ``torch.Tensor`` of shape
    (b, *trailing), the static input's dtype and device. It returns the tensors in name
    order, or None for anything else (then the caller runs the full check, which either
    raises naming the problem or accepts an unusual but valid batch, e.g. a tensor
    subclass or another mapping type).
    """

    __slots__ = ("_get", "_n", "_specs", "b", "pads", "padded", "rows")

    def __init__(self, static: StaticInputs, b: int, padded: int) -> None:
        self.b = b
        self.padded = padded
        self.rows: tuple[Tensor, ...] = tuple(static.tensors[n][:b] for n in static.names)
        self.pads: tuple[tuple[Tensor, PadValue], ...] = tuple(
            (static.tensors[n][b:padded], static.pads[n]) for n in static.names
        ) if padded > b else ()
        self._specs = tuple(
            ((b, *t.shape[1:]), t.dtype, t.device) for t in map(static.tensors.__getitem__, static.names)
        )
        self._n = len(static.names)
        self._get = _tuple_getter(static.names)

    def match(self, inputs: object) -> tuple[Tensor, ...] | None:
        """The batch's tensors in name order if it passes every check exactly, else None."""
        if type(inputs) is not dict or len(inputs) != self._n:
            return None
        try:
            tensors = self._get(inputs)
        except KeyError:
            return None
        for t, (shape, dtype, device) in zip(tensors, self._specs):
            if type(t) is not Tensor or t.shape != shape or t.dtype is not dtype or t.device != device:
                return None
        return tensors

    def load(self, tensors: tuple[Tensor, ...]) -> None:
        """Copy the batch (name order) into rows [0, b) and fill rows [b, padded) with pad values."""
        for row, t in zip(self.rows, tensors):
            row.copy_(t)
        for view, value in self.pads:
            view.fill_(value)
