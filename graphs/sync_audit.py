"""Host reads of device values, found and counted: `no_host_sync` and `count_host_syncs`.

A tool for tests and benchmarks (both use it; scripts import nothing from tests/). Three nets,
from the Python surface down: `HostSyncGuard` (draftgraph's capture guard: ``.item()``,
``.tolist()``, ``bool(t)``, ``int(t)``, ..), a dispatch mode that sees every aten op (the scalar
read `HOST_SYNC_OP` however it is reached, and the ops whose output shape depends on values,
which sync on CUDA), and on CUDA torch's own sync debug mode ("error": any synchronizing call).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from .core.hostsync import HOST_SYNC_METHODS, HOST_SYNC_OP, HostSyncGuard

__all__ = ["SYNC_OPS", "count_host_syncs", "no_host_sync"]

# aten ops that read values on the host: the scalar read, and outputs sized by values
SYNC_OPS = frozenset({HOST_SYNC_OP, "aten.nonzero", "aten.masked_select", "aten._unique2",
                      "aten.unique_consecutive", "aten.unique_dim"})


class _SyncOps(TorchDispatchMode):
    """Records every aten op of ``SYNC_OPS`` that runs inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if name in SYNC_OPS:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


@contextmanager
def no_host_sync(cuda: bool | None = None) -> Iterator[None]:
    """Raise AssertionError (or HostSyncGuard's GraphCaptureError, at the read) when the block
    reads a device value on the host. ``cuda``: also torch's CUDA sync debug mode (default: when a
    CUDA device is available)."""
    cuda = torch.cuda.is_available() if cuda is None else cuda
    ops = _SyncOps()
    before = torch.cuda.get_sync_debug_mode() if cuda else 0
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
    try:
        with HostSyncGuard(0), ops:
            yield
    finally:
        if cuda:
            torch.cuda.set_sync_debug_mode(before)
    if ops.seen:  # a check's verdict, as pytest reads it (not an internal assumption)
        raise AssertionError(f"host syncs inside the block: {ops.seen}")


class _SyncCalls(TorchFunctionMode):
    """Records every Python-level host read (``.tolist()``, ``.item()``, ``int(t)``, ...)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = HOST_SYNC_METHODS.get(func)
        if name is not None:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


@contextmanager
def count_host_syncs() -> Iterator[list[str]]:
    """Yields a list that holds, once the block ends, one entry per host read inside it: the
    Python-level reads (``Tensor.tolist``, ``Tensor.__int__``, ...) and the aten ops of
    ``SYNC_OPS`` reached otherwise (a ``.tolist()`` is one read however many values it returns)."""
    calls, ops = _SyncCalls(), _SyncOps()
    found: list[str] = []
    with calls, ops:
        yield found
    scalar_reads = sum(1 for s in ops.seen if s == HOST_SYNC_OP)
    python_reads = len(calls.seen)
    found.extend(calls.seen)
    # a Python-level read reaches the scalar op too (item, int): count the op only beyond those
    found.extend([HOST_SYNC_OP] * max(0, scalar_reads - python_reads))
    found.extend(s for s in ops.seen if s != HOST_SYNC_OP)
