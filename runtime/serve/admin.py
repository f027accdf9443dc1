"""Admin routes' rules and work: who may call them, a reload from a body, a profile window.

Access: a caller on loopback (127.0.0.0/8, ::1) always; any other caller only with the bearer
token of ``--admin-token-file`` (compared in constant time); else 403. Without a token, a server
listening beyond loopback has admin off for everyone not on loopback.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import shutil
import tempfile
import time
from typing import Any

from draftgraph.runtime import RuntimeArgs
from draftgraph.runtime.args_file import runtime_args_from_dict
from draftgraph.runtime.engine.metrics import is_loopback
from draftgraph.runtime.engine.profile_report import format_table
from draftgraph.runtime.engine.profiling import StepProfiler

from .bridge import EngineBridge
from .validation import BadRequest

__all__ = ["MAX_PROFILE_STEPS", "MAX_PROFILE_DIRS", "MAX_PROFILE_BYTES", "prune_profile_dirs",
           "admin_allowed", "admin_warning", "profile_window", "read_token_file",
           "reload_args_from_body"]

logger = logging.getLogger(__name__)

MAX_PROFILE_STEPS = 1000
MAX_PROFILE_DIRS = 8  # profile folders kept (the oldest removed first) ...
MAX_PROFILE_BYTES = 512 << 20  # ... and their bytes together
PROFILE_PREFIX = "draftgraph-profile-"
PROFILE_WAIT_S = 120.0  # the most a profile request waits for its steps (an idle server steps none)


def read_token_file(path: str) -> str:
    """The admin token: the file's first line, stripped; ValueError naming the flag when it is
    missing, unreadable or shorter than 16 characters."""
    try:
        with open(path, encoding="utf-8") as f:
            token = f.readline(4096).strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--admin-token-file={path!r}: cannot read it ({exc})") from None
    if len(token) < 16:
        raise ValueError(f"--admin-token-file={path!r}: the token must have at least 16 characters")
    return token


def admin_warning(host: str, token: str | None) -> str | None:
    """The start-up warning of a server listening beyond loopback without a token (None: none)."""
    if is_loopback(host) or token is not None:
        return None
    return (f"--host={host} is not loopback and no --admin-token-file was given: admin routes are off for "
            f"every caller not on loopback")


def admin_allowed(client_host: str | None, authorization: str | None, token: str | None) -> bool:
    """True for a loopback caller, or one whose ``Authorization: Bearer`` header holds ``token``."""
    if client_host is not None and is_loopback(client_host):
        return True
    if token is None or not authorization or not authorization.startswith("Bearer "):
        return False
    return hmac.compare_digest(authorization[len("Bearer "):].strip().encode(), token.encode())


def reload_args_from_body(raw: bytes, content_type: str | None) -> RuntimeArgs:
    """RuntimeArgs from a reload file's content: JSON, or TOML when the content type says toml
    or the text is not JSON. `BadRequest` ("body" or the file's field) when it is not valid."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest("body", "must be UTF-8 text (a reload file's JSON or TOML)") from None
    try:
        if content_type and "toml" in content_type:
            data = _toml(text)
        else:
            try:
                data = json.loads(text)
            except ValueError:
                data = _toml(text)
        return runtime_args_from_dict(data)
    except (TypeError, ValueError) as exc:
        raise BadRequest("body", f"not a valid reload file: {str(exc)[:400]}") from None
    except (RecursionError, MemoryError):  # JSON or TOML nested thousands deep, or a huge value
        raise BadRequest("body", "nested too deeply (or too large) to be a reload file") from None


def _toml(text: str) -> Any:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        raise BadRequest("body", "not JSON (TOML needs Python 3.11+)") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BadRequest("body", f"neither JSON nor TOML ({exc})") from None


async def profile_window(bridge: EngineBridge, steps: int, spans_only: bool, root: str | None) -> dict[str, Any]:
    """Record the next ``steps`` engine steps (attached and detached between steps, on the
    stepping thread); the summary with the trace path and the range table as text."""
    engine = bridge.engine
    prune_profile_dirs(root or tempfile.gettempdir(), MAX_PROFILE_DIRS - 1, MAX_PROFILE_BYTES)
    out_dir = tempfile.mkdtemp(prefix=PROFILE_PREFIX, dir=root)

    def attach() -> StepProfiler:
        if engine.profiler is not None:
            raise BadRequest("steps", "a profile window is recording already", status=409)
        first = engine.step_index
        profiler = StepProfiler(out_dir, [(first, first + steps - 1)], spans_only=spans_only)
        engine.profiler = profiler
        return profiler

    profiler = await asyncio.wrap_future(bridge.call_at_boundary(attach))
    end, deadline = engine.step_index + steps, time.monotonic() + PROFILE_WAIT_S
    while engine.step_index < end and time.monotonic() < deadline:
        await asyncio.sleep(0.05)

    def detach() -> dict[str, Any]:
        engine.profiler = None
        return profiler.close()

    summary = await asyncio.wrap_future(bridge.call_at_boundary(detach))
    table = format_table(summary["ranges"]) if summary.get("ranges") else ""
    return {"trace": summary.get("trace"), "dir": os.fspath(out_dir), "steps_recorded": summary["steps_recorded"],
            "mode": summary["mode"], "table": table, "ranges": summary.get("ranges", {}),
            "export_failures": summary.get("export_failures", 0)}


def _dir_bytes(path: str) -> int:
    total = 0
    for base, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(base, name)).st_size
            except OSError:
                pass
    return total


def prune_profile_dirs(root: str, keep: int, max_bytes: int) -> list[str]:
    """Remove the oldest profile folders of ``root`` (named `PROFILE_PREFIX`...) until at most
    ``keep`` are left and they hold at most ``max_bytes`` together; the paths removed."""
    try:
        names = [n for n in os.listdir(root) if n.startswith(PROFILE_PREFIX)]
    except OSError:
        return []
    found = []
    for name in names:
        path = os.path.join(root, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if os.path.isdir(path) and not os.path.islink(path):
            found.append((st.st_mtime, path))
    found.sort(reverse=True)  # newest first
    kept, total, removed, full = 0, 0, [], False
    for _, path in found:
        size = 0 if full else _dir_bytes(path)
        full = full or kept >= keep or total + size > max_bytes  # this one and every older one go
        if not full:
            kept, total = kept + 1, total + size
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    if removed:
        logger.info("removed %d old profile folders from %s (keeping %d, %d bytes)", len(removed), root, kept, total)
    return removed
