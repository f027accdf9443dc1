"""Debug-mode checks of draft inputs (``DRAFTGRAPH_DEBUG=1``), as SGLang's maybe_detect_oob /
maybe_detect_nan do: a bad id or a NaN stops at the worker with the request row named, instead
of an IndexError deep in the model (a device assert on CUDA) or a silent wrap of a negative id.
They read values on the host, so they run only in debug mode and never inside a captured step."""

from __future__ import annotations

from typing import Any

import torch

from draftgraph.runtime.settings import draft_checks
from draftgraph.runtime.topology.draft_rows import named_leaves

__all__ = ["debug_checks_enabled", "check_draft_values"]


def debug_checks_enabled() -> bool:
    """True when ``DRAFTGRAPH_DEBUG`` is set to a true value."""
    return draft_checks()


def _first_bad_row(bad: torch.Tensor) -> int:
    return int(bad.reshape(bad.shape[0], -1).any(1).nonzero()[0, 0])


def check_draft_values(topk_p: torch.Tensor, topk_index: torch.Tensor,
                       hidden: Any, vocab_size: int | None) -> None:
    """Token ids in [0, vocab_size) (>= 0 when the vocabulary is unknown), no NaN in topk_p or
    hidden_states (each float leaf of named rows); raises ValueError naming the field and the
    first bad request row."""
    high = vocab_size if vocab_size is not None else None
    bad = topk_index < 0 if high is None else (topk_index < 0) | (topk_index >= high)
    if bool(bad.any()):
        row = _first_bad_row(bad)
        rule = f"[0, {high})" if high is not None else ">= 0"
        raise ValueError(f"draft_input.topk_index row {row} = {topk_index[row].tolist()}: "
                         f"token ids must be in {rule}")
    for name, t in (("topk_p", topk_p), *named_leaves(hidden)):
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            nan = torch.isnan(t)
            if bool(nan.any()):
                raise ValueError(f"draft_input.{name} row {_first_bad_row(nan)}: contains NaN")
