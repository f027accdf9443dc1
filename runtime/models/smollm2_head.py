"""The default EAGLE-3 head of SmolLM2-135M-Instruct: made by `draftgraph train-head` and kept in
the repository (``data/smollm2_eagle3/``: bf16 safetensors, its config, and the exact command
and prompt set that made it), read through the same loader as any published head."""

from __future__ import annotations

from pathlib import Path

__all__ = ["DEFAULT_HEAD", "default_head_dir"]

DEFAULT_HEAD = Path(__file__).resolve().parent / "data" / "smollm2_eagle3"


def default_head_dir(target_dir: Path | None = None) -> Path:
    """The shipped head's folder; ValueError saying how to make one when it is missing."""
    if (DEFAULT_HEAD / "config.json").is_file():
        return DEFAULT_HEAD
    raise ValueError(f"{DEFAULT_HEAD}: the default SmolLM2 head is missing from this installation; make one "
                     f"with `draftgraph train-head --target {target_dir or 'smollm2'} --out DIR` and pass --draft DIR")
