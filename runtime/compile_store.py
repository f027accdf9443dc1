"""The store of compiled draft steps: executable code on disk, kept as the model cache keeps weights.

One file per entry, ``<key>.dgc`` (key: 64 hex digits, see `draftgraph.graphs.compile.entry`),
in a private folder (`private_dir`: created 0700, refused unless a real directory owned by this
user and not writable by group or others), by default ``$DRAFTGRAPH_CACHE/compiled`` (else
``~/.cache/draftgraph/compiled``). A file holds a header with the SHA-256 of its key and its
payload, checked at every load (an entry renamed to another key fails it). Loaded code runs in
this process, so an entry is refused, named in a warning and removed (its graph is then recorded
and compiled again) when it is not a regular file (a symlink, a FIFO), is owned by another user
or writable by group or others, or its digest or format does not match.

Writes go through a new ``O_EXCL | O_NOFOLLOW`` temporary file (``.<key prefix>.tmp<pid>.<rnd>``)
renamed into place; one left by a writer that died mid-put (its pid gone, or an hour old) is
removed when a store opens and at each eviction (``temp_removed``), and every temporary file
counts under the cap. The store is bounded: after each write, the least recently used entries
(by modification time, refreshed at each load) are removed until the total is under the cap
(``DRAFTGRAPH_COMPILED_MAX_MB``, default 512: a finite number of MiB in (0, 2**30], else a
ValueError naming the variable; an entry larger than the cap is not stored, said once per store
in a warning). One entry of its own holds the seconds the latest units took, those that ran a
compile and those that only recorded and checked against a compile their state already had
(`CompileStore.unit_seconds`: a cold start's estimate). An unwritable folder falls back to a
per-user temporary folder with one warning, as the model cache does; ``DRAFTGRAPH_COMPILED_DIR``
names another folder; ``DRAFTGRAPH_COMPILED=0`` turns the store off.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import stat
import tempfile
import threading
import time
from functools import lru_cache
from pathlib import Path

from .private_dir import UnsafeFolderError, create_exclusive, private_dir, read_regular
from .settings import DEFAULT_COMPILED_MAX_BYTES, compiled_dir, compiled_max_bytes, compiled_store_on

__all__ = ["CompileStore", "DEFAULT_MAX_BYTES", "default_compile_store", "store_folder"]

logger = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = DEFAULT_COMPILED_MAX_BYTES
_MAGIC = b"DGCS2 "  # v2: the digest covers the key (v1 entries, bound to no key, are refused)
_HEADER = len(_MAGIC) + 64 + 1  # magic, hex digest of key and payload, newline
_KEY = re.compile(r"[0-9a-f]{64}")
_SUFFIX = ".dgc"
_TEMP = re.compile(r"\.[0-9a-f]{16}\.tmp(\d+)\.[0-9a-f]+")  # what `put` writes before its rename
_TEMP_MAX_AGE_S = 3600.0  # a temporary file this old is a dead writer's, whatever its pid says


class CompileStore:
    """Compiled entries in ``folder`` (made private here: `UnsafeFolderError` when refused),
    at most ``max_bytes`` in all (entries and temporary files). Thread-safe; counts ``hits``,
    ``misses``, ``refused``, ``written``, ``evicted`` and ``temp_removed``."""

    def __init__(self, folder: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ValueError(f"max_bytes={max_bytes!r}: must be an int >= 1")
        self.folder = private_dir(folder)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._written: set[str] = set()
        self.hits = 0
        self.misses = 0
        self.refused = 0
        self.written = 0
        self.evicted = 0
        self.temp_removed = 0  # temporary files of writers that died mid-put
        self._warned_over_cap = False
        self._unit_figure: dict[str, tuple[int, float]] | None = None  # kind -> (units, seconds) noted
        with self._lock:
            self._sweep_temps()

    def path(self, key: str) -> Path:
        """The file of ``key`` (ValueError for a key that is not 64 hex digits)."""
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            raise ValueError(f"key={key!r}: must be 64 lowercase hex digits")
        return self.folder / f"{key}{_SUFFIX}"

    def get(self, key: str) -> bytes | None:
        """The payload of ``key`` with its digest checked, or None (missing, or refused: see the
        module docstring)."""
        return self._get(key, count=True)

    def unit_seconds(self, compiled: bool = True) -> float | None:
        """The mean seconds a unit took here (recording one state's step at one size and compiling
        it, or with ``compiled=False`` recording it and checking it against the compile its state
        already had: the one symbolic compile), over the latest such units any process noted in
        this store (None before any): what a cold start's estimate of its compile time uses."""
        with self._lock:
            if self._unit_figure is None:
                self._unit_figure = _parse_units(self._get(_UNIT_SECONDS_KEY, count=False))
            units, seconds = self._unit_figure[_KIND[compiled]]
        return seconds / units if units else None

    def note_unit_seconds(self, seconds: float, compiled: bool = True) -> None:
        """Add one unit's seconds to `unit_seconds` (``compiled``: its capture ran a compile; kept in
        the store, over the latest `_UNIT_WINDOW` units of each kind)."""
        if not seconds > 0:
            return
        with self._lock:
            figure = self._unit_figure or _parse_units(self._get(_UNIT_SECONDS_KEY, count=False))
            units, total = figure[_KIND[compiled]]
            if units >= _UNIT_WINDOW:  # a moving mean: the latest units count the most
                total, units = total * (_UNIT_WINDOW - 1) / units, _UNIT_WINDOW - 1
            figure = {**figure, _KIND[compiled]: (units + 1, total + seconds)}
            self._unit_figure = figure
            payload = json.dumps({k: {"units": u, "seconds": t} for k, (u, t) in figure.items()},
                                 sort_keys=True).encode()
        with contextlib.suppress(OSError):
            self.put(_UNIT_SECONDS_KEY, payload, count=False)

    def _get(self, key: str, count: bool) -> bytes | None:
        path = self.path(key)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            self.misses += count
            return None
        why = _unsafe(st)
        if why is not None:
            self.refuse(key, why)
            return None
        try:
            raw = read_regular(path, self.max_bytes + _HEADER, "compiled entry")
        except FileNotFoundError:
            self.misses += count
            return None
        except (UnsafeFolderError, ValueError) as exc:
            self.refuse(key, str(exc))
            return None
        head, payload = raw[:_HEADER], raw[_HEADER:]
        if len(head) != _HEADER or not head.startswith(_MAGIC) or head[-1:] != b"\n":
            self.refuse(key, "not a compiled entry of this format (header)")
            return None
        if _digest(key, payload).encode() != head[len(_MAGIC):-1]:
            self.refuse(key, "digest mismatch (damaged, changed, or written under another key)")
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: the last to be evicted
        self.hits += count
        return payload

    def put(self, key: str, payload: bytes, count: bool = True) -> None:
        """Write ``payload`` under ``key`` (temporary file, then rename), then evict down to the cap.
        An entry over the cap by itself is not written. ``count=False``: not in ``written``
        (the store's own figures)."""
        path = self.path(key)
        if len(payload) + _HEADER > self.max_bytes:
            first, self._warned_over_cap = not self._warned_over_cap, True
            logger.log(logging.WARNING if first else logging.DEBUG,
                       "compiled entry %s not stored: %d bytes, over the store's cap of %d bytes "
                       "(DRAFTGRAPH_COMPILED_MAX_MB)%s", path.name, len(payload) + _HEADER, self.max_bytes,
                       "; no entry this large is kept (said once)" if first else "")
            return
        data = _MAGIC + _digest(key, payload).encode() + b"\n" + payload
        fd, tmp = create_exclusive(self.folder, f".{key[:16]}.tmp", 0o600)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        if count:
            with self._lock:
                self._written.add(key)
                self.written += 1
        self._evict(keep=path)

    def refuse(self, key: str, why: str) -> None:
        """Log ``key``'s entry as refused (named, with ``why``) and remove it."""
        path = self.path(key)
        self.refused += 1
        logger.warning("compiled entry %s refused: %s; removed, its graph is compiled again", path, why)
        with contextlib.suppress(OSError):
            os.unlink(path)

    def written_here(self, key: str) -> bool:
        """True when this store object wrote ``key`` (a later load is a shared compile)."""
        return key in self._written

    def entries(self) -> list[tuple[Path, int, float]]:
        """(path, bytes, mtime) of every entry, least recently used first."""
        found = []
        for path in self.folder.glob(f"*{_SUFFIX}"):
            with contextlib.suppress(OSError):
                st = os.lstat(path)
                if stat.S_ISREG(st.st_mode):
                    found.append((path, st.st_size, st.st_mtime))
        return sorted(found, key=lambda e: e[2])

    def total_bytes(self) -> int:
        """Bytes of every entry."""
        return sum(n for _, n, _ in self.entries())

    def _sweep_temps(self) -> int:
        """Remove the temporary files of dead writers (the caller holds the lock); the bytes of
        those still being written."""
        live = 0
        now = time.time()
        for path in self.folder.glob(".*.tmp*"):
            match = _TEMP.fullmatch(path.name)
            if match is None:
                continue
            with contextlib.suppress(OSError):
                st = os.lstat(path)
                writing = _pid_alive(int(match.group(1))) and now - st.st_mtime < _TEMP_MAX_AGE_S
                if stat.S_ISREG(st.st_mode) and writing:
                    live += st.st_size
                    continue
                os.unlink(path)
                self.temp_removed += 1
                logger.warning("compiled-store temporary file %s removed: left by a writer that died mid-put "
                               "(%d bytes)", path, st.st_size)
        return live

    def _evict(self, keep: Path) -> None:
        with self._lock:
            entries = self.entries()
            total = sum(n for _, n, _ in entries) + self._sweep_temps()
            for path, n, _ in entries:
                if total <= self.max_bytes:
                    break
                if path == keep:
                    continue
                with contextlib.suppress(OSError):
                    os.unlink(path)
                    total -= n
                    self.evicted += 1
                    logger.debug("compiled entry %s evicted (least recently used)", path.name)

    def as_dict(self) -> dict[str, object]:
        """Counts and where the store lives (JSON-ready)."""
        return {"folder": str(self.folder), "max_bytes": self.max_bytes, "hits": self.hits, "misses": self.misses,
                "refused": self.refused, "written": self.written, "evicted": self.evicted,
                "temp_removed": self.temp_removed}


