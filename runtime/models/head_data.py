"""Self-distillation data for `draftgraph train-head`: the target's own greedy answers to chat
prompts, with the residual streams an EAGLE-3 head reads and the target's final normed state
(its next-token distribution is that state through the LM head).

Prompts come from a JSONL file (one ``{"prompt": "..."}`` or ``{"messages": [{"role": ...,
"content": ...}, ...]}`` a line) or the set the project ships (`SHIPPED_PROMPTS`: its last
`HELD_OUT` prompts are the held-out split, never trained on). The chat template is applied
when the tokenizer has one; a checkpoint without a tokenizer gets each text's bytes modulo its
vocabulary. Answers are decoded in batches through the engine's own target call (`HFTarget`,
its static cache, one row per prompt at its own positions: no padding inside a row), so the
features are exactly those the engine hands the head at inference.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .hf_target import HFTarget
from .hf_text import IdText

__all__ = ["HELD_OUT", "SHIPPED_PROMPTS", "Sample", "encode_prompts", "generate_samples", "read_prompts",
           "shipped_split"]

logger = logging.getLogger(__name__)

SHIPPED_PROMPTS = Path(__file__).resolve().parent / "data" / "chat_prompts.jsonl"
HELD_OUT = 40  # the shipped set's last prompts: evaluation only

Messages = list[dict[str, str]]


@dataclass(frozen=True)
class Sample:
    """One conversation: tokens [n + 1] (prompt then the target's answer), ``answer`` the index
    of the answer's first token, features [n, F] float16 (at each position but the last: the
    streams the head reads, then the target's final normed state)."""

    tokens: torch.Tensor
    answer: int
    features: torch.Tensor


def _messages(line: str, where: str) -> Messages:
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not JSON ({exc})") from exc
    if isinstance(item, dict) and isinstance(item.get("prompt"), str):
        return [{"role": "user", "content": item["prompt"]}]
    msgs = item.get("messages") if isinstance(item, dict) else None
    ok = isinstance(msgs, list) and bool(msgs) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in msgs)
    if not ok:
        raise ValueError(f"{where}: must be {{\"prompt\": str}} or {{\"messages\": [{{\"role\": str, "
                         f"\"content\": str}}, ...]}} (a non-empty list)")
    return [{"role": m["role"], "content": m["content"]} for m in msgs]


def read_prompts(path: str | Path) -> list[Messages]:
    """The conversations of a JSONL prompt file (blank lines skipped); ValueError naming the line."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"prompts={str(path)!r}: not readable ({exc})") from exc
    out = [_messages(line, f"{path}:{i + 1}") for i, line in enumerate(lines) if line.strip()]
    if not out:
        raise ValueError(f"prompts={str(path)!r}: no prompt in the file")
    return out


def shipped_split() -> tuple[list[Messages], list[Messages]]:
    """(training, held-out) conversations of the shipped prompt set."""
    prompts = read_prompts(SHIPPED_PROMPTS)
    return prompts[:-HELD_OUT], prompts[-HELD_OUT:]


def encode_prompts(prompts: Sequence[Messages], tokenizer: Any, vocab_size: int) -> list[list[int]]:
    """Token ids of each conversation, ready for the answer: the chat template with the generation
    prompt when the tokenizer has one, else the contents joined by blank lines (a checkpoint
    without a tokenizer: the bytes modulo ``vocab_size``)."""
    out = []
    for msgs in prompts:
        if isinstance(tokenizer, IdText):
            out.append([b % vocab_size for b in "\n\n".join(m["content"] for m in msgs).encode()] or [0])
        elif getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
            ids = ids["input_ids"] if not isinstance(ids, list) else ids
            out.append(list(ids))
        else:
            out.append(tokenizer.encode("\n\n".join(m["content"] for m in msgs)) or [0])
    return out


@torch.no_grad()
def _batch(target: HFTarget, prompts: Sequence[list[int]], max_new: int, eos: frozenset[int]) -> list[Sample]:
    """Greedy answers of ``prompts`` decoded together (each row at its own positions)."""
    b = len(prompts)
    lens = torch.tensor([len(p) for p in prompts])
    width = int(lens.max())
    cache = target.new_cache(b + 1, max_len=width + max_new)
    toks = torch.zeros(b, width, dtype=torch.long)
    for i, p in enumerate(prompts):
        toks[i, :len(p)] = torch.tensor(p)
    pos = torch.arange(width).expand(b, width)
    mask = torch.ones(width, width, dtype=torch.bool).tril() & (pos[:, None, :] < lens[:, None, None])
    slots = torch.arange(1, b + 1)
    logits, feats = target(toks, pos, pos, slots, mask, cache)
    seqs = [list(p) for p in prompts]
    parts = [[feats[i, :len(p)].half()] for i, p in enumerate(prompts)]
    nxt = logits[torch.arange(b), lens - 1].argmax(-1)
    live = list(range(b))
    for step in range(max_new):
        for i, t in zip(live, nxt.tolist()):
            seqs[i].append(t)
        live_t = torch.tensor(live)
        keep = [j for j, i in enumerate(live) if seqs[i][-1] not in eos and step + 1 < max_new]
        if not keep:
            break
        live_t, nxt = live_t[keep], nxt[keep]
        live = live_t.tolist()
        at = torch.tensor([len(seqs[i]) - 1 for i in live])[:, None]
        m = torch.arange(int(at.max()) + 1)[None, None] <= at[:, :, None]
        logits, feats = target(nxt[:, None], at, at, live_t + 1, m, cache)
        for j, i in enumerate(live):
            parts[i].append(feats[j].half())
        nxt = logits[:, -1].argmax(-1)
    return [Sample(torch.tensor(s), len(p), torch.cat(f)) for s, p, f in zip(seqs, prompts, parts)]


def generate_samples(target: HFTarget, prompts: Sequence[list[int]], max_new: int, eos: Sequence[int],
                     batch: int = 16, deadline: float | None = None,
                     progress: Callable[[int], None] = lambda n: None) -> list[Sample]:
    """The target's greedy answers (at most ``max_new`` tokens, ending at an ``eos`` id) to
    ``prompts``, ``batch`` at a time, shortest prompts together; stops starting batches after
    ``deadline`` (a `time.monotonic` value). ``target``'s features must be the head's streams
    followed by the final normed state (`head_train.feature_layers`)."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out: list[Sample] = []
    for s in range(0, len(order), batch):
        if deadline is not None and time.monotonic() > deadline:
            logger.info("time budget: %d of %d prompts answered", len(out), len(prompts))
            break
        chunk = order[s:s + batch]
        out.extend(_batch(target, [prompts[i] for i in chunk], max_new, frozenset(eos)))
        progress(len(chunk))
    return out
