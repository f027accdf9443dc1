"""Training an EAGLE-3 head on cached self-distillation data (`head_data.Sample`).

The label is the target's own next-token distribution over the draft vocabulary (soft labels:
cross-entropy against the softmax of the target's logits restricted to the draft ids, as
SpecForge trains), at every answer position and at ``steps`` unrolled draft passes per position
(`HFEagleHead.unroll`: pass k is the k-th draft call, fed the head's own state; pass k's loss
weighs ``decay ** k``). The learning rate warms up, then follows a cosine over the planned
training time: the budget is wall time, not steps. State (head, optimizer, seconds trained)
is checkpointed so a stopped run resumes where it stopped.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .head_data import Sample
from .hf_eagle import HFEagleHead

__all__ = ["TrainState", "batches", "draft_ids", "head_loss", "load_state", "save_state", "train_loop"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Batch:
    """Padded samples: tokens [B, T + 1], features [B, T, F] float16, n [B] (feature rows per
    sample), answer [B] (index of each answer's first token)."""

    tokens: torch.Tensor
    features: torch.Tensor
    n: torch.Tensor
    answer: torch.Tensor


@dataclass
class TrainState:
    """Where training stands: optimizer steps, seconds trained, seconds planned (the schedule's
    length), last loss."""

    steps: int = 0
    seconds: float = 0.0
    planned: float = 0.0
    loss: float = float("nan")


def draft_ids(samples: Sequence[Sample], size: int, vocab: int) -> torch.Tensor:
    """The ``size`` ids the target writes most in its answers (ties: the smaller id), sorted: an
    EAGLE-3 draft vocabulary (``d2t[i] = ids[i] - i``)."""
    if not 1 <= size <= vocab:
        raise ValueError(f"draft_vocab={size}: must be in [1, {vocab}] (the target's vocabulary)")
    counts = torch.zeros(vocab, dtype=torch.float64)
    for s in samples:
        counts += torch.bincount(s.tokens[s.answer:], minlength=vocab).double()
    counts -= torch.arange(vocab, dtype=torch.float64) * 1e-9  # ties: the smaller id first
    return counts.topk(size).indices.sort().values


def batches(samples: Sequence[Sample], tokens: int, rng: random.Random) -> list[Batch]:
    """Samples of similar length padded together, at most ``tokens`` feature rows a batch (one
    sample at least), in a shuffled order."""
    order = sorted(range(len(samples)), key=lambda i: samples[i].features.shape[0])
    groups, cur = [], []
    for i in order:
        t = samples[i].features.shape[0]
        if cur and (len(cur) + 1) * t > tokens:
            groups.append(cur)
            cur = []
        cur.append(i)
    if cur:
        groups.append(cur)
    rng.shuffle(groups)
    out = []
    for g in groups:
        t = max(samples[i].features.shape[0] for i in g)
        toks = torch.zeros(len(g), t + 1, dtype=torch.long)
        feats = torch.zeros(len(g), t, samples[g[0]].features.shape[1], dtype=torch.float16)
        for j, i in enumerate(g):
            s = samples[i]
            toks[j, :s.tokens.numel()] = s.tokens
            feats[j, :s.features.shape[0]] = s.features
        out.append(Batch(toks, feats, torch.tensor([samples[i].features.shape[0] for i in g]),
                         torch.tensor([samples[i].answer for i in g])))
    return out


def head_loss(head: HFEagleHead, w_draft: torch.Tensor, batch: Batch, steps: int, decay: float
              ) -> tuple[torch.Tensor, list[float]]:
    """(the weighted soft-label loss, each pass's top-1 agreement with the target) of one batch;
    ``w_draft`` [Vd, H]: the target's LM head rows of the draft ids (float32)."""
    width = head.cfg.feature_width
    feats = batch.features.float()
    streams, normed = feats[..., :width], feats[..., width:]
    outs = head.unroll(streams, batch.tokens[:, 1:], steps)
    t = feats.shape[1]
    rows = torch.arange(t)[None]
    total, agree = feats.new_zeros(()), []
    with torch.no_grad():  # the label at every position once: pass k row t reads position t + 1 + k
        labels = torch.softmax((normed[:, 1:] @ w_draft.t().to(normed.dtype)).float(), -1)  # [B, T - 1, Vd]
    for k, out in enumerate(outs):
        r = rows[:, :t - 1 - k]
        keep = (r + 1 + k < batch.n[:, None]) & (r + 2 + k >= batch.answer[:, None])  # [B, T - 1 - k]
        if not bool(keep.any()):
            agree.append(float("nan"))
            continue
        target = labels[:, k:][keep]  # [N, Vd]
        logits = head.lm_head(head.norm(out[:, :t - 1 - k][keep])).float()
        loss = -(target * torch.log_softmax(logits, -1)).sum(-1).mean()
        total = total + decay ** k * loss
        agree.append(float((logits.argmax(-1) == target.argmax(-1)).float().mean()))
    return total, agree


def _lr(base: float, state: TrainState, warmup: int, max_steps: int) -> float:
    frac = min(1.0, max(state.seconds / max(state.planned, 1e-9), state.steps / max_steps if max_steps else 0.0))
    return base * min(1.0, (state.steps + 1) / warmup) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))


