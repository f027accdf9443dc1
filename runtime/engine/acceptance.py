"""Noticing a drafter that stops helping: mean acceptance over a window of recent steps.

A draft whose weights went wrong (lost across a release and resume, a bad checkpoint, a weight
sync that did not land) still drafts; every step verifies N tokens and accepts none, and the
server only runs slower. `AcceptanceMonitor` keeps the acceptance length of the last
``window_steps`` verify steps and logs one warning when their mean falls under
``min_accept_length`` (naming the mean, the window and the draft weights version), then stays
quiet until the mean recovers.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Any

__all__ = ["AcceptanceWatch", "AcceptanceMonitor"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AcceptanceWatch:
    """When to warn: the mean acceptance length (tokens committed per request per verify step,
    the bonus token included: 1.0 means no draft token accepted) over the last ``window_steps``
    verify steps under ``min_accept_length``. The defaults flag a drafter that accepts about one
    draft token in ten steps or fewer."""

    window_steps: int = 64
    min_accept_length: float = 1.1

    def __post_init__(self) -> None:
        if isinstance(self.window_steps, bool) or not isinstance(self.window_steps, int) or self.window_steps < 1:
            raise ValueError(f"window_steps={self.window_steps!r}: must be an int >= 1")
        if isinstance(self.min_accept_length, bool) or not isinstance(self.min_accept_length, (int, float)) \
                or not self.min_accept_length >= 1.0:
            raise ValueError(f"min_accept_length={self.min_accept_length!r}: must be a number >= 1.0 "
                             f"(1.0: nothing accepted)")


class AcceptanceMonitor:
    """Applies an `AcceptanceWatch` to the engine's verify steps."""

    def __init__(self, watch: AcceptanceWatch) -> None:
        if not isinstance(watch, AcceptanceWatch):
            raise TypeError(f"acceptance_watch={type(watch).__name__}: must be an AcceptanceWatch")
        self.watch = watch
        self._window: deque[float] = deque(maxlen=watch.window_steps)
        self.low = False  # the window's mean is under the threshold now
        self.warnings = 0
        self.last_warning: dict[str, Any] | None = None

    def observe(self, accept_length: float, weights_version: int) -> None:
        """One verify step's mean acceptance length over its batch."""
        window = self._window
        window.append(accept_length)
        if len(window) < window.maxlen:
            return
        mean = sum(window) / len(window)
        if mean < self.watch.min_accept_length:
            if not self.low:
                self.low = True
                self.warnings += 1
                self.last_warning = {"accept_length": mean, "window_steps": len(window),
                                     "weights_version": weights_version}
                logger.warning("draft acceptance is low: mean acceptance length %.3f over the last %d "
                               "steps (under %.2f; 1.0 = no draft token accepted), draft weights "
                               "version %d: the drafter no longer helps (wrong or lost weights?)",
                               mean, len(window), self.watch.min_accept_length, weights_version)
        elif self.low:
            self.low = False
            logger.info("draft acceptance recovered: mean acceptance length %.3f over the last %d steps",
                        mean, len(window))

    def as_dict(self) -> dict[str, Any]:
        """window_steps, min_accept_length, window_mean (None until the window is full), low,
        warnings, last_warning."""
        full = len(self._window) == self._window.maxlen
        return {"window_steps": self.watch.window_steps, "min_accept_length": self.watch.min_accept_length,
                "window_mean": sum(self._window) / len(self._window) if full else None, "low": self.low,
                "warnings": self.warnings, "last_warning": self.last_warning}
