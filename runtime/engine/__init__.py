"""The lossless speculative-decoding engine: the component's first user (DESIGN.md §7)."""

from __future__ import annotations

from .acceptance import AcceptanceWatch
from .engine import MAX_VERIFY_WIDTH, SpecDecodeEngine
from .requests import Request, RequestFailed
from .verify import Acceptance, accept, verify_mask

__all__ = ["Acceptance", "AcceptanceWatch", "MAX_VERIFY_WIDTH", "Request", "RequestFailed", "SpecDecodeEngine",
           "accept", "verify_mask"]
