"""Rank messages that prove their sender: a per-run secret and a MAC on every store value.

The c10d store on 127.0.0.1 has no authentication: any local process can write any key. So
every value the rank protocol writes carries an HMAC-SHA256 over its namespace, key and payload
under a secret only the launcher and its ranks hold (``payload + b"#" + 64 hex digits``); a
value that fails the check is refused with `ForgedValue` (a `ProtocolError` naming the key),
counted and logged, and never obeyed.

The secret: `spawn_ranks` makes one per run (32 random bytes, never logged) and hands it to each
rank through the spawn pipe that carries the rank's arguments (private to the launcher and that
process: not in ``ps``, not in ``/proc/<pid>/environ``); the rank installs it with
`set_process_secret` before its function runs. A caller that builds its own process group gives
its own secret (`RankCoordinator(..., secret=...)`, the same bytes on every rank, handed over as
privately) or the ranks warn once that their messages are unauthenticated.

Counters (``add``) are not signed (a c10d counter is an integer the store adds to), so the
protocol uses none: a coordinator's instance is counted in its process (`next_instance`) and the
run is named by its secret (`run_id`); a reload's end is each rank's own signed key.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
from datetime import timedelta
from typing import Any

from .wire import ProtocolError

__all__ = ["ForgedValue", "SignedStore", "new_secret", "next_instance", "process_secret", "run_id",
           "set_process_secret", "SECRET_BYTES"]

logger = logging.getLogger(__name__)

SECRET_BYTES = 32
_SEP = b"#"
_TAG = 64  # hex digits of an HMAC-SHA256
_process_secret: bytes | None = None
_warned = threading.Event()
_instances: dict[str, int] = {}
_instances_lock = threading.Lock()


class ForgedValue(ProtocolError):
    """A store value whose MAC does not check: written by no rank of this run."""


def new_secret() -> bytes:
    """A fresh per-run secret (``SECRET_BYTES`` random bytes)."""
    return secrets.token_bytes(SECRET_BYTES)


def set_process_secret(secret: bytes | None) -> None:
    """The secret this process's coordinators use when they are given none (a rank of
    `spawn_ranks` installs the launcher's); None: none."""
    global _process_secret
    if secret is not None and (not isinstance(secret, bytes) or len(secret) < 16):
        raise ValueError(f"secret: {type(secret).__name__} of {len(secret) if isinstance(secret, bytes) else '?'} "
                         f"bytes: must be bytes, at least 16 of them")
    _process_secret = secret


def process_secret() -> bytes | None:
    """The secret `set_process_secret` installed, or None."""
    return _process_secret


def run_id(secret: bytes | None) -> str:
    """A name of the run its secret stands for (12 hex digits of an HMAC: the secret is not
    shown); "open" without one."""
    if secret is None:
        return "open"
    return hmac.new(secret, b"draftgraph-run", hashlib.sha256).hexdigest()[:12]


def next_instance(scope: str) -> int:
    """1, 2, ... per ``scope`` in this process: the coordinators of one group, built in the same
    order on every rank, get the same numbers without a counter in the store."""
    with _instances_lock:
        _instances[scope] = _instances.get(scope, 0) + 1
        return _instances[scope]


def warn_unauthenticated() -> None:
    """Say once per process that rank messages carry no MAC."""
    if not _warned.is_set():
        _warned.set()
        logger.warning("rank coordinator without a secret: store messages are unauthenticated, so any "
                       "local process that reaches the store can write them (give RankCoordinator(secret=...) "
                       "the same private bytes on every rank; spawn_ranks does this itself)")


class SignedStore:
    """A c10d store (a PrefixStore under ``namespace``) whose values are signed and checked.

    Offers what the rank protocol uses: ``set``, ``get``, ``compare_set``, ``check``, ``wait``,
    ``delete_key`` and ``add`` (unsigned). ``forged`` counts refused values; ``last_forged``
    names the latest key."""

    def __init__(self, store: Any, namespace: str, secret: bytes, raw_values: tuple[bytes, ...] = ()) -> None:
        self.store = store
        self.namespace = namespace.encode()
        self._secret = secret
        self._raw = set(raw_values) | {b""}  # sentinels passed as they are (never stored by a rank)
        self.forged = 0
        self.last_forged: str | None = None

    def _tag(self, key: str, payload: bytes) -> bytes:
        msg = self.namespace + b"\0" + key.encode() + b"\0" + payload
        return hmac.new(self._secret, msg, hashlib.sha256).hexdigest().encode()

    def sign(self, key: str, payload: bytes) -> bytes:
        """``payload`` with its MAC for ``key``."""
        return bytes(payload) + _SEP + self._tag(key, bytes(payload))

    def open(self, key: str, raw: Any) -> bytes:
        """The payload of a signed value; `ForgedValue` (counted, logged with the key) otherwise."""
        raw = bytes(raw) if isinstance(raw, (bytes, bytearray)) else b""
        payload, sep, tag = raw.rpartition(_SEP)
        if not sep or len(tag) != _TAG or not hmac.compare_digest(tag, self._tag(key, payload)):
            self.forged += 1
            self.last_forged = key
            logger.error("store key %r: a value without a valid MAC of this run (%d bytes) refused: "
                         "written by no rank of ours, never obeyed", key, len(raw))
            raise ForgedValue(f"store key {key!r}: value not signed by a rank of this run (forged or damaged)")
        return payload

    # ---- the store interface the protocol uses -----------------------------------------------
    def set(self, key: str, value: bytes) -> None:
        """Store ``value`` signed."""
        self.store.set(key, self.sign(key, value))

    def get(self, key: str) -> bytes:
        """The checked payload of ``key`` (blocks as the store's get does)."""
        return self.open(key, self.store.get(key))

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """``compare_set`` over signed values; sentinels (b"" = absent, ``raw_values``) pass as
        they are. Returns the payload now in force, or a sentinel as the store returned it."""
        exp = expected if expected in self._raw else self.sign(key, expected)
        des = desired if desired in self._raw else self.sign(key, desired)
        now = bytes(self.store.compare_set(key, exp, des))
        if now in self._raw and now == expected:
            return now
        return self.open(key, now)

    def check(self, keys: list[str]) -> bool:
        return self.store.check(keys)

    def wait(self, keys: list[str], timeout: timedelta) -> None:
        self.store.wait(keys, timeout)

    def delete_key(self, key: str) -> bool:
        return self.store.delete_key(key)

    def add(self, key: str, amount: int) -> int:
        return self.store.add(key, amount)
