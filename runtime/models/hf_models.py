"""One way in for a user's checkpoints: `load_models(target, draft)` -> (HFTarget, HFEagleHead).

The head's format is told by its weights: ``fc.weight`` [H, 2H] is EAGLE-1/2 (the target's final
normed state is its feature), [H, 3 * H_target] EAGLE-3 (three of the target's residual
streams). The EAGLE-3 layers (`eagle3_layers`): the config's
``eagle_config.eagle_aux_hidden_state_layer_ids`` name layer *outputs* (SGLang's and
SpecForge's reading: the stream entering id + 1), else the streams entering layers 2, L // 2 and
L - 3 (EAGLE-3's default). They are resolved once and logged. Everything that does not fit is a
ValueError naming the file and the key (a missing, unexpected or mis-shaped tensor, a ``d2t``
pointing outside the target's vocabulary, a head wider than its target).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from .eagle_heads import make_head
from .hf_eagle import HFEagleHead
from .hf_load import check_weights, load_config, load_target, parse_dtype, read_config
from .hf_target import NORMED, HFTarget

__all__ = ["draft_feature_layers", "eagle3_layers", "head_format", "head_shapes", "load_draft", "load_models",
           "read_head_weights"]

logger = logging.getLogger(__name__)

# keys a published head may hold that the engine does not read: the target's embedding (shared
# with the target, never copied) and EAGLE-3's target-to-draft map (t2d: d2t alone maps ids)
IGNORED_KEYS = ("embed_tokens.weight", "t2d")
WEIGHT_NAMES = ("model.safetensors", "pytorch_model.bin", "pytorch_model.pt")


def read_head_weights(folder: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    """(the weights file, its tensors) of a head folder; a leading ``model.`` on every key is
    dropped. ValueError naming the file when it is missing or damaged."""
    path = next((folder / n for n in WEIGHT_NAMES if (folder / n).is_file()), None)
    if path is None:
        raise ValueError(f"{folder}: no head weights (one of {list(WEIGHT_NAMES)})")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            tensors = load_file(str(path))
        else:
            tensors = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # safetensors and torch raise their own types for a damaged file
        raise ValueError(f"{path}: not readable ({exc})") from exc
    if not isinstance(tensors, Mapping) or not all(isinstance(v, torch.Tensor) for v in tensors.values()):
        raise ValueError(f"{path}: not a mapping of tensor names to tensors")
    tensors = dict(tensors)
    if tensors and all(k.startswith("model.") for k in tensors):
        tensors = {k[len("model."):]: v for k, v in tensors.items()}
    return path, tensors


def head_shapes(folder: Path) -> tuple[Path, dict[str, tuple[int, ...]]]:
    """(the weights file, every key's shape) of a head folder, from a safetensors header alone
    (a torch file is read whole); keys as `read_head_weights` gives them."""
    path = next((folder / n for n in WEIGHT_NAMES if (folder / n).is_file()), None)
    if path is None or path.suffix != ".safetensors":
        path, tensors = read_head_weights(folder)
        return path, {k: tuple(v.shape) for k, v in tensors.items()}
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as fh:
            shapes = {k: tuple(fh.get_slice(k).get_shape()) for k in fh.keys()}
    except Exception as exc:  # safetensors raises its own type for a damaged header
        raise ValueError(f"{path}: not readable ({exc})") from exc
    if shapes and all(k.startswith("model.") for k in shapes):
        shapes = {k[len("model."):]: v for k, v in shapes.items()}
    return path, shapes


def head_format(path: Path, shapes: Mapping[str, Sequence[int]], head_hidden: int, target_hidden: int) -> str:
    """"eagle1" or "eagle3", told by ``fc.weight``'s input width (2H or 3H_target); ``shapes``:
    every key's shape."""
    fc = shapes.get("fc.weight")
    if fc is None:
        raise ValueError(f"{path}: key 'fc.weight' missing (an EAGLE head's fc)")
    if len(fc) != 2 or fc[0] != head_hidden:
        raise ValueError(f"{path}: key 'fc.weight' has shape {list(fc)}; the head's hidden_size is "
                         f"{head_hidden} ([hidden, 2 * hidden] EAGLE-1/2, [hidden, 3 * target hidden] EAGLE-3)")
    if fc[1] == 3 * target_hidden and "midlayer.self_attn.q_proj.weight" in shapes:
        return "eagle3"
    if fc[1] == 2 * head_hidden:
        return "eagle1"
    raise ValueError(f"{path}: key 'fc.weight' has input width {fc[1]}: neither 2 * {head_hidden} (EAGLE-1/2) "
                     f"nor 3 * {target_hidden} with midlayer.* keys (EAGLE-3, target hidden {target_hidden})")


def eagle3_layers(head_config: Mapping[str, Any], n_layers: int, where: Path) -> tuple[int, int, int]:
    """The three residual streams (entering layer i; i == L: the last layer's output) an EAGLE-3
    head reads from a target of ``n_layers`` layers (see the module docstring)."""
    ids = (head_config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if ids is None:
        layers = (2, n_layers // 2, n_layers - 3)
    else:
        if not isinstance(ids, list) or len(ids) != 3 or not all(isinstance(i, int) for i in ids):
            raise ValueError(f"{where}: key 'eagle_config.eagle_aux_hidden_state_layer_ids'={ids!r}: must be "
                             f"three layer ids")
        layers = tuple(i + 1 for i in ids)
    bad = [i for i in layers if not 0 <= i <= n_layers]
    if bad:
        raise ValueError(f"{where}: EAGLE-3 layers {list(layers)} (streams entering each layer) do not fit a "
                         f"target of {n_layers} layers (each in [0, {n_layers}])")
    return layers  # type: ignore[return-value]


def _check_tensors(path: Path, head: HFEagleHead, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors to load, checked against the head's keys and shapes (ValueError naming the key)."""
    want = head.state_dict()
    given = {k: v for k, v in tensors.items() if k not in IGNORED_KEYS}
    missing = sorted(set(want) - set(given))
    if missing:
        raise ValueError(f"{path}: key {missing[0]!r} missing ({head.cfg.fmt} head)")
    extra = sorted(set(given) - set(want))
    if extra:
        raise ValueError(f"{path}: unexpected key {extra[0]!r} for an {head.cfg.fmt} head")
    for k, t in given.items():
        if tuple(t.shape) != tuple(want[k].shape):
            raise ValueError(f"{path}: key {k!r} has shape {list(t.shape)}, the head needs {list(want[k].shape)}")
        if t.is_floating_point() != want[k].is_floating_point():
            raise ValueError(f"{path}: key {k!r} has dtype {t.dtype}, the head needs {want[k].dtype}")
    if "d2t" in given:
        ids = torch.arange(given["d2t"].numel()) + given["d2t"].to(torch.long)
        if bool(((ids < 0) | (ids >= head.cfg.vocab_size)).any()):
            raise ValueError(f"{path}: key 'd2t' maps draft ids outside the target's vocabulary "
                             f"[0, {head.cfg.vocab_size})")
    return given


def load_draft(draft: str | Path, target: HFTarget, dtype: torch.dtype | None = None) -> HFEagleHead:
    """A published head from folder ``draft`` for ``target`` (whose features must be the head's:
    `load_models` sets them), in ``dtype`` (None: the target's)."""
    from transformers import LlamaConfig

    folder = Path(draft)
    if not folder.is_dir():
        raise ValueError(f"draft={str(draft)!r}: not a folder")
    data = read_config(folder)
    try:
        config = LlamaConfig.from_dict(data)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{folder / 'config.json'}: not a Llama head config ({exc})") from exc
    path, tensors = read_head_weights(folder)
    fmt = head_format(path, {k: tuple(v.shape) for k, v in tensors.items()}, config.hidden_size, target.cfg.dim)
    if config.hidden_size != target.cfg.dim:
        raise ValueError(f"{folder / 'config.json'}: key 'hidden_size'={config.hidden_size}, the target's is "
                         f"{target.cfg.dim} (the head shares the target's embedding)")
    want = (NORMED,) if fmt == "eagle1" else eagle3_layers(data, target.cfg.n_layers, folder / "config.json")
    if tuple(target.cfg.feature_layers) != tuple(want):
        raise ValueError(f"target features {list(target.cfg.feature_layers)} are not the {fmt} head's {list(want)}: "
                         f"load the target with feature_layers={list(want)} (load_models does)")
    vd = None
    if fmt == "eagle3":
        vd = tensors["lm_head.weight"].shape[0] if "lm_head.weight" in tensors else None
        named = data.get("draft_vocab_size")
        if vd is None or (named is not None and named != vd):
            raise ValueError(f"{path}: key 'lm_head.weight' rows {vd} do not match config draft_vocab_size={named}")
        if vd > target.vocab_size:
            raise ValueError(f"{path}: key 'lm_head.weight' has {vd} rows, above the target's vocabulary "
                             f"{target.vocab_size}")
    # the weights tell which linear layers carry a bias (an EAGLE-1/2 fc per its config's
    # ``bias``, the q/k/v biases of heads for Qwen2 targets); a bias some layers have and others
    # lack is refused as a missing key
    biased = frozenset(name for name in ("fc", "q_proj", "k_proj", "v_proj", "o_proj")
                       if any(k == f"{name}.bias" or k.endswith(f".{name}.bias") for k in tensors))
    head = make_head(fmt, config, target, draft_vocab_size=vd, biased=biased, dtype=dtype)
    given = _check_tensors(path, head, tensors)
    head.load_state_dict({k: v.to(dtype=head.state_dict()[k].dtype) for k, v in given.items()}, strict=False)
    logger.info("draft head %s (%s) from %s: reads target features %s", fmt, path.name, folder, list(want))
    return head.eval()


def draft_feature_layers(draft: str | Path, target: str | Path) -> tuple[int, ...]:
    """The target features the head in folder ``draft`` reads (before the target is loaded)."""
    tconf = load_config(target)
    folder = Path(draft)
    if not folder.is_dir():
        raise ValueError(f"draft={str(draft)!r}: not a folder")
    data = read_config(folder)
    hidden = data.get("hidden_size")
    if not isinstance(hidden, int):
        raise ValueError(f"{folder / 'config.json'}: key 'hidden_size'={hidden!r}: must be an int")
    path, shapes = head_shapes(folder)
    if head_format(path, shapes, hidden, tconf.hidden_size) == "eagle1":
        return (NORMED,)
    return eagle3_layers(data, tconf.num_hidden_layers, folder / "config.json")


def load_models(target: str | Path, draft: str | Path, dtype: str | torch.dtype = "float64",
                max_len: int | None = None, device: str | torch.device = "cpu",
                weights: str = "dense") -> tuple[HFTarget, HFEagleHead]:
    """The target from checkpoint ``target`` (a folder or a hub id) and the published head in
    folder ``draft``, in ``dtype``, the target's features set to what the head reads; ``max_len``
    and ``weights`` as `load_target`'s (a q4 target's head in float32)."""
    parse_dtype(dtype)
    check_weights(weights, device, dtype)
    layers = draft_feature_layers(draft, target)
    model = load_target(target, dtype=dtype, max_len=max_len, feature_layers=layers, device=device,
                        weights=weights)
    # a q4 target's stream is float64 for the verify's sake (`q4_linear`); the draft only
    # proposes (its numbers never reach an emitted token), so it runs in float32, twice as fast
    return model, load_draft(draft, model, torch.float32 if weights == "q4" else None)
