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

    `advance(tokens, done)` returns the new text the client may see: the text so far up to the
    first stop string to end (then `stopped` is True and nothing more comes), less a tail that
    could still become a stop string or is a character whose bytes have not all come (unless
    ``done``). ``tokens`` is the request's whole list, grown between calls.

    The decode is incremental (as vLLM's detokenizer): each call decodes only the tokens since
    the last clean point with the chunk before them as context (a word's leading space or a
    multi-byte character may need it), and keeps only the text not yet sent plus the stop
    strings' hold, so the work per token does not grow with the answer's length."""

    def __init__(self, tokenizer: Any, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.hold = max((len(s) - 1 for s in self.stop), default=0)
        self.sent = 0  # characters handed out
        self.stopped = False
        self.decoded_ids = 0  # ids passed to the tokenizer's decode, all calls together
        self._prefix = 0  # tokens[_prefix:_read]: the context chunk, decoded as _prefix_text
        self._read = 0  # tokens before this are in the text (they decoded cleanly)
        self._prefix_text = ""
        self._base = 0  # the absolute character index where _buf starts
        self._buf = ""  # the text of tokens[:_read] from _base on

    def _decode(self, ids: Sequence[int]) -> str:
        self.decoded_ids += len(ids)
        return decode_text(self.tokenizer, ids)

    def _text_so_far(self, tokens: Sequence[int]) -> str:
        """The text of ``tokens`` from `_base` on: the clean text kept plus the new tokens'
        decode in context; the offsets move on when that decode ends cleanly."""
        if len(tokens) <= self._read:
            return self._buf
        new = self._decode(tokens[self._prefix:])[len(self._prefix_text):]
        if new.endswith(REPLACEMENT):  # bytes of a character still to come: decoded again next time
            return self._buf + new
        self._buf += new
        self._prefix, self._read = self._read, len(tokens)
        self._prefix_text = self._decode(tokens[self._prefix:self._read])
        return self._buf

    def advance(self, tokens: Sequence[int], done: bool) -> str:
        if self.stopped:
            return ""
        text, base = self._text_so_far(tokens), self._base
        cut = self._first_stop(text)
        if cut is not None:
            self.stopped = True
            cut += base
            out, self.sent = text[self.sent - base:cut - base], max(self.sent, cut)
            return out
        end = len(text)
        if not done:
            while end > self.sent - base and text[end - 1] == REPLACEMENT:
                end -= 1
            end = max(self.sent - base, end - self.hold)
        out, self.sent = text[self.sent - base:end], end + base
        keep = min(len(self._buf), max(0, self.sent - self.hold - base))  # a stop string may start after
        self._buf, self._base = self._buf[keep:], base + keep
        return out

    def _first_stop(self, text: str) -> int | None:
        """Where the text is cut: before the stop string that ends first in the committed text
        (the longest of those ending there), as a reader given one character at a time would
        cut, so the cut never depends on how many tokens a step committed."""
        start = max(0, self.sent - self.hold - self._base)
        best: tuple[int, int] | None = None  # (end, start) of the stop string ending first
        for s in self.stop:
            i = text.find(s, start)
            if i >= 0 and (best is None or (i + len(s), i) < best):
                best = (i + len(s), i)
        return None if best is None else best[1]
