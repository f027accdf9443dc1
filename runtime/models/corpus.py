"""Training text that ships with Python: the standard library's .py sources.

Excluded: ``encodings/`` (generated codec tables inflate acceptance), tests, and installed
third-party packages. About 7% of files (chosen by a hash of the path) are held out: prompts
for the engine's demos and acceptance checks come from there, never from training text.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

__all__ = ["Corpus", "load_corpus", "held_out_prompts"]

EXCLUDED_DIRS = {"encodings", "test", "tests", "idle_test", "site-packages", "dist-packages",
                 "__pycache__", "lib2to3", "ensurepip", "turtledemo"}
HELD_OUT_PERCENT = 7


@dataclass(frozen=True)
class Corpus:
    """Train and held-out bytes, and a digest of both (part of the model cache key)."""

    train: bytes
    held_out: bytes
    digest: str


def _is_held_out(rel: str) -> bool:
    return int(hashlib.sha1(rel.encode()).hexdigest(), 16) % 100 < HELD_OUT_PERCENT


@lru_cache(maxsize=1)
def load_corpus(root: str | None = None) -> Corpus:
    """Read the standard library's sources (sorted, deterministic) and split them by file."""
    base = Path(root or sysconfig.get_paths()["stdlib"])
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDED_DIRS)
        files.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py"))
    train, held = bytearray(), bytearray()
    h = hashlib.sha256()
    for path in sorted(files):
        rel = path.relative_to(base).as_posix()
        data = path.read_bytes()
        h.update(rel.encode() + b"\0" + data)
        (held if _is_held_out(rel) else train).extend(data + b"\n\n")
    if not train or not held:
        raise RuntimeError(f"no Python sources found under {base}: cannot build the training corpus")
    return Corpus(bytes(train), bytes(held), h.hexdigest()[:16])


def held_out_prompts(n: int, seed: int = 0, min_len: int = 24, max_len: int = 96) -> list[bytes]:
    """``n`` prompts cut from held-out text at seeded offsets, starting at a line start, with
    seeded lengths in [min_len, max_len]."""
    import random

    text = load_corpus().held_out
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        start = text.find(b"\n", rng.randrange(0, len(text) - max_len - 1)) + 1
        length = rng.randint(min_len, max_len)
        chunk = text[start:start + length]
        if len(chunk) == length and chunk.strip():
            out.append(chunk)
    return out