def _digest(key: str, payload: bytes) -> str:
    """SHA-256 hex over the entry's key and its payload: an entry moved to another key's name
    no longer matches (its code was made for the structure of its own key)."""
    h = hashlib.sha256(b"draftgraph compiled entry\0")
    h.update(key.encode())
    h.update(b"\0")
    h.update(payload)
    return h.hexdigest()


def _pid_alive(pid: int) -> bool:
    """True when a process ``pid`` exists (another user's counts)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return pid < 2**31
    return True


# the store's own entry: the seconds of the latest compiled units (JSON), digest-checked like code
# v2: units that compiled and units that only checked are kept apart (v1 mixed them)
_UNIT_SECONDS_KEY = hashlib.sha256(b"draftgraph compiled-unit seconds v2").hexdigest()
_UNIT_WINDOW = 64
_KIND = {True: "compiled", False: "checked"}


def _parse_units(raw: bytes | None) -> dict[str, tuple[int, float]]:
    """kind ("compiled", "checked") -> (units, seconds) of the unit-seconds entry; (0, 0.0) for a
    kind absent or not of this form."""
    out = dict.fromkeys(_KIND.values(), (0, 0.0))
    try:
        doc = json.loads(raw) if raw is not None else {}
    except ValueError:
        return out
    for kind in out:
        entry = doc.get(kind) if isinstance(doc, dict) else None
        try:
            units, seconds = int(entry["units"]), float(entry["seconds"])
        except (ValueError, TypeError, KeyError):
            continue
        if units > 0 and seconds > 0:
            out[kind] = (units, seconds)
    return out


def _unsafe(st: os.stat_result) -> str | None:
    """Why an entry's lstat says it must not be loaded (None when it may)."""
    if stat.S_ISLNK(st.st_mode):
        return "it is a symlink"
    if not stat.S_ISREG(st.st_mode):
        return f"not a regular file (mode {st.st_mode:o})"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"owned by uid {st.st_uid}, not by this user (uid {os.getuid()}): another user's code is never loaded"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def store_folder() -> Path:
    """``$DRAFTGRAPH_COMPILED_DIR`` when set, else ``$DRAFTGRAPH_CACHE/compiled`` (default
    ``~/.cache/draftgraph/compiled``; `settings.compiled_dir`)."""
    return compiled_dir()


