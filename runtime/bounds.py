"""The documented bounds of a configuration, below every module that checks them.

`config.SpeculativeConfig` refuses values past ``MAX_NUM_STEPS``, ``MAX_TOPK`` and
``MAX_NUM_DRAFT_TOKENS``; `schedule.SpeculationSchedule` refuses step counts past
``MAX_NUM_STEPS``; ``RuntimeArgs.max_state_bytes`` defaults to ``DEFAULT_MAX_STATE_BYTES``.
This module imports nothing of draftgraph, so config.py, schedule.py and sglang/config.py all
read the same figures without importing each other.
"""

from __future__ import annotations

__all__ = ["DEFAULT_MAX_STATE_BYTES", "MAX_NUM_DRAFT_TOKENS", "MAX_NUM_STEPS", "MAX_TOPK"]

MAX_NUM_STEPS = 64  # draft depth S; EAGLE serves 1..8, SGLang's largest presets stay below 16
MAX_TOPK = 64  # branching k per step
MAX_NUM_DRAFT_TOKENS = 1024  # verify width N (root included); a static tree has N - 1 paths
DEFAULT_MAX_STATE_BYTES = 1 << 30  # a worker state's estimated bytes (RuntimeArgs.max_state_bytes)
