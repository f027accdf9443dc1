"""RuntimeArgs from a JSON or TOML file, and a reload-on-signal hook for servers.

File layout = RuntimeArgs' fields (``tree_choices``: a list of paths such as [[0], [1], [0, 0]]
makes the draft tree static; TOML writes it the same way):
    {"speculative": {"num_steps": 3, "topk": 1, "num_draft_tokens": 4,
                     "tree_choices": null},
     "cuda_graph_config": {"decode": {"max_bs": 32, "bs": null, "disabled": false}},
     "max_running_requests": 64, "device": "cpu", "max_state_bytes": 1073741824}

The file must be a regular file (a FIFO, a device, a symlink to ``/dev/zero`` are refused before
a byte is read) of at most ``MAX_ARGS_FILE_BYTES`` (1 MiB); an error quotes at most
``MAX_QUOTED_CHARS`` characters of what it read.

TOML needs Python 3.11+ (``tomllib``) or the ``tomli`` package on 3.10; JSON works everywhere.
"""

from __future__ import annotations

import json
import logging
import os
import signal as _signal
import sys
from collections.abc import Callable
from typing import Any

from draftgraph.runtime.bounds import DEFAULT_MAX_STATE_BYTES

from .config import CudaGraphConfig, PhaseGraphConfig, RuntimeArgs, SpeculativeConfig
from .private_dir import read_regular
from .schedule import SpeculationSchedule
from .validation import ConfigTypeError

__all__ = ["load_runtime_args", "runtime_args_from_dict", "runtime_args_to_dict", "install_reload_signal",
           "MAX_ARGS_FILE_BYTES"]

logger = logging.getLogger(__name__)

_TOP = ("speculative", "cuda_graph_config", "max_running_requests", "device", "max_state_bytes", "schedule")
_SPEC = ("num_steps", "topk", "num_draft_tokens", "tree_choices")
_PHASE = ("max_bs", "bs", "disabled")
MAX_ARGS_FILE_BYTES = 1 << 20  # an args file holds a few hundred bytes; anything past 1 MiB is refused unread
MAX_QUOTED_CHARS = 400  # of an error message built from the file's values (head and tail kept)


def _clip(text: str) -> str:
    """``text`` with its middle cut when longer than ``MAX_QUOTED_CHARS`` (the field name leads,
    the rule ends an error message: both are kept)."""
    if len(text) <= MAX_QUOTED_CHARS:
        return text
    head, tail = MAX_QUOTED_CHARS * 3 // 4, MAX_QUOTED_CHARS // 4
    return f"{text[:head]} ... [{len(text) - head - tail} characters cut] ... {text[-tail:]}"


def load_runtime_args(path: str | os.PathLike[str]) -> RuntimeArgs:
    """Parse ``path`` (.json, or .toml) into validated RuntimeArgs; errors name the file.

    Any failure to read or parse it (missing, unreadable, not UTF-8, malformed, nested too
    deeply: RecursionError, too large: MemoryError) is a ValueError naming the file; a value
    that breaks a rule is the validation's error prefixed with the file (a ValueError; a wrong
    type is a ConfigTypeError, a TypeError too)."""
    path = os.fspath(path)
    shown = _clip(repr(path))
    try:
        raw = read_regular(path, MAX_ARGS_FILE_BYTES, "runtime args file", follow_symlinks=True)
        data = _toml_loads(raw.decode()) if path.endswith(".toml") else json.loads(raw)
    except Exception as exc:  # OSError, JSON/TOML/Unicode errors (ValueError), RecursionError, MemoryError
        raise ValueError(f"runtime args file {shown}: cannot read it "
                         f"({type(exc).__name__}: {_clip(str(exc))})") from exc
    try:
        return runtime_args_from_dict(data)
    except (TypeError, ValueError) as exc:
        text = str(exc)
        clipped = type(exc)(f"runtime args file {shown}: {_clip(text)}")
        if len(text) > MAX_QUOTED_CHARS:  # the original (in a traceback) would quote it all
            raise clipped from None
        raise clipped from exc
    except (RecursionError, MemoryError) as exc:  # e.g. the repr of a deeply nested value
        raise ValueError(f"runtime args file {path!r}: cannot read it ({type(exc).__name__}: "
                         f"a value nested too deeply or too large)") from exc


