"""Text for a transformers target: its own tokenizer (``AutoTokenizer``) when the checkpoint has
one, else token ids written as text ("12 7 99"), and `simulate`'s prompts in its vocabulary."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["TOKENIZER_FILES", "IdText", "eos_id_of", "load_tokenizer", "prompts_for"]

logger = logging.getLogger(__name__)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


class IdText:
    """The text form of a checkpoint without a tokenizer: ids separated by spaces."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        try:
            ids = [int(t) for t in text.replace(",", " ").split()]
        except ValueError as exc:
            raise ValueError(f"text={text!r}: this checkpoint has no tokenizer ({', '.join(TOKENIZER_FILES)}); "
                             f"give token ids separated by spaces") from exc
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if not ids or bad:
            raise ValueError(f"text={text!r}: token ids must be ints in [0, {self.vocab_size}) (at least one)")
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return " " + " ".join(str(i) for i in ids)


def eos_id_of(tokenizer: Any) -> int | None:
    """The tokenizer's end-of-sequence id (the byte tokenizer's ``eos_id``, a transformers
    tokenizer's ``eos_token_id``), or None."""
    for name in ("eos_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def load_tokenizer(source: str | Path, vocab_size: int) -> Any:
    """``AutoTokenizer`` of ``source`` when it has tokenizer files (a hub id: always tried), else
    `IdText`."""
    folder = Path(source)
    if folder.is_dir() and not any((folder / n).is_file() for n in TOKENIZER_FILES):
        return IdText(vocab_size)
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(source), trust_remote_code=False)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{source}: tokenizer not loadable ({exc})") from exc


def prompts_for(texts: Sequence[bytes], tokenizer: Any, vocab_size: int) -> list[list[int]]:
    """Prompts in the target's vocabulary: each text encoded by its tokenizer, or (no tokenizer)
    its bytes as ids modulo the vocabulary."""
    if isinstance(tokenizer, IdText):
        return [[b % vocab_size for b in t] for t in texts]
    return [tokenizer.encode(t.decode("utf-8", errors="replace"), add_special_tokens=False) or [0] for t in texts]