def _done(state: TrainState, deadline: float, max_steps: int) -> bool:
    return (time.monotonic() >= deadline or state.seconds >= state.planned
            or bool(max_steps and state.steps >= max_steps))


def train_loop(head: HFEagleHead, opt: torch.optim.Optimizer, w_draft: torch.Tensor, samples: Sequence[Sample],
               state: TrainState, deadline: float, cfg: Any, save: Callable[[], None],
               progress: Callable[[float, TrainState, list[float]], None] = lambda s, st, a: None) -> TrainState:
    """Train until ``deadline`` (a `time.monotonic` value) or ``state.planned`` seconds of
    training or ``cfg.max_steps`` steps (0: no limit); ``cfg``: also ``batch_tokens``,
    ``steps_unroll``, ``decay``, ``lr``, ``seed``, ``checkpoint_s``, ``train_dtype`` (bfloat16:
    autocast, float32 master weights). ``save`` is called every ``checkpoint_s`` seconds and at the end."""
    params = [p for p in head.parameters() if p.requires_grad]
    rng = random.Random(cfg.seed + state.steps)
    head.train()
    last_save = time.monotonic()
    try:
        while not _done(state, deadline, cfg.max_steps):
            for b in batches(samples, cfg.batch_tokens, rng):
                t0 = time.monotonic()
                if _done(state, deadline, cfg.max_steps):
                    break
                for g in opt.param_groups:
                    g["lr"] = _lr(cfg.lr, state, 20, cfg.max_steps)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.train_dtype == "bfloat16"):
                    loss, agree = head_loss(head, w_draft, b, cfg.steps_unroll, cfg.decay)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
                dt = time.monotonic() - t0
                state.steps, state.seconds, state.loss = state.steps + 1, state.seconds + dt, float(loss.detach())
                progress(dt, state, agree)
                if time.monotonic() - last_save > cfg.checkpoint_s:
                    save()
                    last_save = time.monotonic()
    finally:
        head.eval()
        save()
    return state


def save_state(path: Path, head: HFEagleHead, opt: torch.optim.Optimizer, state: TrainState,
               stamp: dict[str, Any]) -> None:
    """Write the training checkpoint (through a temporary file renamed into place)."""
    tmp = path.with_suffix(".tmp")
    torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "state": vars(state), "stamp": stamp}, tmp)
    tmp.replace(path)


def load_state(path: Path, head: HFEagleHead, opt: torch.optim.Optimizer, stamp: dict[str, Any]
               ) -> TrainState | None:
    """The checkpoint's state loaded into ``head`` and ``opt`` (None: no checkpoint, or one of
    another setup ``stamp``, which is then left unused)."""
    if not path.is_file():
        return None
    data = torch.load(path, map_location="cpu", weights_only=True)
    if data.get("stamp") != stamp:
        logger.warning("%s: a checkpoint of another setup (%s); starting afresh", path, data.get("stamp"))
        return None
    head.load_state_dict(data["head"])
    opt.load_state_dict(data["opt"])
    return TrainState(**data["state"])
