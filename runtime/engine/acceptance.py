"""Noticing a drafter that stops helping: mean acceptance over a window of recent steps.

A draft whose weights went wrong (lost across a release and resume, a bad checkpoint, a weight
sync that did not land) still drafts; every step verifies N tokens and accepts none, and the
server only runs slower. `AcceptanceMonitor` keeps the acceptance length of the last
``window_steps`` verify steps and logs one warning when their mean falls under
``min_accept_length`` (naming the mean, the window and the draft weights version), then stays
quiet until the mean recovers.

A head that does not fit its target (an EAGLE-3 head read as EAGLE-1, the wrong target layers,
another vocabulary) drafts just as well-formed tokens and accepts about none of them: the peers'
users lost weeks to it (acceptance length 1.00 with the wrong format, SGLang #21272; 1.2%
first-token acceptance with the wrong layers, vLLM #50170). The monitor also keeps the share of
requests whose first drafted token was accepted over the same window, and when it stays under
``min_first_token_rate`` (5%) logs one warning naming the likely causes, counted in
``misfit_warnings`` (exported as ``draftgraph_draft_misfit_warnings_total``).
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
    min_first_token_rate: float = 0.05  # share of requests whose first drafted token is accepted

    def __post_init__(self) -> None:
        rate = self.min_first_token_rate
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= rate <= 1.0:
            raise ValueError(f"min_first_token_rate={rate!r}: must be a number from 0.0 to 1.0 (a share of "
                             f"requests)")
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
        self._first: deque[tuple[int, int]] = deque(maxlen=watch.window_steps)  # (accepted, requests)
        self.low = False  # the window's mean is under the threshold now
        self.misfit = False  # the first drafted token's acceptance is under its threshold now
        self.warnings = 0
        self.misfit_warnings = 0
        self.last_warning: dict[str, Any] | None = None

    def observe(self, accept_length: float, weights_version: int,
                first_accepted: tuple[int, int] | None = None) -> None:
        """One verify step's mean acceptance length over its batch; ``first_accepted``: (requests
        whose first drafted token was accepted, requests drafted for) in that step."""
        if first_accepted is not None:
            self._observe_first(first_accepted)
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

    def first_token_rate(self) -> float | None:
        """The share of requests whose first drafted token was accepted over the window (None
        until the window is full or when nothing was drafted)."""
        first = self._first
        if len(first) < first.maxlen:
            return None
        requests = sum(n for _, n in first)
        return sum(a for a, _ in first) / requests if requests else None

    def _observe_first(self, first_accepted: tuple[int, int]) -> None:
        self._first.append(first_accepted)
        rate = self.first_token_rate()
        if rate is None:
            return
        if rate < self.watch.min_first_token_rate:
            if not self.misfit:
                self.misfit = True
                self.misfit_warnings += 1
                logger.warning(
                    "the draft head accepts about nothing: its first drafted token was accepted for %.1f%% of "
                    "requests over the last %d steps (under %.0f%%). Likely causes: the head does not fit this "
                    "target: the wrong format (an EAGLE-3 head read as EAGLE-1 or the reverse), the wrong target "
                    "layers for an EAGLE-3 head (SGLang counts a layer's output, vLLM its input: off by one), a "
                    "head trained for another model or tokenizer, or weights that were not loaded",
                    100 * rate, len(self._first), 100 * self.watch.min_first_token_rate)
        elif self.misfit:
            self.misfit = False
            logger.info("first drafted token acceptance recovered: %.1f%% over the last %d steps",
                        100 * rate, len(self._first))

    def as_dict(self) -> dict[str, Any]:
        """window_steps, min_accept_length, window_mean (None until the window is full), low,
        warnings, last_warning; first_token_rate, misfit, misfit_warnings."""
        full = len(self._window) == self._window.maxlen
        return {"window_steps": self.watch.window_steps, "min_accept_length": self.watch.min_accept_length,
                "window_mean": sum(self._window) / len(self._window) if full else None, "low": self.low,
                "warnings": self.warnings, "last_warning": self.last_warning,
                "min_first_token_rate": self.watch.min_first_token_rate,
                "first_token_rate": self.first_token_rate(), "misfit": self.misfit,
                "misfit_warnings": self.misfit_warnings}
