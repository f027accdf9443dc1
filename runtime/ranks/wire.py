"""What the rank protocol writes to its store, as plain JSON with a schema check on every read.

The store (a c10d TCPStore) has no authentication: any process that reaches its port can write
any key. So nothing read from it is unpickled or executed: a proposal is
``{"rank": int, "args": <RuntimeArgs as plain data>, "policy": str, "epoch": int}`` (the epoch
of the free slot it was put in: ``-<epoch>``, so an older proposal replayed is known stale), a vote
``{"ok": true}`` or ``{"ok": false, "error": str}``, a decision ``{"commit": true}`` or
``{"commit": false, "reason": str}``, a start-up fingerprint ``{str: str}``. A value that is
not valid JSON, is too large or breaks its schema raises `ProtocolError` naming the key and the
rule, quoting at most `QUOTE` characters of it; the caller fails that one round with it.
"""

from __future__ import annotations

import json
from typing import Any

from draftgraph.runtime.worker import RELOAD_POLICIES

from ..args_file import runtime_args_from_dict, runtime_args_to_dict
from ..config import RuntimeArgs

__all__ = ["ProtocolError", "MAX_ENTRY_BYTES", "encode_proposal", "decode_proposal", "proposal_epoch", "free_slot",
           "free_epoch", "encode_vote",
           "decode_vote", "encode_decision", "decode_decision", "encode_fingerprint", "decode_fingerprint"]

MAX_ENTRY_BYTES = 1 << 20  # a proposal is a few hundred bytes; a 1 MiB entry is hostile or broken
QUOTE = 200  # characters of a bad entry quoted in an error
_TEXT_MAX = 4096  # characters kept of an error or abort reason read from the store


class ProtocolError(ValueError):
    """A store entry that is not what the rank protocol writes (malformed, too large, or
    hostile): the round that read it fails, the ranks keep serving their state."""


def _quote(raw: bytes) -> str:
    text = repr(raw[:QUOTE])
    return text + (f" ... ({len(raw)} bytes)" if len(raw) > QUOTE else "")


def _load(key: str, raw: Any, what: str) -> Any:
    """JSON of ``raw`` (bytes from the store); ProtocolError otherwise."""
    if not isinstance(raw, (bytes, bytearray)):
        raise ProtocolError(f"store key {key!r}: got {type(raw).__name__}, not bytes ({what})")
    raw = bytes(raw)
    if len(raw) > MAX_ENTRY_BYTES:
        raise ProtocolError(f"store key {key!r}: {len(raw)} bytes, more than the {MAX_ENTRY_BYTES} "
                            f"a {what} may hold")
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"store key {key!r}: not a {what} (JSON expected; {type(exc).__name__}): "
                            f"{_quote(raw)}") from None


