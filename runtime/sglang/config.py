"""RuntimeArgs from SGLang's own configuration objects (0.5.23, older layouts, duck-typed objects).

Sources, first that applies:
1. SGLang's published runtime context (``get_exec()``, ``get_schedule()``, ``get_spec()``): what
   SGLang's workers themselves read, overrides included. Used when no object is given, or when the
   given ``ServerArgs`` is the published one.
2. A ``ServerArgs`` by its resolved values (``resolution_result``): after ``resolve_once()`` the
   raw attributes still hold the input (``cuda_graph_config`` stays a dict), the values SGLang
   decided live elsewhere.
3. Plain attributes: older layouts (flat ``cuda_graph_max_bs`` / ``cuda_graph_bs`` /
   ``disable_cuda_graph``) and any object with SGLang's attribute names.

``cuda_graph_config`` may be SGLang's ``CudaGraphConfig``, the CLI's dict form
(``{"decode": {"max_bs": 32}}``) or None; ``decode.backend == "disabled"`` means no decode graphs.
Anything else is a ConfigTypeError naming the field and what was found.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

from ..config import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig, chain_capacity
from ..validation import ConfigTypeError

__all__ = ["runtime_args_from_sglang", "graph_config_from_sglang", "published_server_args", "sglang_chain_capacity",
           "SGLANG_DECODE_BACKENDS"]

SGLANG_DECODE_BACKENDS = ("full", "breakable", "disabled")
"""Values of SGLang 0.5.23's ``PhaseConfig.backend``; only "disabled" turns decode graphs off."""

_Reader = Callable[[str], Any]


def runtime_args_from_sglang(server_args: Any = None) -> RuntimeArgs:
    """RuntimeArgs from SGLang's runtime context, a (resolved) ServerArgs, or plain attributes."""
    read, origin = _reader_for(server_args)
    spec = SpeculativeConfig(
        num_steps=_required(read, "speculative_num_steps", origin),
        topk=_required(read, "speculative_eagle_topk", origin),
        num_draft_tokens=read("speculative_num_draft_tokens"),
    )
    graphs = graph_config_from_sglang(read("cuda_graph_config"), read)
    flag = read("disable_cuda_graph")
    if flag is not None and not isinstance(flag, bool):
        raise ConfigTypeError(f"disable_cuda_graph={flag!r} (from {origin}): must be a bool")
    if flag:
        decode = graphs.decode if graphs is not None else PhaseGraphConfig()
        graphs = CudaGraphConfig(PhaseGraphConfig(max_bs=decode.max_bs, bs=decode.bs, disabled=True))
    return RuntimeArgs(
        speculative=spec,
        cuda_graph_config=graphs,
        max_running_requests=read("max_running_requests"),
        device=str(read("device") or "cpu"),
    )


def graph_config_from_sglang(cfg: Any, read: _Reader | None = None) -> CudaGraphConfig | None:
    """CudaGraphConfig from SGLang's ``cuda_graph_config`` (object, dict or None).

    With ``cfg`` None, ``read`` (a field reader) supplies the older flat ``cuda_graph_max_bs`` /
    ``cuda_graph_bs`` fields; None when neither layout says anything.
    """
    if cfg is None:
        if read is None:
            return None
        max_bs, bs = read("cuda_graph_max_bs"), read("cuda_graph_bs")
        if max_bs is None and bs is None:
            return None
        return CudaGraphConfig(PhaseGraphConfig(max_bs=max_bs, bs=_sizes("cuda_graph_bs", bs)))
    if isinstance(cfg, CudaGraphConfig):
        return cfg
    if isinstance(cfg, Mapping):
        decode = cfg.get("decode")
    elif hasattr(cfg, "decode"):
        decode = cfg.decode
    else:
        raise ConfigTypeError(
            f"cuda_graph_config={cfg!r} ({type(cfg).__name__}): expected SGLang's CudaGraphConfig, "
            f"a dict like {{'decode': {{'max_bs': 32}}}}, or None"
        )
    return CudaGraphConfig(_phase_from(decode))


def _phase_from(decode: Any) -> PhaseGraphConfig:
    """PhaseGraphConfig from SGLang's ``PhaseConfig``, its dict form, or draftgraph's own."""
    if decode is None:
        return PhaseGraphConfig()
    if isinstance(decode, PhaseGraphConfig):
        return decode
    if isinstance(decode, Mapping):
        get = decode.get
    elif hasattr(decode, "max_bs") or hasattr(decode, "bs") or hasattr(decode, "backend"):
        def get(name: str, default: Any = None) -> Any:
            return getattr(decode, name, default)
    else:
        raise ConfigTypeError(
            f"cuda_graph_config.decode={decode!r} ({type(decode).__name__}): expected SGLang's "
            f"PhaseConfig (backend, max_bs, bs), a dict with those keys, or None"
        )
    disabled = get("disabled", False)
    if not isinstance(disabled, bool):
        raise ConfigTypeError(f"cuda_graph_config.decode.disabled={disabled!r}: must be a bool")
    backend = get("backend", None)
    backend = getattr(backend, "value", backend)  # an Enum member reads as its value
    if backend is not None and backend not in SGLANG_DECODE_BACKENDS:
        raise ConfigTypeError(
            f"cuda_graph_config.decode.backend={backend!r}: expected one of {SGLANG_DECODE_BACKENDS}"
        )
    return PhaseGraphConfig(
        max_bs=get("max_bs", None),
        bs=_sizes("cuda_graph_config.decode.bs", get("bs", None)),
        disabled=disabled or backend == "disabled",
    )


