"""`PhaseKey`: the name of one captured host phase at one KV tier ("verify@512"), as a typed value.

The engine's phases build their graphs' names here and the worker's reports read them back
here: the ``kind@tier`` text is written and split in this module only. The text itself stays the
name the managers, the reports and ``/metrics`` show (a dict key, unchanged).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PhaseKey"]

_SEP = "@"


@dataclass(frozen=True)
class PhaseKey:
    """``kind``: the phase ("verify", "extend"); ``tier``: the KV window (positions) its graphs
    attend over."""

    kind: str
    tier: int

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or not self.kind or _SEP in self.kind:
            raise ValueError(f"kind={self.kind!r}: must be a non-empty str without {_SEP!r}")
        if isinstance(self.tier, bool) or not isinstance(self.tier, int) or self.tier < 1:
            raise ValueError(f"tier={self.tier!r}: must be an int >= 1")

    @property
    def name(self) -> str:
        """The phase's name: ``kind@tier``."""
        return f"{self.kind}{_SEP}{self.tier}"

    @classmethod
    def parse(cls, name: str) -> PhaseKey:
        """The key a `name` came from; ValueError naming it when it is not ``kind@tier``."""
        kind, sep, tier = name.partition(_SEP)
        if not sep or not tier.isdigit():
            raise ValueError(f"phase name {name!r}: must be kind@tier (e.g. 'verify@512')")
        return cls(kind, int(tier))