def _dump(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _fields(key: str, data: Any, what: str, required: dict[str, type | tuple[type, ...]],
            optional: dict[str, type | tuple[type, ...]] | None = None) -> dict[str, Any]:
    optional = optional or {}
    if not isinstance(data, dict):
        raise ProtocolError(f"store key {key!r}: a {what} must be a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - set(required) - set(optional))
    missing = sorted(set(required) - set(data))
    if unknown or missing:
        raise ProtocolError(f"store key {key!r}: a {what} has keys {sorted(required)} "
                            f"(optional {sorted(optional)}); unknown {unknown[:8]}, missing {missing}")
    for name, kind in {**required, **optional}.items():
        if name in data and (isinstance(data[name], bool) and kind is int or not isinstance(data[name], kind)):
            raise ProtocolError(f"store key {key!r}: {what} field {name}={data[name]!r:.{QUOTE}}: "
                                f"must be {getattr(kind, '__name__', kind)}")
    return data


def _text(value: str) -> str:
    return value if len(value) <= _TEXT_MAX else value[:_TEXT_MAX] + " ..."


# ---- proposals ---------------------------------------------------------------------------------
def encode_proposal(rank: int, args: RuntimeArgs, policy: str, epoch: int = 0) -> bytes:
    """A reload proposal (proposer rank, args, policy) as store bytes, bound to the proposal
    slot's ``epoch`` (the free slot it was put in: `free_slot`)."""
    return _dump({"rank": int(rank), "args": runtime_args_to_dict(args), "policy": policy, "epoch": int(epoch)})


def proposal_epoch(key: str, raw: Any) -> int:
    """The slot epoch a proposal was made in (0 when it names none); ProtocolError when not a
    proposal."""
    data = _fields(key, _load(key, raw, "reload proposal"), "reload proposal",
                   {"rank": int, "args": dict, "policy": str}, {"epoch": int})
    return int(data.get("epoch", 0))


def free_slot(epoch: int) -> bytes:
    """The value of a free proposal slot in its ``epoch`` (the leader's count of releases)."""
    return b"-" + str(int(epoch)).encode()


def free_epoch(raw: bytes) -> int | None:
    """The epoch of a free slot value, or None when ``raw`` is not one (b"-" alone: epoch 0)."""
    if not raw.startswith(b"-"):
        return None
    digits = raw[1:]
    if not digits:
        return 0
    return int(digits) if digits.isdigit() and len(digits) < 19 else None


def decode_proposal(key: str, raw: Any, world_size: int) -> tuple[int, RuntimeArgs, str]:
    """(rank, RuntimeArgs, policy) from store bytes; ProtocolError for anything else (the args
    pass every RuntimeArgs check)."""
    data = _fields(key, _load(key, raw, "reload proposal"), "reload proposal",
                   {"rank": int, "args": dict, "policy": str}, {"epoch": int})
    if not 0 <= data["rank"] < world_size:
        raise ProtocolError(f"store key {key!r}: proposal rank={data['rank']}: must be in [0, {world_size})")
    if data["policy"] not in RELOAD_POLICIES:
        raise ProtocolError(f"store key {key!r}: proposal policy={data['policy']!r:.{QUOTE}}: "
                            f"must be one of {list(RELOAD_POLICIES)}")
    try:
        args = runtime_args_from_dict(data["args"])
    except (TypeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"store key {key!r}: proposal args: {str(exc)[:QUOTE]}") from None
    return data["rank"], args, data["policy"]


# ---- votes and decisions -------------------------------------------------------------------------
def encode_vote(error: str | None) -> bytes:
    """None = ready to swap, else why not."""
    return _dump({"ok": True} if error is None else {"ok": False, "error": error})


def decode_vote(key: str, raw: Any) -> str | None:
    """None (ready) or the voter's error; ProtocolError for anything else."""
    data = _fields(key, _load(key, raw, "vote"), "vote", {"ok": bool}, {"error": str})
    if data["ok"] == ("error" in data):
        raise ProtocolError(f"store key {key!r}: a vote is {{\"ok\": true}} or {{\"ok\": false, \"error\": ...}}")
    return None if data["ok"] else _text(data["error"])


def encode_decision(reason: str | None) -> bytes:
    """None = commit, else the abort reason."""
    return _dump({"commit": True} if reason is None else {"commit": False, "reason": reason})


def decode_decision(key: str, raw: Any) -> str | None:
    """None (commit) or the abort reason; ProtocolError for anything else."""
    data = _fields(key, _load(key, raw, "decision"), "decision", {"commit": bool}, {"reason": str})
    if data["commit"] == ("reason" in data):
        raise ProtocolError(f"store key {key!r}: a decision is {{\"commit\": true}} or "
                            f"{{\"commit\": false, \"reason\": ...}}")
    return None if data["commit"] else _text(data["reason"])


# ---- start-up ------------------------------------------------------------------------------------
def encode_fingerprint(value: dict[str, str]) -> bytes:
    """A start-up fingerprint ({field: text})."""
    return _dump({str(k): str(v) for k, v in value.items()})


def decode_fingerprint(key: str, raw: Any) -> dict[str, str]:
    """{field: text} from store bytes; ProtocolError for anything else."""
    data = _load(key, raw, "start-up fingerprint")
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise ProtocolError(f"store key {key!r}: a start-up fingerprint is a JSON object of strings")
    return data