def _sizes(field: str, bs: Any) -> tuple[int, ...] | None:
    """A batch-size list as a tuple (validated by PhaseGraphConfig), None kept."""
    if bs is None:
        return None
    if isinstance(bs, (str, bytes, Mapping)) or not hasattr(bs, "__iter__"):
        raise ConfigTypeError(f"{field}={bs!r} ({type(bs).__name__}): must be a sequence of ints")
    return tuple(bs)


def _required(read: _Reader, name: str, origin: str) -> Any:
    """A field that must be set; None names the field and where it was read."""
    value = read(name)
    if value is None:
        raise ConfigTypeError(
            f"{name}=None (from {origin}): must be set; an unresolved ServerArgs leaves it to "
            f"resolve_once()"
        )
    return value


# ---- sources -----------------------------------------------------------------------------------
def _reader_for(server_args: Any) -> tuple[_Reader, str]:
    """(field reader, description) for the best source available for ``server_args``."""
    published = published_server_args()
    if server_args is None:
        if published is None:
            raise ValueError(
                "server_args=None: no SGLang runtime context is published "
                "(sglang.srt.runtime_context.publish); pass a ServerArgs or an object with its fields"
            )
        return _context_reader(), "SGLang's published runtime context"
    if published is not None and server_args is published:
        return _context_reader(), "SGLang's published runtime context"
    if _is_sglang_object(server_args):
        from sglang.srt.arg_groups.overrides import resolution_result

        return (lambda name: resolution_result(server_args, name)), "ServerArgs (resolved values)"
    return (lambda name: getattr(server_args, name, None)), f"{type(server_args).__name__} attributes"


def _is_sglang_object(obj: Any) -> bool:
    """True for an instance of a class defined in the sglang package (ServerArgs)."""
    return type(obj).__module__.split(".", 1)[0] == "sglang"


def published_server_args() -> Any:
    """The ServerArgs SGLang published in this process, or None (also when sglang is not loaded).

    Only looks when ``sglang.srt.runtime_context`` is already imported: nothing can have been
    published otherwise, and importing SGLang costs seconds.
    """
    context = sys.modules.get("sglang.srt.runtime_context")
    if context is None:
        return None
    try:
        context.get_exec()
    except ValueError:  # "... not published"
        return None
    return getattr(context.get_context(), "_server_args", None) or _PUBLISHED_WITHOUT_ARGS


_PUBLISHED_WITHOUT_ARGS = object()
"""Marker: a context is published but its ServerArgs is not reachable (never ``is`` a user's)."""


def _context_reader() -> _Reader:
    """Field reader over the published context's bags (the values SGLang's workers read)."""
    from sglang.srt import runtime_context as rc

    graph, schedule, spec = rc.get_exec().graph, rc.get_schedule(), rc.get_spec()
    fields: dict[str, Callable[[], Any]] = {
        "speculative_num_steps": lambda: spec.speculative_num_steps,
        "speculative_eagle_topk": lambda: spec.speculative_eagle_topk,
        "speculative_num_draft_tokens": lambda: spec.speculative_num_draft_tokens,
        "cuda_graph_config": lambda: graph.cuda_graph_config,
        "disable_cuda_graph": lambda: getattr(graph, "disable_cuda_graph", None),
        "max_running_requests": lambda: schedule.max_running_requests,
        "device": lambda: rc.get_device().device,
    }

    def read(name: str) -> Any:
        getter = fields.get(name)
        return getter() if getter is not None else None

    return read


def sglang_chain_capacity(server_args: Any = None) -> int:
    """Chain-buffer rows SGLang sizes its topk == 1 buffers to: max(decode.max_bs, max_running_requests, 1).

    Read from the same source as `runtime_args_from_sglang` (the published context first), and
    from the same two fields SGLang's ``_rebuild_topk1_chain_buffers`` reads; the draft shape is
    not needed, so a context overridden mid-capture (S' without N') does not get in the way.
    """
    read, _ = _reader_for(server_args)
    graphs = graph_config_from_sglang(read("cuda_graph_config"), read)
    args = RuntimeArgs(SpeculativeConfig(1, 1), graphs, max_running_requests=read("max_running_requests"))
    return chain_capacity(args)