def default_compile_store() -> CompileStore | None:
    """The process's store for `store_folder` (one object per folder and cap, so a compile of one
    engine is a shared load for another); None when ``DRAFTGRAPH_COMPILED=0`` or no safe folder
    exists (with one warning)."""
    if not compiled_store_on():
        return None
    return _store_for(str(store_folder()), compiled_max_bytes())


@lru_cache(maxsize=4)
def _store_for(folder: str, max_bytes: int) -> CompileStore | None:
    path = Path(folder)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        store = CompileStore(path, max_bytes)
        if os.access(store.folder, os.W_OK | os.X_OK):
            return store
        raise PermissionError(f"{path} is not writable")
    except UnsafeFolderError as exc:
        logger.warning("compiled-code store off: %s", exc)
        return None
    except OSError as exc:
        uid = os.getuid() if hasattr(os, "getuid") else "user"
        fallback = Path(tempfile.gettempdir()) / f"draftgraph-{uid}"
        try:
            store = CompileStore(private_dir(fallback) / "compiled", max_bytes)
        except OSError as exc2:
            logger.warning("compiled-code store off: %s is not usable (%s) and neither is %s (%s)", path, exc,
                           fallback, exc2)
            return None
        logger.warning("compiled-code store folder %s is not writable (%s); using %s instead (set "
                       "DRAFTGRAPH_CACHE to a writable folder to keep compiled code there)", path, exc, store.folder)
        return store
