"""First-use training of the default models (CPU, float32, deterministic from the seed).

1. The target learns next-byte prediction on standard-library sources.
2. It then writes its own greedy continuations of training prompts: the text the engine will
   verify at inference, so the drafts are distilled on exactly that distribution.
3. The EAGLE head is distilled against the target's argmax (pass 0 as `extend`, pass 1 as
   the first draft call fed its own feature) plus a feature regression; the multi-layer draft
   against the argmax of each of its layers' positions.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from .eagle_head import EagleDraftHead
from .multi_layer import MultiLayerDraft
from .target import TargetModel

__all__ = ["TrainPlan", "train_target", "distill_data", "train_eagle", "train_multi_layer"]

logger = logging.getLogger(__name__)

Progress = Callable[[int], None]


@dataclass(frozen=True)
class TrainPlan:
    """Step counts and sizes of first-use training (part of the cache key)."""

    target_steps: int = 160
    target_batch: int = 8
    target_seq: int = 96
    target_lr: float = 3e-3
    distill_prompts: int = 64
    distill_prompt_len: int = 48
    distill_new: int = 128
    eagle_steps: int = 140
    multi_layer_steps: int = 80
    draft_batch: int = 12
    draft_lr: float = 3e-3

    @property
    def total_steps(self) -> int:
        return self.target_steps + 1 + self.eagle_steps + self.multi_layer_steps


def _schedule(opt: torch.optim.Optimizer, steps: int, lr: float, warmup: int = 20) -> Iterator[int]:
    for i in range(steps):
        f = min(1.0, (i + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * i / steps))
        for g in opt.param_groups:
            g["lr"] = lr * max(f, 0.05)
        yield i


def _windows(data: torch.Tensor, gen: torch.Generator, batch: int, seq: int) -> torch.Tensor:
    starts = torch.randint(0, data.numel() - seq - 1, (batch,), generator=gen)
    return torch.stack([data[s:s + seq] for s in starts.tolist()])


def train_target(model: TargetModel, text: bytes, plan: TrainPlan, seed: int,
                 progress: Progress = lambda n: None) -> float:
    """Next-byte training; returns the last loss (nats/byte)."""
    gen = torch.Generator().manual_seed(seed)
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
    opt = torch.optim.AdamW(model.parameters(), lr=plan.target_lr, weight_decay=0.01, betas=(0.9, 0.95))
    model.train()
    loss_v = float("nan")
    for _ in _schedule(opt, plan.target_steps, plan.target_lr):
        x = _windows(data, gen, plan.target_batch, plan.target_seq + 1)
        logits, _ = model.train_forward(x[:, :-1])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_v = float(loss.detach())
        progress(1)
    model.eval()
    return loss_v


@torch.no_grad()
def distill_data(model: TargetModel, text: bytes, plan: TrainPlan, seed: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The target's greedy continuations of training prompts: (tokens [P, T], features [P, T, d],
    argmax [P, T]) where argmax[:, t] is the target's prediction of tokens[:, t + 1]."""
    gen = torch.Generator().manual_seed(seed + 7)
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
    prompts = _windows(data, gen, plan.distill_prompts, plan.distill_prompt_len)
    p, t0 = prompts.shape
    cache = model.new_cache(p + 1)
    slots = slice(1, p + 1)
    pos = torch.arange(t0).expand(p, t0)
    mask = torch.ones(t0, t0, dtype=torch.bool).tril().expand(p, t0, t0)
    logits, _ = model(prompts, pos, pos, slots, mask, cache)
    seqs = [prompts, logits[:, -1].argmax(-1, keepdim=True)]
    n = t0
    for _ in range(plan.distill_new - 1):
        m = (torch.arange(n + 1)[None] <= n).expand(p, n + 1).unsqueeze(1)
        at = torch.full((p, 1), n)
        logits, _ = model(seqs[-1], at, at, slots, m, cache)
        seqs.append(logits[:, -1].argmax(-1, keepdim=True))
        n += 1
    tokens = torch.cat(seqs, dim=1)
    logits, feats = model.train_forward(tokens)
    return tokens, feats, logits.argmax(-1)


def _draft_loop(module: nn.Module, steps: int, plan: TrainPlan, seed: int, count: int,
                loss_fn: Callable[[torch.Tensor], torch.Tensor], progress: Progress) -> float:
    gen = torch.Generator().manual_seed(seed + 11)
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=plan.draft_lr, weight_decay=0.0, betas=(0.9, 0.95))
    module.train()
    loss_v = float("nan")
    for _ in _schedule(opt, steps, plan.draft_lr):
        idx = torch.randint(0, count, (plan.draft_batch,), generator=gen)
        loss = loss_fn(idx)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        loss_v = float(loss.detach())
        progress(1)
    module.eval()
    return loss_v


def train_eagle(head: EagleDraftHead, data: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                plan: TrainPlan, seed: int, progress: Progress = lambda n: None) -> float:
    """Distill the EAGLE head on the target's greedy text; returns the last loss."""
    tokens, feats, argmax = data
    ce = nn.functional.cross_entropy

    def loss_fn(idx: torch.Tensor) -> torch.Tensor:
        f, tok, g = feats[idx], tokens[idx], argmax[idx]
        h0, l0, l1 = head.train_forward(f[:, :-1], tok[:, 1:])
        loss0 = ce(l0.flatten(0, 1), g[:, 1:].flatten())
        loss1 = ce(l1.flatten(0, 1), g[:, 2:].flatten())
        reg = nn.functional.smooth_l1_loss(h0, f[:, 1:])
        return loss0 + loss1 + 0.2 * reg

    return _draft_loop(head, plan.eagle_steps, plan, seed, tokens.shape[0], loss_fn, progress)


def train_multi_layer(draft: MultiLayerDraft, data: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                      plan: TrainPlan, seed: int, progress: Progress = lambda n: None) -> float:
    """Distill every layer of the multi-layer draft; returns the last loss."""
    tokens, feats, argmax = data
    ce = nn.functional.cross_entropy

    def loss_fn(idx: torch.Tensor) -> torch.Tensor:
        f, tok, g = feats[idx], tokens[idx], argmax[idx]
        outs = draft.train_forward(f[:, :-1], tok[:, 1:])
        return sum(ce(lg.flatten(0, 1), g[:, i + 1:].flatten()) for i, lg in enumerate(outs))

    return _draft_loop(draft, plan.multi_layer_steps, plan, seed + 1, tokens.shape[0], loss_fn, progress)
