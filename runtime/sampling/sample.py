"""The filtered, keyed draw: temperature, then top-k, top-p and min-p, then a Gumbel-max draw
with keyed uniforms (`keyed.keyed_uniform`). Tensor ops only, no host read and no shape that
depends on values: it runs inside captured graphs on per-row parameters (`SamplingRows`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .keyed import keyed_uniform
from .params import SamplingParams

__all__ = ["SamplingRows", "choose_tokens", "filter_logits", "sampled_logprobs"]


@dataclass(frozen=True)
class SamplingRows:
    """Per-row sampling parameters as device tensors, each [b]: ``temperature`` / ``top_p`` /
    ``min_p`` float64, ``top_k`` / ``seed`` int64 (temperature 0: a greedy row)."""

    temperature: torch.Tensor
    top_p: torch.Tensor
    top_k: torch.Tensor
    min_p: torch.Tensor
    seed: torch.Tensor

    @classmethod
    def of(cls, params: Sequence[SamplingParams], device: torch.device | str) -> SamplingRows:
        """Rows of ``params`` (a missing seed counts as 0: only a greedy row may lack one)."""
        def col(values: list, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=device)

        f64 = torch.float64
        return cls(col([p.temperature for p in params], f64), col([p.top_p for p in params], f64),
                   col([p.top_k for p in params], torch.long), col([p.min_p for p in params], f64),
                   col([p.seed or 0 for p in params], torch.long))


def filter_logits(logits: torch.Tensor, rows: SamplingRows) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, keep): x = logits [b, N, V] / temperature in float64 (temperature 0 divides by 1), keep
    [b, N, V] bool: the tokens left after top-k, then top-p (on the top-k renormalized mass),
    then min-p (relative to the most likely token). Ties at a boundary break by token id."""
    def per_row(t: torch.Tensor) -> torch.Tensor:
        return t[:, None, None]

    t = torch.where(rows.temperature > 0, rows.temperature, 1.0)
    x = logits.double() / per_row(t)
    v = x.shape[-1]
    sv, si = x.sort(dim=-1, descending=True, stable=True)
    rank = torch.arange(v, device=x.device)
    k = torch.where(rows.top_k > 0, rows.top_k, v).clamp(max=v)
    keep = rank < per_row(k)
    probs = torch.softmax(sv.masked_fill(~keep, float("-inf")), -1)
    before = probs.cumsum(-1) - probs  # the mass of the tokens ranked above
    keep = keep & ((before < per_row(rows.top_p)) | per_row(rows.top_p >= 1))
    keep = keep & ((sv - sv[..., :1]).exp() >= per_row(rows.min_p))
    return x, torch.zeros_like(keep).scatter(-1, si, keep)


def choose_tokens(logits: torch.Tensor, positions: torch.Tensor, rows: SamplingRows) -> torch.Tensor:
    """The token each node emits if reached, [b, N]: greedy rows the argmax of ``logits`` [b, N, V]
    (bitwise the greedy path), the others a draw from the filtered distribution keyed by
    (seed, ``positions`` [b, N]: the absolute position of the token drawn, column)."""
    x, keep = filter_logits(logits, rows)
    gumbel = -torch.log(-torch.log(keyed_uniform(rows.seed, positions, x.shape[-1])))
    drawn = torch.where(keep, x + gumbel, float("-inf")).argmax(-1)
    return torch.where(rows.temperature[:, None] > 0, drawn, logits.argmax(-1))


def sampled_logprobs(logits: torch.Tensor, rows: SamplingRows) -> torch.Tensor:
    """log-probabilities after temperature (before the filters), float64 [b, N, V]."""
    x, _ = filter_logits(logits, rows)
    return torch.log_softmax(x, -1)
