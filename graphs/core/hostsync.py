"""Guard that rejects host reads of device values (``.item()``, ``.tolist()``, ``bool(t)``) inside a capture."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from .cancel import CaptureCancelled, cancel_requested
from .errors import GraphCaptureError

__all__ = ["HOST_SYNC_METHODS", "HOST_SYNC_OP", "HostSyncGuard", "host_sync_message"]

HOST_SYNC_OP = "aten._local_scalar_dense"
"""The aten op every scalar read from a tensor goes through."""

_T = torch.Tensor
HOST_SYNC_METHODS: dict[Callable[..., Any], str] = {
    _T.item: "Tensor.item",
    _T.tolist: "Tensor.tolist",
    _T.__bool__: "Tensor.__bool__",
    _T.__int__: "Tensor.__int__",
    _T.__float__: "Tensor.__float__",
    _T.__index__: "Tensor.__index__",
    _T.__complex__: "Tensor.__complex__",
    _T.numpy: "Tensor.numpy",
}
"""The Python-level calls that read a tensor's values on the host, by the name errors use."""


def host_sync_message(op: str, size: int) -> str:
    """The capture error text for a host sync ``op`` at batch ``size``."""
    return (
        f"host sync `{HOST_SYNC_OP}` (.item()/.tolist()/bool(tensor)) inside a captured step "
        f"at size {size}: `{op}` reads a device value on the host, which a graph cannot replay; "
        "keep the value on the device (torch.where, masks) or move the read out of the step"
    )


class HostSyncGuard(TorchFunctionMode):
    """TorchFunctionMode raising GraphCaptureError on a host read of a tensor value.

    ``make_fx`` in real mode lets ``.tolist()`` through silently (the values get baked)
    and a CUDA capture dies with an opaque driver error, so the guard catches the
    Python-level calls first and names them.
    """

    def __init__(self, size: int) -> None:
        super().__init__()
        self._size = size

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if cancel_requested():  # the capture thread was told to stop (`graphs.cancel`)
            raise CaptureCancelled(f"capture at size {self._size} cancelled", size=self._size)
        op = HOST_SYNC_METHODS.get(func)
        if op is not None:
            raise GraphCaptureError(host_sync_message(op, self._size), size=self._size)
        return func(*args, **(kwargs or {}))
