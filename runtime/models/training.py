"""First-use training of the default models (CPU, float32, deterministic from the seed).

1. The target, a transformers ``LlamaForCausalLM`` (`default_spec.target_config`), learns
   next-byte prediction on standard-library sources through its own forward (sdpa attention).
2. Wrapped as an `HFTarget` (the engine's attention, its static cache), it writes its own greedy
   continuations of training prompts: the text the engine will verify at inference, so the
   drafts are distilled on exactly that distribution, with the residual streams they read.
3. The EAGLE-3 head (`Eagle3Head`, published layout) is distilled against the target's argmax
   in the two passes the engine runs (`HFEagleHead.train_forward`), over its draft vocabulary
   (the bytes the target writes most; its LM head and norm start from the target's rows); the
   multi-layer draft against the argmax of each of its layers' positions.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .eagle_heads import Eagle3Head
from .hf_target import HFTarget
from .multi_layer import MultiLayerDraft

__all__ = ["Distilled", "TrainPlan", "distill_data", "draft_vocabulary", "init_eagle3", "train_eagle",
           "train_multi_layer", "train_target"]

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
    eagle_steps: int = 160
    multi_layer_steps: int = 80
    draft_batch: int = 12
    draft_lr: float = 3e-3

    @property
    def total_steps(self) -> int:
        return self.target_steps + 1 + self.eagle_steps + self.multi_layer_steps


@dataclass(frozen=True)
class Distilled:
    """The target's greedy text: tokens [P, T]; streams [P, T, 3H] (the residual streams the
    EAGLE-3 head reads at each position); last [P, T, H] (the last layer's output before the
    final norm: the multi-layer draft's feature); argmax [P, T] (the target's prediction of
    tokens[:, t + 1])."""

    tokens: torch.Tensor
    streams: torch.Tensor
    last: torch.Tensor
    argmax: torch.Tensor


def _schedule(opt: torch.optim.Optimizer, steps: int, lr: float, warmup: int = 20) -> Iterator[int]:
    for i in range(steps):
        f = min(1.0, (i + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * i / steps))
        for g in opt.param_groups:
            g["lr"] = lr * max(f, 0.05)
        yield i


def _windows(data: torch.Tensor, gen: torch.Generator, batch: int, seq: int) -> torch.Tensor:
    starts = torch.randint(0, data.numel() - seq - 1, (batch,), generator=gen)
    return torch.stack([data[s:s + seq] for s in starts.tolist()])


def train_target(model: Any, text: bytes, plan: TrainPlan, seed: int, progress: Progress = lambda n: None) -> float:
    """Next-byte training of a transformers causal LM (its own forward, sdpa attention);
    returns the last loss (nats/byte)."""
    gen = torch.Generator().manual_seed(seed)
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
    opt = torch.optim.AdamW(model.parameters(), lr=plan.target_lr, weight_decay=0.01, betas=(0.9, 0.95))
    model.train()
    loss_v = float("nan")
    for _ in _schedule(opt, plan.target_steps, plan.target_lr):
        x = _windows(data, gen, plan.target_batch, plan.target_seq + 1)
        logits = model(input_ids=x[:, :-1], use_cache=False).logits
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
def distill_data(target: HFTarget, text: bytes, plan: TrainPlan, seed: int) -> Distilled:
    """The target's greedy continuations of training prompts, decoded one token at a time from
    its static cache, then its features over the whole text in one causal pass. ``target``'s
    feature layers are the EAGLE-3 streams, the last of them the last layer's output."""
    gen = torch.Generator().manual_seed(seed + 7)
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
    prompts = _windows(data, gen, plan.distill_prompts, plan.distill_prompt_len)
    p, t0 = prompts.shape
    total = t0 + plan.distill_new
    cache = target.new_cache(p + 1, max_len=total)
    slots = torch.arange(1, p + 1)
    pos = torch.arange(t0).expand(p, t0)
    mask = torch.ones(t0, t0, dtype=torch.bool).tril().expand(p, t0, t0)
    logits, _ = target(prompts, pos, pos, slots, mask, cache)
    seqs = [prompts, logits[:, -1].argmax(-1, keepdim=True)]
    n = t0
    for _ in range(plan.distill_new - 1):
        m = torch.ones(p, 1, n + 1, dtype=torch.bool)
        at = torch.full((p, 1), n)
        logits, _ = target(seqs[-1], at, at, slots, m, cache)
        seqs.append(logits[:, -1].argmax(-1, keepdim=True))
        n += 1
    tokens = torch.cat(seqs, dim=1)
    t = tokens.shape[1]
    cache = target.new_cache(p + 1, max_len=t)
    pos = torch.arange(t).expand(p, t)
    mask = torch.ones(t, t, dtype=torch.bool).tril().expand(p, t, t)
    logits, streams = target(tokens, pos, pos, slots, mask, cache)
    last = streams[..., -target.cfg.dim:]
    return Distilled(tokens, streams, last, logits.argmax(-1))


