"""Self-distillation data for `draftgraph train-head`: the target's own greedy answers to chat
prompts, with the residual streams an EAGLE-3 head reads and the target's final normed state
(its next-token distribution is that state through the LM head).

Prompts come from a JSONL file (one ``{"prompt": "..."}`` or ``{"messages": [{"role": ...,
"content": ...}, ...]}`` a line) or the set the project ships (`SHIPPED_PROMPTS`: its last
`HELD_OUT` prompts are the held-out split, never trained on). The chat template is applied
when the tokenizer has one; a checkpoint without a tokenizer gets each text's bytes modulo its
vocabulary. Answers are decoded in batches (left-padded) by the transformers model itself, its
streams taken by hooks at the layers `HFTarget` reads them: the features the engine hands the
head, up to rounding.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .hf_target import NORMED
from .hf_text import IdText
from .prompt_file import HELD_OUT, SHIPPED_PROMPTS, read_prompt_file

__all__ = ["GEN_ATTN", "HELD_OUT", "SHIPPED_PROMPTS", "Sample", "encode_prompts", "generate_samples",
           "read_prompts", "register_gen_attention", "shipped_split"]

logger = logging.getLogger(__name__)

GEN_ATTN = "draftgraph_gen"  # the answering model's attention (`register_gen_attention`)

Messages = list[dict[str, str]]


@dataclass(frozen=True)
class Sample:
    """One conversation: tokens [n + 1] (prompt then the target's answer), ``answer`` the index
    of the answer's first token, features [n, F] float16 (at each position but the last: the
    streams the head reads, then the target's final normed state)."""

    tokens: torch.Tensor
    answer: int
    features: torch.Tensor


def read_prompts(path: str | Path) -> list[Messages]:
    """The conversations of a JSONL prompt file (`prompt_file.read_prompt_file`: blank lines
    skipped, a bad line a ValueError naming it)."""
    return [p.as_dicts() for p in read_prompt_file(path)]


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


def _gen_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
                   dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None,
                   **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: sdpa for a prefill; for one query row per request,
    query [B, Hq, 1, d] grouped over the K/V heads [B, Hk, Lk, d] (no repeated K/V, no flash
    kernel: both cost several times the matmuls here). Returns (out [B, 1, Hq, d], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.shape[2] > 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    b, hq, _, d = query.shape
    q = query.view(b, key.shape[1], hq // key.shape[1], d)
    s = torch.matmul(q, key.transpose(-1, -2)).float() * (scaling if scaling is not None else d ** -0.5)
    if attention_mask is not None:  # sdpa's mask: bool [B, 1, 1, Lk], True = attend
        s = s.masked_fill(~attention_mask[:, :, -1:, :], float("-inf"))
    out = torch.matmul(torch.softmax(s, -1).to(value.dtype), value)
    return out.reshape(b, hq, 1, d).transpose(1, 2), None


def register_gen_attention() -> str:
    """Register `_gen_attention` (with sdpa's mask) in transformers' registries; its name."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(GEN_ATTN, _gen_attention)
    AttentionMaskInterface.register(GEN_ATTN, sdpa_mask)
    return GEN_ATTN


def _taps(model: Any, layers: Sequence[int]) -> tuple[dict[int, torch.Tensor], list[Any]]:
    """Hooks keeping, per call, the residual stream entering each of ``layers`` (as `HFTarget`'s:
    L is the final norm's input, `NORMED` its output)."""
    base, got, hooks = model.base_model, {}, []
    for i in sorted(set(layers)):
        if i == NORMED:
            hooks.append(base.norm.register_forward_hook(lambda _m, _a, out, i=i: got.__setitem__(i, out)))
        else:
            module = base.norm if i == model.config.num_hidden_layers else base.layers[i]
            hooks.append(module.register_forward_pre_hook(lambda _m, a, i=i: got.__setitem__(i, a[0])))
    return got, hooks


@torch.no_grad()
def _batch(model: Any, layers: Sequence[int], prompts: Sequence[list[int]], max_new: int, eos: frozenset[int]
           ) -> list[Sample]:
    """Greedy answers of ``prompts`` decoded together (left-padded, transformers' own attention and
    cache; finished rows leave the batch)."""
    from transformers import DynamicCache

    b, w = len(prompts), max(len(p) for p in prompts)
    ids = torch.zeros(b, w, dtype=torch.long)
    att = torch.zeros(b, w, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, w - len(p):], att[i, w - len(p):] = torch.tensor(p), 1
    cur = (att.cumsum(1) - 1).clamp(min=0)
    got, hooks = _taps(model, layers)
    cache = DynamicCache(config=model.config)
    seqs, parts, live = [list(p) for p in prompts], [[] for _ in prompts], torch.arange(b)
    try:
        out = model(input_ids=ids, attention_mask=att, position_ids=cur, past_key_values=cache, use_cache=True,
                    logits_to_keep=1)
        feats = torch.cat([got[i] for i in layers], -1)
        for i, p in enumerate(prompts):
            parts[i].append(feats[i, w - len(p):].half())
        nxt, cur = out.logits[:, -1].argmax(-1), cur[:, -1]
        for step in range(max_new):
            for j, i in enumerate(live.tolist()):
                seqs[i].append(int(nxt[j]))
            keep = torch.tensor([j for j, i in enumerate(live.tolist())
                                 if seqs[i][-1] not in eos and step + 1 < max_new], dtype=torch.long)
            if not keep.numel():
                break
            if keep.numel() < live.numel():
                cache.batch_select_indices(keep)
                att, live, nxt, cur = att[keep], live[keep], nxt[keep], cur[keep]
            cur = cur + 1
            att = torch.cat([att, torch.ones(keep.numel(), 1, dtype=att.dtype)], 1)
            out = model(input_ids=nxt[:, None], attention_mask=att, position_ids=cur[:, None], past_key_values=cache,
                        use_cache=True)
            feats = torch.cat([got[i] for i in layers], -1)
            for j, i in enumerate(live.tolist()):
                parts[i].append(feats[j].half())
            nxt = out.logits[:, -1].argmax(-1)
    finally:
        for h in hooks:
            h.remove()
    return [Sample(torch.tensor(s), len(p), torch.cat(f)) for s, p, f in zip(seqs, prompts, parts)]


def generate_samples(model: Any, layers: Sequence[int], prompts: Sequence[list[int]], max_new: int,
                     eos: Sequence[int],
                     batch: int = 16, deadline: float | None = None,
                     progress: Callable[[int], None] = lambda n: None) -> list[Sample]:
    """The target's greedy answers (at most ``max_new`` tokens, ending at an ``eos`` id) to
    ``prompts``, ``batch`` at a time, shortest prompts together; stops starting batches after
    ``deadline`` (a `time.monotonic` value). ``model``: a transformers causal LM on the
    `GEN_ATTN` attention (or sdpa; the engine's attention is built for a few rows of a step, not
    for hundreds of positions of dozens of rows); ``layers``: the features kept, in order (the head's
    streams, then `NORMED`)."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out: list[Sample] = []
    for s in range(0, len(order), batch):
        if deadline is not None and time.monotonic() > deadline:
            logger.info("time budget: %d of %d prompts answered", len(out), len(prompts))
            break
        chunk = order[s:s + batch]
        out.extend(_batch(model, layers, [prompts[i] for i in chunk], max_new, frozenset(eos)))
        progress(len(chunk))
    return out
