"""What a transformers decoder must be for the ``draftgraph`` attention to run it exactly.

`check_config` refuses at load, with a ValueError naming the architecture and the feature, what
the attention function does not implement (DESIGN.md §18: an ignored attention keyword fails
silently): a model type outside `SUPPORTED_TYPES`, remote code, a sliding window that can cut
the cache, attention sinks, logit soft-capping, quantized weights, layer types other than full
(or a never-cutting sliding) attention. `check_backend` refuses RoPE whose frequencies follow the
longest position seen (dynamic, longrope) under a graph backend: a captured graph would bake
the frequencies of its capture.
"""

from __future__ import annotations

from typing import Any

from draftgraph.graphs import capabilities

__all__ = ["SUPPORTED_TYPES", "DYNAMIC_ROPE", "check_config", "check_backend", "rope_type"]

SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "qwen3")
DYNAMIC_ROPE = ("dynamic", "longrope")
_REFUSED_KEYS = {
    "attn_logit_softcapping": "attention logit soft-capping",
    "final_logit_softcapping": "final logit soft-capping",
    "quantization_config": "quantized weights",
}
_SINK_KEYS = ("sinks", "attention_sinks", "use_sinks")


def _arch(config: Any) -> str:
    archs = getattr(config, "architectures", None) or [type(config).__name__]
    return f"{archs[0]} (model_type={getattr(config, 'model_type', None)!r})"


def rope_type(config: Any) -> str:
    """The config's RoPE type ("default" when it names none)."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if isinstance(params, dict) and "rope_type" not in params and params:
        first = next(iter(params.values()))  # per-layer-type parameters: {"full_attention": {...}}
        params = first if isinstance(first, dict) else params
    return str(params.get("rope_type", params.get("type", "default"))) if isinstance(params, dict) else "default"


def check_config(config: Any, max_len: int) -> None:
    """Refuse (ValueError naming the architecture and the feature) a config the ``draftgraph``
    attention cannot run exactly with a cache of ``max_len`` positions."""
    arch = _arch(config)
    if getattr(config, "auto_map", None):
        raise ValueError(f"{arch}: config.json has auto_map (remote code, trust_remote_code): refused; "
                         f"only transformers' own model code is run")
    mtype = getattr(config, "model_type", None)
    if mtype not in SUPPORTED_TYPES:
        raise ValueError(f"{arch}: model_type={mtype!r} is not supported; supported: {list(SUPPORTED_TYPES)}")
    for key, feature in _REFUSED_KEYS.items():
        if getattr(config, key, None) is not None:
            raise ValueError(f"{arch}: {key}={getattr(config, key)!r} ({feature}) is not implemented by the "
                             f"'draftgraph' attention")
    for key in _SINK_KEYS:
        if getattr(config, key, None):
            raise ValueError(f"{arch}: {key}={getattr(config, key)!r} (attention sinks) is not implemented by "
                             f"the 'draftgraph' attention")
    types = list(getattr(config, "layer_types", None) or [])
    unknown = sorted({t for t in types if t not in ("full_attention", "sliding_attention")})
    if unknown:
        raise ValueError(f"{arch}: layer_types {unknown} are not implemented by the 'draftgraph' attention")
    window = getattr(config, "sliding_window", None)
    if types:
        sliding = "sliding_attention" in types
    else:
        sliding = mtype == "mistral" or bool(getattr(config, "use_sliding_window", False))
    if sliding and window is not None and window < max_len:
        raise ValueError(f"{arch}: sliding_window={window} is in use and shorter than the cache ({max_len} "
                         f"positions): a sliding window is not implemented by the 'draftgraph' attention "
                         f"(a max_len <= {window} serves it exactly)")


def check_backend(config: Any, backend: str) -> None:
    """Refuse dynamic RoPE (frequencies from the longest position seen) under a graph backend."""
    kind = rope_type(config)
    if capabilities(backend).captures and kind in DYNAMIC_ROPE:
        raise ValueError(f"{_arch(config)}: rope_type={kind!r} (dynamic RoPE scaling) under backend={backend!r}: "
                         f"a captured graph would keep its capture's frequencies; use backend='eager'")
