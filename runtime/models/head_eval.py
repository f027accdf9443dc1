"""Held-out acceptance of an EAGLE-3 head: the engine's greedy chain, simulated exactly.

A chain step with S drafts, in the engine, starts where the head has extended through position
t (the target's features there, the last committed token at t + 1): the head drafts tokens
t + 2 .. t + 1 + S (draft k fed its own state and draft k - 1), the target accepts the longest
prefix equal to its own greedy tokens and adds one (the bonus), so the step emits a + 1 tokens
and the next step starts at t + a + 1. Here the target's greedy answer is known, so draft k at
row t is compared with the answer's token t + 2 + k under teacher forcing, which is exact: a
draft is only looked at when every draft before it in its step matched the answer, so its
inputs are the ones the engine gives it. The walk starts where the engine's first step does
(after the prompt's prefill and its first token) and ends at the answer's last token.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .eagle_heads import Eagle3Head
from .head_data import Sample

__all__ = ["accept_length", "draft_matches"]


@torch.no_grad()
def draft_matches(head: Eagle3Head, sample: Sample, steps: int) -> torch.Tensor:
    """matches [steps, n] bool: draft pass k at row t proposes the answer's token t + 2 + k
    (False where that token is past the end)."""
    width = head.cfg.feature_width
    n = sample.features.shape[0]
    feats = sample.features[None, :, :width].float()
    outs = head.unroll(feats, sample.tokens[None, 1:], steps)
    ids = torch.arange(head.cfg.draft_vocab_size) + head.d2t
    out = torch.zeros(steps, n, dtype=torch.bool)
    for k, o in enumerate(outs):
        rows = max(0, n - 1 - k)  # row t needs token t + 2 + k <= n
        if rows:
            pred = ids[head.lm_head(head.norm(o[0, :rows])).argmax(-1)]
            out[k, :rows] = pred == sample.tokens[2 + k:2 + k + rows]
    return out


def _walk(matches: torch.Tensor, start: int, last: int, steps: int) -> tuple[int, int]:
    """(tokens emitted, steps) of a chain of ``steps`` drafts from state ``start`` until token
    ``last`` is emitted."""
    emitted, n_steps, t = 0, 0, start
    lead = matches[:steps]
    while t + 1 < last:
        a = 0
        while a < steps and bool(lead[a, t]):
            a += 1
        a = min(a, last - (t + 2))
        emitted += a + 1
        n_steps += 1
        t += a + 1
    return emitted, n_steps


def accept_length(head: Eagle3Head, samples: Sequence[Sample], steps: Sequence[int]) -> dict[int, float]:
    """The mean acceptance length (tokens emitted per engine step) of a greedy chain of S drafts
    for each S in ``steps``, over every answer in ``samples``."""
    most = max(steps)
    totals = {s: [0, 0] for s in steps}
    for sample in samples:
        m = draft_matches(head, sample, most)
        last = sample.tokens.numel() - 1
        for s in steps:
            e, n = _walk(m, sample.answer - 1, last, s)
            totals[s][0] += e
            totals[s][1] += n
    return {s: (e / n if n else float("nan")) for s, (e, n) in totals.items()}
