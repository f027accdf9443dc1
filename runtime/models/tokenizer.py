"""Byte tokenizer: ids 0..255 are bytes, then a few specials; any text works, no download."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ByteTokenizer", "default_tokenizer", "BOS_ID", "EOS_ID", "VOCAB_SIZE"]

BOS_ID = 256
EOS_ID = 257
VOCAB_SIZE = 260  # 256 bytes, BOS, EOS and two spare ids (never produced by encode)


@dataclass(frozen=True)
class ByteTokenizer:
    """UTF-8 bytes as ids; `decode` drops specials and replaces invalid UTF-8."""

    vocab_size: int = VOCAB_SIZE
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (its UTF-8 bytes)."""
        if not isinstance(text, str):
            raise TypeError(f"text={type(text).__name__}: must be a str")
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        """Text of byte ids (special ids are skipped)."""
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")


def default_tokenizer() -> ByteTokenizer:
    """The tokenizer of the default models."""
    return ByteTokenizer()
