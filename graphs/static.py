"""Owner of a manager's static input buffers: validation, batch loading and padding.

Every buffer is an input (copied into before each replay). The graphs read the first
``size`` rows of each; a batch of b rows is copied into rows [0, b) and rows
[b, padded) are filled with the input's pad value. The buffers must not be rebound,
resized or freed while a graph captured over them lives (debug mode checks this).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import torch
from torch import Tensor

__all__ = ["StaticInputs"]

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

    def load(self, inputs: Mapping[str, Tensor], b: int, padded: int) -> None:
        """Copy the batch into rows [0, b) and fill rows [b, padded) with the pad values."""
        for name in self.names:
            static = self.tensors[name]
            static[:b].copy_(inputs[name])
            if padded > b:
                static[b:padded].fill_(self.pads[name])
