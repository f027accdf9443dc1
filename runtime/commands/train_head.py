"""``draftgraph train-head``: an EAGLE-3 head for a transformers target, by self-distillation in
a time budget (`models.head_recipe.train_head`); prints the head's folder and its held-out
acceptance at the end."""

from __future__ import annotations

import argparse
import contextlib
from typing import Any

__all__ = ["add_train_head_parser", "run_train_head"]


def add_train_head_parser(sub: Any) -> None:
    """The ``train-head`` subcommand's flags."""
    p = sub.add_parser("train-head", help="train an EAGLE-3 head for a transformers target (self-distillation)")
    p.add_argument("--target", required=True, metavar="DIR_OR_ID", help="a transformers checkpoint")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="the head's folder (published EAGLE-3 layout; DIR/.train keeps the answers and a "
                        "checkpoint: the same command resumes)")
    p.add_argument("--minutes", type=float, default=20.0, help="wall-time budget in all (default 20)")
    p.add_argument("--prompts", default=None, metavar="FILE",
                   help='JSONL of {"prompt": ...} or {"messages": [...]} (default: the shipped chat prompts; '
                        "the last tenth, at most --held-out, is held out)")
    p.add_argument("--draft-vocab", type=int, default=8192, help="draft vocabulary size (default 8192)")
    p.add_argument("--steps-unroll", type=int, default=5, help="draft passes trained per position (default 5)")
    p.add_argument("--max-new", type=int, default=256, help="answer tokens per prompt at most (default 256)")
    p.add_argument("--gen-batch", type=int, default=16, help="prompts answered together (default 16)")
    p.add_argument("--held-out", type=int, default=40, help="held-out prompts for the acceptance (default 40)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-tokens", type=int, default=2048, help="positions per training batch")
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many optimizer steps (0: the budget)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"],
                   help="the target's dtype for the held-out answers (the one served)")
    p.add_argument("--data-dtype", default="float32", choices=["float32", "float64", "bfloat16"],
                   help="the target's dtype for the training answers (bfloat16: faster on a CPU)")
    p.add_argument("--train-dtype", default="bfloat16", choices=["bfloat16", "float32"],
                   help="compute dtype of training (bfloat16: autocast over float32 weights)")
    p.add_argument("--save-dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's; on a shared CPU 1-2 run faster than more)")


def _bar(quiet: bool) -> Any:
    def make(desc: str, total: int, unit: str) -> Any:
        try:
            from tqdm import tqdm
        except ImportError:  # pragma: no cover - tqdm is a dependency
            return contextlib.nullcontext(_NoBar())
        return tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, disable=quiet,
                    bar_format="{l_bar}{bar}| {n:.0f}/{total_fmt} {unit} [{elapsed}<{remaining}{postfix}]")

    return make


class _NoBar:
    def update(self, n: float) -> None:
        pass

    def set_postfix(self, **kw: Any) -> None:
        pass


def run_train_head(ns: argparse.Namespace) -> int:
    """Train, print where the head is and its held-out acceptance; 0 on success."""
    import torch

    from ..models.head_recipe import HeadTrainConfig, train_head

    if ns.threads is not None:
        if ns.threads < 1:
            raise ValueError(f"--threads={ns.threads}: must be >= 1")
        torch.set_num_threads(ns.threads)

    cfg = HeadTrainConfig(minutes=ns.minutes, draft_vocab=ns.draft_vocab, steps_unroll=ns.steps_unroll,
                          max_new=ns.max_new, gen_batch=ns.gen_batch, held_out=ns.held_out, lr=ns.lr,
                          batch_tokens=ns.batch_tokens,
                          max_steps=ns.max_steps, dtype=ns.dtype, data_dtype=ns.data_dtype,
                          train_dtype=ns.train_dtype, save_dtype=ns.save_dtype, seed=ns.seed,
                          eval_steps=tuple(s for s in (3, 4) if s <= ns.steps_unroll) or (ns.steps_unroll,))
    r = train_head(ns.target, ns.out, cfg, ns.prompts, _bar(quiet=False))
    accept = ", ".join(f"S={s}: {a:.2f}" for s, a in sorted(r.accept.items()))
    print(f"head written to {r.out} ({'resumed; ' if r.resumed else ''}{r.samples} answers, {r.tokens} tokens; "
          f"{r.data_s:.0f} s answering, {r.train_s:.0f} s training, last loss {r.loss:.3f})")
    print(f"held-out acceptance length (greedy chain): {accept}")
    print(f"serve it with: draftgraph generate --target {ns.target} --draft {r.out} \"...\"")
    return 0
