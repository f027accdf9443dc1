"""Validation helpers that raise errors naming the field, the value and the rule (never assert)."""

from __future__ import annotations

from typing import Any

__all__ = ["ConfigTypeError", "require_int", "require_positive_int", "require_optional_positive_int"]


class ConfigTypeError(TypeError, ValueError):
    """A configuration value has the wrong type; catchable as TypeError or ValueError."""


def require_int(field: str, value: Any) -> int:
    """Return ``value`` if it is a plain int (bool rejected), else raise ConfigTypeError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigTypeError(
            f"{field}={value!r} ({type(value).__name__}): must be an int"
        )
    return value


def require_positive_int(field: str, value: Any) -> int:
    """Return ``value`` if it is an int >= 1, else raise."""
    require_int(field, value)
    if value < 1:
        raise ValueError(f"{field}={value!r}: must be >= 1")
    return value


def require_optional_positive_int(field: str, value: Any) -> int | None:
    """Return ``value`` if it is None or an int >= 1, else raise."""
    if value is None:
        return None
    return require_positive_int(field, value)
