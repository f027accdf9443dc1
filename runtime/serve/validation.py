"""Request bodies of the OpenAI-compatible routes, checked at the edge.

Every refusal is a `BadRequest` naming the field, the value and the rule (HTTP 400; an unknown
model is 404), raised before anything reaches the engine. Sampling fields (``temperature``,
``top_p``, ``top_k``, ``min_p``, ``seed``, ``n``) are checked by `sampling_fields`; what the server
does not implement (penalties other than 0, ``echo``, ``best_of`` > 1) is refused at the values
that would change the reply, and any field not listed here is refused, never silently
ignored (``logit_bias``, ``response_format``, ...).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .logprobs import MAX_TOP_LOGPROBS
from .sampling_fields import RequestSampling, SamplingFieldError, parse_sampling

__all__ = ["BadRequest", "GenerationRequest", "parse_body", "parse_completion", "parse_chat",
           "MAX_STOP_STRINGS"]

MAX_STOP_STRINGS = 4
MAX_STOP_CHARS = 256
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions


class BadRequest(ValueError):
    """A refused request: ``field`` (the JSON path), the message, and the HTTP status."""

    def __init__(self, field: str, message: str, status: int = 400) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.status = status


@dataclass(frozen=True)
class GenerationRequest:
    """A checked request, ready for the engine: either ``prompt`` (text) or ``messages``."""

    kind: str  # "completion" or "chat"
    model: str
    max_tokens: int
    prompt: str | list[int] | None = None
    messages: tuple[dict[str, str], ...] = ()
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    sampling: RequestSampling = RequestSampling()
    logprobs: int | None = None  # alternatives per token when log-probabilities are asked for (None: not)


def parse_body(raw: bytes) -> dict[str, Any]:
    """The JSON object of a body; `BadRequest` ("body") for anything else."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise BadRequest("body", f"malformed JSON ({str(exc)[:200]})") from None
    if not isinstance(data, dict):
        raise BadRequest("body", f"must be a JSON object, got {type(data).__name__}")
    return data


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _int(field: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(field, f"{_shown(value)} must be an integer")
    if not low <= value <= high:
        raise BadRequest(field, f"{value} must be in [{low}, {high}]")
    return value


def _number(field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRequest(field, f"{_shown(value)} must be a number")
    return float(value)


def _bool(field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise BadRequest(field, f"{_shown(value)} must be true or false")
    return value


def _greedy_only(field: str, value: Any, allowed: Callable[[Any], bool], rule: str) -> None:
    if value is not None and not allowed(value):
        raise BadRequest(field, f"{_shown(value)}: {rule} (not implemented by this server)")


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise BadRequest("stop", f"{_shown(value)} must be a string or a list of strings")
    if len(items) > MAX_STOP_STRINGS:
        raise BadRequest("stop", f"{len(items)} strings: at most {MAX_STOP_STRINGS}")
    for i, s in enumerate(items):
        if not s or len(s) > MAX_STOP_CHARS:
            raise BadRequest(f"stop[{i}]", f"{_shown(s)} must have 1..{MAX_STOP_CHARS} characters")
    return tuple(items)


def _stream_options(value: Any, stream: bool) -> bool:
    if value is None:
        return False
    if not stream:
        raise BadRequest("stream_options", "only with stream=true")
    if not isinstance(value, dict) or set(value) - {"include_usage"}:
        raise BadRequest("stream_options", f"{_shown(value)} must be an object with include_usage only")
    return _bool("stream_options.include_usage", value.get("include_usage", False))


_COMMON = {"model", "max_tokens", "stop", "stream", "stream_options", "temperature", "top_p", "n",
           "logprobs", "user", "seed", "presence_penalty", "frequency_penalty", "top_k", "min_p"}
_COMPLETION = _COMMON | {"prompt", "echo", "best_of"}
_CHAT = _COMMON | {"messages", "max_completion_tokens", "top_logprobs"}


def _common(data: Mapping[str, Any], allowed: set[str], model: str, max_tokens_limit: int,
            max_tokens_field: str) -> dict[str, Any]:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise BadRequest(unknown[0], "unknown field (not supported by this server; it is refused, not ignored)")
    name = data.get("model")
    if not isinstance(name, str):
        raise BadRequest("model", f"{_shown(name)} must be a string (the served model: {model!r})")
    if name != model:
        raise BadRequest("model", f"{name!r} is not served here (GET /v1/models: {model!r})", status=404)
    try:
        sampling = parse_sampling(data)
    except SamplingFieldError as exc:
        raise BadRequest(exc.field, str(exc)) from None
    for f in ("presence_penalty", "frequency_penalty"):
        _greedy_only(f, data.get(f), lambda v, f=f: _number(f, v) == 0.0, "only 0 is supported")
    if data.get("user") is not None and not isinstance(data["user"], str):
        raise BadRequest("user", f"{_shown(data['user'])} must be a string")
    raw_max = data.get(max_tokens_field, data.get("max_tokens"))
    field = max_tokens_field if data.get(max_tokens_field) is not None else "max_tokens"
    max_tokens = DEFAULT_MAX_TOKENS if raw_max is None else _int(field, raw_max, 1, max_tokens_limit)
    stream = False if data.get("stream") is None else _bool("stream", data["stream"])
    if stream and sampling.n > 1:
        raise BadRequest("n", f"{sampling.n}: n > 1 is answered whole, not streamed (stream=false)")
    return {"model": name, "max_tokens": max_tokens, "stop": _stop(data.get("stop")), "stream": stream,
            "include_usage": _stream_options(data.get("stream_options"), stream), "sampling": sampling}


def parse_completion(data: Mapping[str, Any], model: str, max_tokens_limit: int) -> GenerationRequest:
    """A ``POST /v1/completions`` body: ``prompt`` is one string or one list of token ids."""
    common = _common(data, _COMPLETION, model, max_tokens_limit, "max_tokens")
    logprobs = data.get("logprobs")
    if logprobs is not None:
        logprobs = _int("logprobs", logprobs, 0, MAX_TOP_LOGPROBS)
    _greedy_only("echo", data.get("echo"), lambda v: v is False, "only false is supported")
    _greedy_only("best_of", data.get("best_of"), lambda v: v == 1, "only 1 is supported")
    prompt = data.get("prompt")
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt) and prompt:
        return GenerationRequest("completion", prompt=list(prompt), logprobs=logprobs, **common)
    if not isinstance(prompt, str):
        raise BadRequest("prompt", f"{_shown(prompt)} must be a string or a non-empty list of token ids "
                                   f"(one prompt per request)")
    if not prompt:
        raise BadRequest("prompt", "'' : a prompt needs at least one character")
    return GenerationRequest("completion", prompt=prompt, logprobs=logprobs, **common)


def parse_chat(data: Mapping[str, Any], model: str, max_tokens_limit: int) -> GenerationRequest:
    """A ``POST /v1/chat/completions`` body: ``messages`` with string contents."""
    common = _common(data, _CHAT, model, max_tokens_limit, "max_completion_tokens")
    wanted = data.get("logprobs") is not None and _bool("logprobs", data["logprobs"])
    top = data.get("top_logprobs")
    top = None if top is None else _int("top_logprobs", top, 0, MAX_TOP_LOGPROBS)
    if top is not None and not wanted:
        raise BadRequest("top_logprobs", f"{top}: only with logprobs=true")
    logprobs = (top or 0) if wanted else None
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages", f"{_shown(messages)} must be a non-empty list of messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise BadRequest(f"messages[{i}]", f"{_shown(m)} must be an object with role and content")
        extra = sorted(set(m) - {"role", "content", "name"})
        if extra:
            raise BadRequest(f"messages[{i}].{extra[0]}", "unknown field (refused, not ignored)")
        role, content = m.get("role"), m.get("content")
        if role not in ("system", "user", "assistant", "developer"):
            raise BadRequest(f"messages[{i}].role", f"{_shown(role)} must be system, developer, user or assistant")
        if not isinstance(content, str):
            raise BadRequest(f"messages[{i}].content", f"{_shown(content)} must be a string (text only)")
        out.append({"role": role, "content": content})
    return GenerationRequest("chat", messages=tuple(out), logprobs=logprobs, **common)
