"""``logprobs`` of a reply: the target's log-probabilities of the emitted tokens after the
request's temperature (before the filters; temperature 0: the raw logits), with up to
`MAX_TOP_LOGPROBS` most likely alternatives per position, in OpenAI's two shapes (completions
and chat).

Computed once the reply is whole, by one target forward over prompt + output in a cache of its
own, run on the stepping thread between two steps (`EngineBridge.call_at_boundary`): the
engine's step and its graphs are untouched, and a request that asks for none pays nothing. A
streamed reply's come chunk by chunk from a `LogprobCursor`: the prompt and then each committed
token fed once into the reply's own one-slot cache (held while the reply streams), so a
streamed reply costs the same forwards as a whole one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from draftgraph.runtime.models.greedy import prefill

from .text import decode_text

__all__ = ["MAX_TOP_LOGPROBS", "LogprobCursor", "TokenLogprob", "chat_logprobs", "completion_logprobs",
           "token_logprobs"]

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
    return _entries(logits[len(prompt) - 1:], output, temperature, top)


def _entries(logits: torch.Tensor, output: Sequence[int], temperature: float, top: int) -> list[TokenLogprob]:
    """(token, logprob, top alternatives) of each ``output`` token from the logits [n, V] that
    predicted it, after ``temperature`` (0: the raw logits)."""
    rows = logits.double() / (temperature if temperature > 0 else 1.0)
    lp = torch.log_softmax(rows, -1)
    ids = torch.tensor(list(output), device=lp.device)
    chosen = lp.gather(1, ids[:, None])[:, 0].tolist()
    alt_lp, alt_ids = lp.topk(top, dim=-1) if top else (lp[:, :0], ids[:, None][:, :0])
    return [(t, c, list(zip(i, v))) for t, c, i, v in zip(output, chosen, alt_ids.tolist(), alt_lp.tolist())]


class LogprobCursor:
    """A streamed reply's log-probabilities, token by token as they are committed: the prompt
    and then each emitted token go once through the target into the reply's own one-slot cache
    (allocated at the first `advance`, freed with the cursor). Call `advance` on the stepping
    thread (`EngineBridge.call_at_boundary`), like `token_logprobs`."""

    def __init__(self, target: Any, prompt: Sequence[int], temperature: float, top: int) -> None:
        self.target, self.prompt = target, list(prompt)
        self.temperature, self.top = temperature, top
        self.cache: Any = None
        self.fed = 0  # positions of prompt + output in the cache
        self.last: torch.Tensor | None = None  # logits [V] predicting the next token
        self.done = 0  # output tokens handed out

    @torch.no_grad()
    def advance(self, output: Sequence[int]) -> list[TokenLogprob]:
        """The entries of ``output``'s tokens not handed out yet (``output``: the reply's
        tokens so far, a prefix of the final ones)."""
        new = list(output[self.done:])
        if not new:
            return []
        if self.cache is None:
            self.cache = self.target.new_cache(2)
            self.last = self._feed(self.prompt)[-1]
        out = self._feed(new)  # row j predicts the token after new[j]
        rows = torch.cat([self.last[None], out[:-1]])
        self.last = out[-1]
        self.done += len(new)
        return _entries(rows, new, self.temperature, self.top)

    def _feed(self, tokens: list[int]) -> torch.Tensor:
        """Logits [len(tokens), V] of ``tokens`` at the next positions (causal over the cache)."""
        dev = self.target.device
        pos = torch.arange(self.fed, self.fed + len(tokens), device=dev)[None]
        mask = torch.arange(self.fed + len(tokens), device=dev)[None, None] <= pos[:, :, None]
        logits, _ = self.target(torch.tensor([tokens], device=dev), pos, pos, torch.tensor([1], device=dev), mask,
                                self.cache)
        self.fed += len(tokens)
        return logits[0]


def completion_logprobs(tokenizer: Any, entries: list[TokenLogprob], start: int = 0) -> dict[str, Any]:
    """The completions shape: tokens, token_logprobs, top_logprobs (text -> logprob), text_offset
    (from ``start``: a streamed chunk's first token's offset in the whole reply)."""
    texts = [decode_text(tokenizer, [t]) for t, _, _ in entries]
    offsets, at = [], start
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