def draft_vocabulary(data: Distilled, size: int) -> torch.Tensor:
    """The ``size`` token ids the target writes most in ``data`` (ties: the smaller id), sorted:
    an EAGLE-3 draft vocabulary (``d2t[i] = ids[i] - i``)."""
    counts = torch.bincount(data.argmax.flatten(), minlength=size).double()
    counts -= torch.arange(counts.numel(), dtype=torch.float64) * 1e-9  # ties: the smaller id first
    return counts.topk(size).indices.sort().values


@torch.no_grad()
def init_eagle3(head: Eagle3Head, target: HFTarget, ids: torch.Tensor) -> None:
    """Start an EAGLE-3 head's LM head and norm from the target's rows for draft ids ``ids`` and
    its final norm, and set ``d2t``."""
    head.lm_head.weight.copy_(target.lm_head.weight[ids])
    head.norm.weight.copy_(target.final_norm.weight)
    head.d2t.copy_(ids - torch.arange(ids.numel()))


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


def train_eagle(head: Eagle3Head, data: Distilled, plan: TrainPlan, seed: int,
                progress: Progress = lambda n: None) -> float:
    """Distill the EAGLE-3 head on the target's greedy text (labels outside its draft vocabulary
    are skipped: it can never propose them); returns the last loss."""
    in_draft = torch.zeros(head.cfg.vocab_size, dtype=torch.bool)
    in_draft[torch.arange(head.cfg.draft_vocab_size) + head.d2t] = True
    labels = data.argmax.masked_fill(~in_draft[data.argmax], -100)

    def loss_fn(idx: torch.Tensor) -> torch.Tensor:
        f, tok, g = data.streams[idx], data.tokens[idx], labels[idx]
        l0, l1 = head.train_forward(f[:, :-1], tok[:, 1:])
        ce = nn.functional.cross_entropy
        return ce(l0.flatten(0, 1), g[:, 1:].flatten()) + ce(l1.flatten(0, 1), g[:, 2:].flatten())

    return _draft_loop(head, plan.eagle_steps, plan, seed, data.tokens.shape[0], loss_fn, progress)


def train_multi_layer(draft: MultiLayerDraft, data: Distilled, plan: TrainPlan, seed: int,
                      progress: Progress = lambda n: None) -> float:
    """Distill every layer of the multi-layer draft; returns the last loss."""
    ce = nn.functional.cross_entropy

    def loss_fn(idx: torch.Tensor) -> torch.Tensor:
        f, tok, g = data.last[idx], data.tokens[idx], data.argmax[idx]
        outs = draft.train_forward(f[:, :-1], tok[:, 1:])
        return sum(ce(lg.flatten(0, 1), g[:, i + 1:].flatten()) for i, lg in enumerate(outs))

    return _draft_loop(draft, plan.multi_layer_steps, plan, seed + 1, data.tokens.shape[0], loss_fn, progress)
