"""StepCalls: a manager's step called the way backends call it, with its output structure held.

Backends call ``fn(*views)`` over the static inputs in name order and want a flat tuple of
tensors back; the user's step takes named inputs and returns a tensor or a tuple. The warm-up
call records which it is and how many outputs; every captured call must repeat that structure
(TypeError otherwise), because replay rebuilds the step's result from the graph's flat outputs.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from .core.protocol import flatten_outputs

__all__ = ["StepCalls"]


class StepCalls:
    """The step ``step(**inputs)`` adapted to positional views, and its structure from warm-up:
    ``single`` (it returns one tensor, not a tuple) and ``n_outputs``."""

    __slots__ = ("n_outputs", "names", "single", "step")

    def __init__(self, step: Callable[..., object], names: tuple[str, ...]) -> None:
        self.step = step
        self.names = names
        self.single = False
        self.n_outputs = 0

    def _call(self, args: tuple[Tensor, ...]) -> tuple[tuple[Tensor, ...], bool]:
        """Call the step with positional static views bound to their names; (flat outputs, single)."""
        return flatten_outputs(self.step(**dict(zip(self.names, args))))

    def warm(self, *args: Tensor) -> tuple[Tensor, ...]:
        """Warm-up call: records the output structure every capture must repeat."""
        flat, self.single = self._call(args)
        self.n_outputs = len(flat)
        return flat

    def flat(self, *args: Tensor) -> tuple[Tensor, ...]:
        """Captured call: the step's outputs as a flat tuple, same structure as at warm-up."""
        flat, single = self._call(args)
        if (len(flat), single) != (self.n_outputs, self.single):
            raise TypeError(
                f"step returned {len(flat)} output(s) (single={single}) at size {args[0].shape[0]}, "
                f"but {self.n_outputs} (single={self.single}) at warm-up: the structure must not change"
            )
        return flat