def _toml_loads(text: str) -> Any:
    """Parse TOML with ``tomllib`` (3.11+) or ``tomli``; neither is a ValueError naming both."""
    try:
        import tomllib
    except ImportError:
        try:
            import tomli as tomllib
        except ImportError:
            version = ".".join(map(str, sys.version_info[:2]))
            raise ValueError(
                f"reading TOML needs Python 3.11+ (tomllib) or the 'tomli' package on Python "
                f"{version}: pip install tomli, or write the file as JSON"
            ) from None
    return tomllib.loads(text)


def runtime_args_from_dict(data: Any) -> RuntimeArgs:
    """RuntimeArgs from nested plain data; unknown keys are errors, not silently ignored."""
    _check_keys("runtime args", data, _TOP)
    if "speculative" not in data:
        raise ValueError("speculative: missing (num_steps, topk[, num_draft_tokens])")
    spec = data["speculative"]
    _check_keys("speculative", spec, _SPEC)
    graphs = data.get("cuda_graph_config")
    graph_cfg = None
    if graphs is not None:
        _check_keys("cuda_graph_config", graphs, ("decode",))
        decode = graphs.get("decode") or {}
        _check_keys("cuda_graph_config.decode", decode, _PHASE)
        bs = decode.get("bs")
        graph_cfg = CudaGraphConfig(PhaseGraphConfig(
            max_bs=decode.get("max_bs"), bs=tuple(bs) if isinstance(bs, list) else bs,
            disabled=decode.get("disabled", False)))
    return RuntimeArgs(
        speculative=SpeculativeConfig(**spec),
        cuda_graph_config=graph_cfg,
        max_running_requests=data.get("max_running_requests"),
        device=data.get("device", "cpu"),
        max_state_bytes=data.get("max_state_bytes", DEFAULT_MAX_STATE_BYTES),
        schedule=SpeculationSchedule.from_data(data["schedule"]) if data.get("schedule") is not None else None,
    )


def runtime_args_to_dict(args: RuntimeArgs) -> dict[str, Any]:
    """The inverse of `runtime_args_from_dict`: plain data (JSON-ready) for ``args``."""
    spec = args.speculative
    choices = None if spec.tree_choices is None else [list(p) for p in spec.tree_choices]
    out: dict[str, Any] = {
        "speculative": {"num_steps": spec.num_steps, "topk": spec.topk,
                        "num_draft_tokens": spec.num_draft_tokens, "tree_choices": choices},
        "max_running_requests": args.max_running_requests, "device": str(args.device),
        "max_state_bytes": args.max_state_bytes,
    }
    if args.cuda_graph_config is not None:
        d = args.cuda_graph_config.decode
        out["cuda_graph_config"] = {"decode": {"max_bs": d.max_bs, "bs": None if d.bs is None else list(d.bs),
                                               "disabled": d.disabled}}
    if args.schedule is not None:
        out["schedule"] = {"bands": args.schedule.text(), "hysteresis": args.schedule.hysteresis}
    return out


def _check_keys(where: str, value: Any, allowed: tuple[str, ...]) -> None:
    if not isinstance(value, dict):
        text = repr(value)
        shown = text if len(text) <= 80 else text[:77] + "..."
        raise ConfigTypeError(f"{where}={shown}: must be a table/object")
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; allowed: {list(allowed)}")


def install_reload_signal(worker: Any, path: str | os.PathLike[str], signal: int = _signal.SIGHUP,
                          policy: str = "swap", coordinator: Any = None) -> Callable[[], None]:
    """On ``signal``, read ``path`` and request a reload (applied at the worker's next step).

    The handler only parses and records the request, so it is safe between any two bytecodes
    of a step; a bad file is logged and ignored (the worker keeps serving). With a
    ``coordinator`` (`RankCoordinator`, several ranks) the request is proposed to every rank
    instead, and all ranks reload at the same step. Returns a callable that restores the
    previous handler. Call from the main thread.
    """
    request = worker.request_reload if coordinator is None else coordinator.propose_reload

    def handler(signum: int, frame: Any) -> None:
        try:
            request(load_runtime_args(path), policy)
            logger.info("signal %d: reload from %s requested", signum, path)
        except Exception as exc:  # raising here would break the step it interrupted: report, serve on
            logger.error("signal %d: reload from %s rejected: %s", signum, path, exc)

    previous = _signal.signal(signal, handler)

    def uninstall() -> None:
        _signal.signal(signal, previous)

    return uninstall
