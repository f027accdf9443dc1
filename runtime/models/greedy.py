"""The plain target-only references, one token per forward, no speculation: greedy decoding
(`greedy_generate`) and its sampled twin (`sampled_generate`: the same loop, each token drawn
by `sampling.choose_tokens` keyed by the request's seed and the token's position)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..sampling import SamplingParams, SamplingRows, choose_tokens, per_prompt
from .hf_target import HFTarget

__all__ = ["greedy_generate", "prefill", "prefill_batch", "sampled_generate"]


def _check_prompts(model: HFTarget, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens!r}: must be an int >= 1")
    v, limit = model.vocab_size, model.cfg.max_len
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompts[{i}]: empty; a prompt needs at least one token")
        bad = [t for t in p if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < v]
        if bad:
            raise ValueError(f"prompts[{i}] has token {bad[0]!r}: ids must be ints in [0, {v})")
        if len(p) + max_new_tokens > limit:
            raise ValueError(
                f"prompts[{i}]: {len(p)} prompt + {max_new_tokens} new tokens exceed max_len={limit}"
            )


@torch.no_grad()
def prefill(model: HFTarget, cache, slot: int, prompt: Sequence[int]
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Run a prompt into ``slot`` (causal): (logits [T, V], hidden [T, d])."""
    dev = model.device
    t = len(prompt)
    tokens = torch.tensor([list(prompt)], dtype=torch.long, device=dev)
    pos = torch.arange(t, device=dev).unsqueeze(0)
    mask = torch.ones(t, t, dtype=torch.bool, device=dev).tril().unsqueeze(0)
    logits, hidden = model(tokens, pos, pos, torch.tensor([slot], device=dev), mask, cache)
    return logits[0], hidden[0]


@torch.no_grad()
def prefill_batch(target: HFTarget, prompts: Sequence[Sequence[int]]) -> tuple[object, list[list[int]]]:
    """A cache of one slot per prompt (slot i + 1; 0 is the dummy) with every prompt prefilled
    one by one, and each prompt's first greedy token: (cache, [[token], ...])."""
    cache = target.new_cache(len(prompts) + 1)
    out: list[list[int]] = []
    for i, p in enumerate(prompts):
        logits, _ = prefill(target, cache, i + 1, p)
        out.append([int(logits[-1].argmax())])
    return cache, out


@torch.no_grad()
def greedy_generate(target: HFTarget, prompts: Sequence[Sequence[int]],
                    max_new_tokens: int, eos_id: int | None = None) -> list[list[int]]:
    """Greedy continuation of every prompt (token-id lists): ``max_new_tokens`` ids each, or
    with ``eos_id`` up to and including the first eos (decoding stops once every row has one).

    Prompts are prefilled one by one, then decoded together one token per forward."""
    _check_prompts(target, prompts, max_new_tokens)
    cache, out = prefill_batch(target, prompts)
    return _decode(target, cache, prompts, out, lambda logits, lens: logits[:, 0].argmax(-1), max_new_tokens, eos_id)


@torch.no_grad()
def sampled_generate(target: HFTarget, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                     sampling: SamplingParams | Sequence[SamplingParams], eos_id: int | None = None
                     ) -> list[list[int]]:
    """`greedy_generate` with each prompt's ``sampling`` (one for all, or one per prompt; a
    sampled one needs its seed): the token at position t is drawn from the filtered
    distribution with the uniforms keyed by (seed, t), so any engine drawing through the same
    function emits these tokens. ``eos_id``: each output ends at its first eos, as there."""
    _check_prompts(target, prompts, max_new_tokens)
    per = per_prompt(sampling, len(prompts))
    for i, s in enumerate(per):
        if not isinstance(s, SamplingParams):
            raise TypeError(f"sampling[{i}]={s!r}: must be a SamplingParams")
        if not s.greedy and s.seed is None:
            raise ValueError(f"sampling[{i}]: seed=None; a sampled reference needs its seed")
    dev = target.device
    b = len(prompts)
    rows = SamplingRows.of(per, dev)
    cache = target.new_cache(b + 1)
    last_logits = []
    for i, p in enumerate(prompts):
        logits, _ = prefill(target, cache, i + 1, p)
        last_logits.append(logits[-1])
    lens = torch.tensor([len(p) for p in prompts], device=dev)
    last = choose_tokens(torch.stack(last_logits)[:, None], lens[:, None], rows)[:, 0]
    out = [[t] for t in last.tolist()]
    def draw(logits: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
        return choose_tokens(logits, at[:, None] + 1, rows)[:, 0]

    return _decode(target, cache, prompts, out, draw, max_new_tokens, eos_id)


def _decode(target: HFTarget, cache: object, prompts: Sequence[Sequence[int]], out: list[list[int]],
            choose: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], max_new_tokens: int,
            eos_id: int | None) -> list[list[int]]:
    """Plain decoding after the prefill: one token a forward for every row at once, the next
    token ``choose(logits [b, 1, V], lens [b])`` -> [b] (lens: the positions just written), each
    row's tokens appended to ``out`` (each holds its first token); stops after ``max_new_tokens``
    or once every row holds ``eos_id``."""
    dev = target.device
    lens = torch.tensor([len(p) for p in prompts], device=dev)
    slots = torch.arange(1, len(prompts) + 1, device=dev)
    last = torch.tensor([o[-1] for o in out], device=dev)
    for _ in range(max_new_tokens - 1):
        if eos_id is not None and all(eos_id in o for o in out):
            break
        lk = int(lens.max()) + 1
        mask = (torch.arange(lk, device=dev)[None] <= lens[:, None]).unsqueeze(1)
        logits, _ = target(last[:, None], lens[:, None], lens[:, None], slots, mask, cache)
        last = choose(logits, lens)
        lens = lens + 1
        for o, t in zip(out, last.tolist()):
            o.append(t)
    return _cut_at_eos(out, eos_id)


def _cut_at_eos(out: list[list[int]], eos_id: int | None) -> list[list[int]]:
    """Each row up to and including its first ``eos_id`` (all of it when there is none)."""
    if eos_id is None:
        return out
    return [o[:o.index(eos_id) + 1] if eos_id in o else o for o in out]
