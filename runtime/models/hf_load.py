"""Loading a transformers checkpoint as the engine's target (`load_target`).

A local folder written by ``save_pretrained`` (config.json plus safetensors or ``weights_only``
torch files), or a hub id where the hub is reachable. Everything wrong with a folder is a
ValueError naming the file and the key: a missing or unreadable config.json, remote code
(``auto_map``), an unsupported model type, a damaged weights file, a missing, unexpected or
mis-shaped tensor (transformers would otherwise initialise a missing tensor at random and only
log it).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .hf_checks import SUPPORTED_TYPES
from .hf_target import HFTarget
from .q4_linear import WEIGHTS, compute_as_q4

__all__ = ["DTYPES", "check_weights", "load_config", "load_target", "parse_dtype", "read_config", "weight_files"]

logger = logging.getLogger(__name__)

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_MAX_LEN = 512


def check_weights(weights: str, device: str | torch.device = "cpu",
                  dtype: str | torch.dtype = torch.float64) -> None:
    """ValueError unless ``weights`` is one of `WEIGHTS`, and "q4" runs on the CPU with a float64
    stream (`q4_linear` says why)."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights={weights!r}: must be one of {list(WEIGHTS)}")
    if weights == "q4" and torch.device(device).type != "cpu":
        raise ValueError(f"weights='q4' on device={str(device)!r}: the int4 kernel used here is the CPU one")
    if weights == "q4" and parse_dtype(dtype) != torch.float64:
        raise ValueError(f"weights='q4' with dtype={dtype!r}: a q4 target keeps its stream in float64 (rounding a "
                         f"float32 stream into the int4 kernel's bfloat16 is not row-invariant, so a speculative "
                         f"run could leave plain greedy decoding)")


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """A torch dtype from its name (`DTYPES`) or itself."""
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise ValueError(f"dtype={dtype!r}: must be one of {list(DTYPES)}")


def read_config(folder: Path) -> dict[str, Any]:
    """``folder/config.json`` as a dict (ValueError naming the file and what is wrong)."""
    path = folder / "config.json"
    if not path.is_file():
        raise ValueError(f"{path}: missing (a checkpoint folder written by save_pretrained holds config.json)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not readable JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: holds a {type(data).__name__}, not a JSON object")
    return data


def weight_files(folder: Path) -> list[Path]:
    """The weights files of a checkpoint folder (safetensors first, else torch files)."""
    found = sorted(folder.glob("*.safetensors"))
    return found or sorted(folder.glob("*.bin")) + sorted(folder.glob("*.pt"))


def damaged_file(folder: Path) -> str | None:
    """The first safetensors file of ``folder`` whose header or tensors cannot be read, with the
    reason (None: all read)."""
    from safetensors import safe_open

    for path in sorted(folder.glob("*.safetensors")):
        key = None
        try:
            with safe_open(str(path), framework="pt") as fh:
                for key in fh.keys():
                    fh.get_slice(key)
        except Exception as exc:  # safetensors raises its own error type for a damaged file
            where = f" at key {key!r}" if key else ""
            return f"{path}{where}: {exc}"
    return None


def _check_folder_config(folder: Path) -> None:
    path = folder / "config.json"
    data = read_config(folder)
    if data.get("auto_map"):
        raise ValueError(f"{path}: key 'auto_map' (remote code, trust_remote_code) is refused; only "
                         f"transformers' own model code is run")
    mtype = data.get("model_type")
    if mtype not in SUPPORTED_TYPES:
        raise ValueError(f"{path}: key 'model_type'={mtype!r} is not supported; supported: {list(SUPPORTED_TYPES)}")
    if not weight_files(folder):
        raise ValueError(f"{folder}: no weights file (*.safetensors, *.bin or *.pt)")


def load_config(source: str | Path) -> Any:
    """The transformers config of checkpoint ``source`` (a folder, checked as `load_target` does,
    or a hub id); ValueError naming the file and the key."""
    from transformers import AutoConfig

    folder = Path(source)
    local = folder.is_dir()
    if local:
        _check_folder_config(folder)
    elif isinstance(source, Path) or str(source).startswith((".", "/", "~")):
        raise ValueError(f"target={str(source)!r}: not a folder")
    try:
        return AutoConfig.from_pretrained(str(source), trust_remote_code=False)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        where = folder / "config.json" if local else source
        raise ValueError(f"{where}: not a loadable transformers config ({exc})") from exc


def load_target(source: str | Path, dtype: str | torch.dtype = "float64", max_len: int | None = None,
                feature_layers: Sequence[int] | None = None, device: str | torch.device = "cpu",
                weights: str = "dense") -> HFTarget:
    """An `HFTarget` from a checkpoint folder (or a hub id) in ``dtype`` with a cache of
    ``max_len`` positions per request (None: `DEFAULT_MAX_LEN` or the model's
    max_position_embeddings when smaller); ``feature_layers`` as `HFTarget`'s. ``weights`` "q4"
    computes the decoder's linear layers from their Q4_1 codes and the output layer in float32
    (`q4_linear`; CPU only; ``dtype`` float64, the stream's; the weights must be a Q4_1
    dequantization, as the converted SmolLM2 is)."""
    from transformers import AutoModelForCausalLM

    torch_dtype = parse_dtype(dtype)
    check_weights(weights, device, torch_dtype)
    folder = Path(source)
    local = folder.is_dir()
    config = load_config(source)
    try:
        model, info = AutoModelForCausalLM.from_pretrained(str(source), config=config, dtype=torch_dtype,
                                                           trust_remote_code=False, output_loading_info=True)
    except Exception as exc:  # safetensors, torch and transformers each raise their own types
        damaged = damaged_file(folder) if local else None
        raise ValueError(damaged or f"{source}: weights not loadable ({exc})") from exc
    files = ", ".join(p.name for p in weight_files(folder)) if local else str(source)
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        keys = sorted(info.get(kind) or [], key=str)
        if keys:
            raise ValueError(f"{folder if local else source} ({files}): {kind.replace('_', ' ')}: {keys[0]!r}"
                             f"{f' and {len(keys) - 1} more' if len(keys) > 1 else ''}")
    model = model.to(device)
    if weights == "q4":
        compute_as_q4(model)
    if max_len is None:
        limit = getattr(config, "max_position_embeddings", None)
        max_len = min(DEFAULT_MAX_LEN, limit) if isinstance(limit, int) and limit > 1 else DEFAULT_MAX_LEN
    logger.info("loaded target %s from %s (%s)", type(model).__name__, source, torch_dtype)
    return HFTarget(model, max_len, feature_layers)
