"""``logprobs`` of a reply: the target's log-probabilities of the emitted tokens after the
request's temperature (before the filters; temperature 0: the raw logits), with up to
`MAX_TOP_LOGPROBS` most likely alternatives per position, in OpenAI's two shapes (completions
and chat).

Computed once the reply is whole, by one target forward over prompt + output in a cache of its
own, run on the stepping thread between two steps (`EngineBridge.call_at_boundary`): the
engine's step and its graphs are untouched, and a request that asks for none pays nothing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from draftgraph.runtime.models.greedy import prefill

from .text import decode_text

__all__ = ["MAX_TOP_LOGPROBS", "TokenLogprob", "chat_logprobs", "completion_logprobs", "token_logprobs"]

MAX_TOP_LOGPROBS = 5

TokenLogprob = tuple[int, float, list[tuple[int, float]]]  # (token, logprob, [(alternative, logprob)])


@torch.no_grad()
def token_logprobs(target: Any, prompt: Sequence[int], output: Sequence[int], temperature: float,
                   top: int) -> list[TokenLogprob]:
    """(token, logprob, top alternatives) of every token of ``output`` after ``prompt``."""
    if not output:
        return []
    seq = list(prompt) + list(output)
    logits, _ = prefill(target, target.new_cache(2), 1, seq[:-1])
    rows = logits[len(prompt) - 1:].double() / (temperature if temperature > 0 else 1.0)  # [len(output), V]
    lp = torch.log_softmax(rows, -1)
    ids = torch.tensor(list(output), device=lp.device)
    chosen = lp.gather(1, ids[:, None])[:, 0].tolist()
    alt_lp, alt_ids = lp.topk(top, dim=-1) if top else (lp[:, :0], ids[:, None][:, :0])
    return [(t, c, list(zip(i, v))) for t, c, i, v in zip(output, chosen, alt_ids.tolist(), alt_lp.tolist())]


def completion_logprobs(tokenizer: Any, entries: list[TokenLogprob]) -> dict[str, Any]:
    """The completions shape: tokens, token_logprobs, top_logprobs (text -> logprob), text_offset."""
    texts = [decode_text(tokenizer, [t]) for t, _, _ in entries]
    offsets, at = [], 0
    for text in texts:
        offsets.append(at)
        at += len(text)
    return {"tokens": texts, "token_logprobs": [c for _, c, _ in entries],
            "top_logprobs": [{decode_text(tokenizer, [i]): v for i, v in alts} for _, _, alts in entries],
            "text_offset": offsets}


def chat_logprobs(tokenizer: Any, entries: list[TokenLogprob]) -> dict[str, Any]:
    """The chat shape: content = [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]."""
    def item(t: int, v: float) -> dict[str, Any]:
        text = decode_text(tokenizer, [t])
        return {"token": text, "logprob": v, "bytes": list(text.encode())}

    return {"content": [{**item(t, c), "top_logprobs": [item(i, v) for i, v in alts]} for t, c, alts in entries]}
