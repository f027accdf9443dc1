"""The OpenAI sampling fields of a request, checked at the edge, and the defaults they fall back
on: ``temperature`` (0..2), ``top_p`` (0..1], ``seed``, ``n`` (1..`MAX_N`) and the common
extensions ``top_k`` / ``min_p``. A field the request leaves out takes the model's
``generation_config.json`` value when it has one (as vLLM does), else the engine's greedy
default (temperature 0: a reply that is the same on every call). Every refusal is a
`SamplingFieldError` naming the field, the value and the rule (the routes answer it with a 400)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftgraph.runtime.sampling import SamplingParams
from draftgraph.runtime.sampling.params import MAX_SEED

__all__ = ["MAX_N", "RequestSampling", "SamplingFieldError", "generation_defaults", "parse_sampling"]

logger = logging.getLogger(__name__)

MAX_N = 8  # choices per request (each one request of the batch)
_DEFAULT_KEYS = ("temperature", "top_p", "top_k", "min_p")


class SamplingFieldError(ValueError):
    """A refused sampling field: ``field`` and the message (value and rule)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class RequestSampling:
    """The sampling fields a request gave (None: left out) and its ``n``."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    n: int = 1

    def params(self, defaults: Mapping[str, Any]) -> list[SamplingParams | None]:
        """One `SamplingParams` per choice (None: greedy): the request's fields over ``defaults``;
        choice i draws with seed + i (no seed: the engine draws one per choice)."""
        given = {k: getattr(self, k) for k in _DEFAULT_KEYS if getattr(self, k) is not None}
        merged = {**{k: v for k, v in defaults.items() if k in _DEFAULT_KEYS}, **given}
        base = SamplingParams(**{"temperature": 0.0, **merged})
        if base.greedy:
            return [None] * self.n
        return [base if self.seed is None else base.with_seed((self.seed + i) % (MAX_SEED + 1)) for i in range(self.n)]


def _number(field: str, value: Any, low: float, high: float, low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SamplingFieldError(field, f"{value!r:.80} must be a number")
    if not (low < value <= high if low_open else low <= value <= high):
        raise SamplingFieldError(field, f"{value} must be in {'(' if low_open else '['}{low}, {high}]")
    return float(value)


def _integer(field: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SamplingFieldError(field, f"{value!r:.80} must be an integer")
    if not low <= value <= high:
        raise SamplingFieldError(field, f"{value} must be in [{low}, {high}]")
    return value


def parse_sampling(data: Mapping[str, Any]) -> RequestSampling:
    """The checked sampling fields of a request body (None / absent: left out)."""
    def get(name: str, check: Any) -> Any:
        value = data.get(name)
        return None if value is None else check(name, value)

    top_k = get("top_k", lambda f, v: _integer(f, v, -1, 1 << 30))
    return RequestSampling(
        temperature=get("temperature", lambda f, v: _number(f, v, 0.0, 2.0)),
        top_p=get("top_p", lambda f, v: _number(f, v, 0.0, 1.0, low_open=True)),
        top_k=None if top_k is None else max(top_k, 0),  # -1: every token (vLLM's spelling of 0)
        min_p=get("min_p", lambda f, v: _number(f, v, 0.0, 1.0)),
        seed=get("seed", lambda f, v: _integer(f, v, 0, MAX_SEED)),
        n=get("n", lambda f, v: _integer(f, v, 1, MAX_N)) or 1)


def generation_defaults(folder: str | None) -> dict[str, Any]:
    """temperature / top_p / top_k / min_p of ``folder``'s ``generation_config.json`` (a checkpoint
    folder; {} when there is none, it is unreadable, or a value is out of range: logged)."""
    if folder is None or not (Path(folder) / "generation_config.json").is_file():
        return {}
    try:
        cfg = json.loads((Path(folder) / "generation_config.json").read_text())
        out = {k: cfg[k] for k in _DEFAULT_KEYS if cfg.get(k) is not None}
        if cfg.get("do_sample") is False:
            out["temperature"] = 0.0  # the model's own default decodes greedily
        SamplingParams(**out)  # in range, or refused below
    except (OSError, ValueError, TypeError) as exc:
        logger.warning("%s/generation_config.json: %s; sampling defaults not taken from it", folder, exc)
        return {}
    return out
