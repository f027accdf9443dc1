"""Sampling without loss: per-request parameters (`SamplingParams`), keyed random numbers
(`keyed_uniform`) and the filtered, keyed draw every emitted token goes through (`choose_tokens`).

Plain decoding and the speculative verify draw through the same functions, so a seeded
speculative run emits the seeded plain run's tokens (docs/sampling.md)."""

from .keyed import keyed_uniform
from .params import GREEDY, SamplingParams, per_prompt
from .sample import SamplingRows, choose_tokens, filter_logits

__all__ = ["GREEDY", "SamplingParams", "SamplingRows", "choose_tokens", "filter_logits", "keyed_uniform", "per_prompt"]
