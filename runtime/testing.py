"""Tiny deterministic draft model and input generator for tests, examples and benchmarks (CPU or GPU).

Part of the component: it imports nothing from `runtime/models` or `runtime/engine` (the
embedded default models re-export these two names). The model is capturable: a fixed sequence
of tensor ops, no host reads, no allocation that depends on values.
"""

from __future__ import annotations

import torch
from torch import nn

from draftgraph.runtime.draft_io import DraftInput

__all__ = ["TinyDraftModel", "make_draft_input"]


class TinyDraftModel(nn.Module):
    """One tied-embedding recurrent layer: (input_ids [M], hidden [M, H]) -> (logits [M, V], hidden [M, H])."""

    def __init__(self, vocab_size: int = 64, hidden_size: int = 32, seed: int = 0,
                 device: str | torch.device = "cpu") -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        embed = torch.randn(vocab_size, hidden_size, generator=gen) * 0.5
        mix = torch.randn(hidden_size, hidden_size, generator=gen) / hidden_size**0.5
        self.embed = nn.Parameter(embed.to(device), requires_grad=False)
        self.mix = nn.Parameter(mix.to(device), requires_grad=False)

    def forward(self, input_ids: torch.Tensor, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Next hidden = tanh(embed[ids] + hidden @ mix); logits = next hidden @ embed^T."""
        h = torch.tanh(self.embed[input_ids] + hidden_states @ self.mix)
        return h @ self.embed.t(), h


def make_draft_input(bs: int, topk: int, hidden_size: int = 32, vocab_size: int = 64,
                     seed: int = 0, device: str | torch.device = "cpu") -> DraftInput:
    """A random but valid DraftInput: topk_p, topk_index [bs, topk] from softmaxed logits, hidden [bs, H]."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(bs, vocab_size, generator=gen)
    p, idx = torch.topk(torch.softmax(logits, dim=-1), topk, dim=-1)
    hidden = torch.randn(bs, hidden_size, generator=gen)
    return DraftInput(p.to(device), idx.to(device), hidden.to(device))
