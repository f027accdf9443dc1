"""Chat prompts as a user gives them: a JSONL file of ``{"prompt": "..."}`` or
``{"messages": [{"role": ..., "content": ...}, ...]}`` lines, and their token ids through the
model's own chat template (plain encoding when the tokenizer has none, or when asked ``raw``).

The project ships a set of held-out chat prompts (`demo_prompts`, ``data/demo_prompts.jsonl``)
that `simulate` and the benchmarks send to a model with a chat template.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ChatPrompt", "DEMO_PROMPTS", "demo_prompts", "encode_all", "encode_prompt", "encode_text",
           "has_chat_template", "read_prompt_file"]

DEMO_PROMPTS = Path(__file__).resolve().parent / "data" / "demo_prompts.jsonl"
ROLES = ("system", "user", "assistant")
MAX_LINES = 100_000


@dataclass(frozen=True)
class ChatPrompt:
    """One request: ``messages`` (role, content) pairs; a bare prompt is one user message."""

    messages: tuple[tuple[str, str], ...]

    @property
    def text(self) -> str:
        """The last user message (what a report shows)."""
        return next((c for r, c in reversed(self.messages) if r == "user"), self.messages[-1][1])

    def as_dicts(self) -> list[dict[str, str]]:
        return [{"role": r, "content": c} for r, c in self.messages]


def _parse(line: str, where: str) -> ChatPrompt:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not JSON ({exc.msg})") from None
    if isinstance(obj, dict) and isinstance(obj.get("prompt"), str) and obj["prompt"]:
        return ChatPrompt((("user", obj["prompt"]),))
    msgs = obj.get("messages") if isinstance(obj, dict) else None
    if not isinstance(msgs, list) or not msgs:
        raise ValueError(f"{where}: must be an object with a non-empty string \"prompt\" or a non-empty "
                         f"\"messages\" list")
    out = []
    for i, m in enumerate(msgs):
        if not (isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)):
            raise ValueError(f"{where}: messages[{i}]={m!r}: must be {{\"role\": one of {list(ROLES)}, "
                             f"\"content\": a string}}")
        out.append((m["role"], m["content"]))
    return ChatPrompt(tuple(out))


def read_prompt_file(path: str | Path) -> list[ChatPrompt]:
    """Every prompt of a JSONL file (blank lines skipped); ValueError naming the file and line."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--prompts={str(path)!r}: not readable ({exc})") from None
    if len(lines) > MAX_LINES:
        raise ValueError(f"--prompts={str(path)!r}: {len(lines)} lines; at most {MAX_LINES}")
    out = [_parse(line, f"{path}:{n}") for n, line in enumerate(lines, 1) if line.strip()]
    if not out:
        raise ValueError(f"--prompts={str(path)!r}: no prompts (one JSON object a line)")
    return out


def demo_prompts(n: int | None = None) -> list[ChatPrompt]:
    """The shipped held-out chat prompts (the first ``n``, repeated in order when n is larger)."""
    items = read_prompt_file(DEMO_PROMPTS)
    if n is None:
        return items
    return [items[i % len(items)] for i in range(n)]


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None)) and hasattr(tokenizer, "apply_chat_template")


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` as it is (no special tokens added: the text is the prompt)."""
    try:
        return list(tokenizer.encode(text, add_special_tokens=False))
    except TypeError:  # the byte tokenizer and IdText take the text alone
        return list(tokenizer.encode(text))


def encode_prompt(tokenizer: Any, prompt: ChatPrompt | str, raw: bool = False) -> list[int]:
    """Token ids of ``prompt``: the chat template with the assistant's turn opened when the
    tokenizer has one (and not ``raw``), else the text encoded as it is."""
    item = ChatPrompt((("user", prompt),)) if isinstance(prompt, str) else prompt
    if raw or not has_chat_template(tokenizer):
        return encode_text(tokenizer, "\n".join(c for _, c in item.messages))
    return encode_text(tokenizer, tokenizer.apply_chat_template(item.as_dicts(), add_generation_prompt=True,
                                                                tokenize=False))


def encode_all(tokenizer: Any, prompts: Sequence[ChatPrompt], raw: bool = False) -> list[list[int]]:
    return [encode_prompt(tokenizer, p, raw) for p in prompts]
