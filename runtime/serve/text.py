"""Text on both sides of the engine: chat prompts, and a request's tokens turned into the text
its client may see so far (stop strings cut, a partial UTF-8 character held back)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..models.prompt_file import encode_text as encode_prompt

__all__ = ["chat_prompt_ids", "decode_text", "encode_prompt", "TextCursor"]

REPLACEMENT = "\ufffd"  # what a decode shows for bytes of a character not complete yet


def decode_text(tokenizer: Any, ids: Sequence[int]) -> str:
    """Text of generated ids, special tokens (EOS) left out."""
    try:
        return tokenizer.decode(list(ids), skip_special_tokens=True)
    except TypeError:  # the byte tokenizer skips them anyway; IdText takes the ids only
        return tokenizer.decode(list(ids))


def plain_chat_text(messages: Sequence[dict[str, str]]) -> str:
    """The plain template of a tokenizer without one: ``role: content`` lines, then
    ``assistant:`` for the answer."""
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


def chat_prompt_ids(tokenizer: Any, messages: Sequence[dict[str, str]]) -> list[int]:
    """Prompt ids of a chat: the tokenizer's chat template when it has one, else the plain one."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
        return encode_prompt(tokenizer, text)
    return encode_prompt(tokenizer, plain_chat_text(messages))


class TextCursor:
    """The text of one request's tokens, handed out piece by piece.

    `advance(tokens, done)` returns the new text the client may see: the whole decode up to the
    first stop string to end (then `stopped` is True and nothing more comes), less a tail that could still
    become a stop string or is a character whose bytes have not all come (unless ``done``)."""

    def __init__(self, tokenizer: Any, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.hold = max((len(s) - 1 for s in self.stop), default=0)
        self.sent = 0  # characters handed out
        self.stopped = False
        self.tokens_used = 0

    def advance(self, tokens: Sequence[int], done: bool) -> str:
        if self.stopped:
            return ""
        text = decode_text(self.tokenizer, tokens)
        cut = self._first_stop(text)
        if cut is not None:
            self.stopped = True
            out, self.sent = text[self.sent:cut], max(self.sent, cut)
            return out
        end = len(text)
        if not done:
            while end > self.sent and text[end - 1] == REPLACEMENT:
                end -= 1
            end = max(self.sent, end - self.hold)
        out, self.sent = text[self.sent:end], end
        return out

    def _first_stop(self, text: str) -> int | None:
        """Where the text is cut: before the stop string that ends first in the committed text
        (the longest of those ending there), as a reader given one character at a time would
        cut, so the cut never depends on how many tokens a step committed."""
        start = max(0, self.sent - self.hold)
        best: tuple[int, int] | None = None  # (end, start) of the stop string ending first
        for s in self.stop:
            i = text.find(s, start)
            if i >= 0 and (best is None or (i + len(s), i) < best):
                best = (i + len(s), i)
        return None if best is None else best[1]
