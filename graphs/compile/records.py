"""The compile backend's records: what replays a compiled size, and what one capture's compile came to.

`CompiledRunner` replaces a function that carried its state in attributes: it is called as the
recorded graph is (it ignores the arguments: it replays over its bound inputs) and names what
storing and timing it need. `CaptureOutcome` is what compiling one recorded size came to: the
runner, or why the size keeps its FX replay, and the seconds and compiles it took.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["CaptureOutcome", "CompiledRunner", "without_grad"]


@dataclass(frozen=True, eq=False)
class CompiledRunner:
    """The replay of one size: ``compiled`` over its bound ``inputs`` (static views, then the
    lifted ``constants``); ``raw``: its artifact bytes when a compile process made them (stored
    as they are); ``symbolic``: the one code of every size (its constants are its own)."""

    compiled: Callable[..., Any]
    inputs: tuple[Tensor, ...]
    constants: tuple[Tensor, ...]
    raw: bytes | None = None
    symbolic: bool = False

    def __call__(self, *_: Tensor) -> Any:
        with torch.no_grad():
            return self.compiled(*self.inputs)


@dataclass(frozen=True)
class CaptureOutcome:
    """One recorded size's compile: ``runner`` (None: the size keeps the FX replay, ``reason``
    says why), the ``seconds`` it took and the ``compiles`` it ran (0: loaded, or checked against
    the symbolic code)."""

    runner: CompiledRunner | None
    reason: str | None
    seconds: float
    compiles: int


def without_grad(compiled: Callable[..., Any]) -> Callable[..., Any]:
    """``compiled`` called under `torch.no_grad` (a stored graph's replay)."""
    def run(*inputs: Tensor) -> Any:
        with torch.no_grad():
            return compiled(*inputs)
    return run
