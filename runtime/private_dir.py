"""Folders and files the project writes, safe on a host shared with other users.

Two kinds of folder:

- a **private** folder the project picks itself under a shared place (the model cache's
  ``$TMPDIR/draftgraph-<uid>`` fallback): `private_dir` creates it with mode 0700 and refuses
  it, as ssh and pip do, unless it is a real directory (not a symlink), owned by this user and
  not writable by group or others. Another user who created it first would otherwise choose
  the weights this user serves. A refused folder is an `UnsafeFolderError` (an OSError) that
  names it, says why and what to do; nothing is read from it or written to it.
- a folder the **operator named** (``$DRAFTGRAPH_CACHE``, ``~/.cache/draftgraph``): trusted as
  configuration (it may be a symlink, or a read-only folder another account filled), but the
  files in it are still opened without following symlinks.

Files: `open_lock` opens (never truncates) a lock file with ``O_NOFOLLOW`` and refuses a
non-regular one; `create_exclusive` makes a new temporary file with ``O_CREAT | O_EXCL |
O_NOFOLLOW`` under a fresh random name; `read_regular` reads a regular file by name with
``O_NOFOLLOW | O_NONBLOCK`` (a FIFO, a device, a symlink to ``/dev/zero`` are refused before
a byte is read) and a size cap. Any future store under ``$DRAFTGRAPH_CACHE`` (a compiled-code
store) goes through these too. ``graphs/`` may not import ``runtime/``: the inductor folder it
points at is the operator's own ``$DRAFTGRAPH_CACHE/inductor``.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

__all__ = ["UnsafeFolderError", "private_dir", "check_private_dir", "open_lock", "create_exclusive",
           "read_regular"]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class UnsafeFolderError(OSError):
    """A folder or file another user could control: refused (the message says why and what to do)."""


def _uid() -> int | None:
    return os.getuid() if hasattr(os, "getuid") else None


def check_private_dir(path: Path) -> None:
    """`UnsafeFolderError` unless ``path`` is a real directory (lstat: not a symlink) owned by
    this user and not writable by group or others."""
    st = os.lstat(path)
    why = None
    if stat.S_ISLNK(st.st_mode):
        why = f"it is a symlink (to {os.readlink(path)[:200]!r})"
    elif not stat.S_ISDIR(st.st_mode):
        why = "it is not a directory"
    elif _uid() is not None and st.st_uid != _uid():
        why = f"it is owned by uid {st.st_uid}, not by this user (uid {_uid()})"
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        why = f"it is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    if why is not None:
        raise UnsafeFolderError(
            f"private folder {path} refused: {why}; another user could choose what is read from it. "
            f"Remove it (or fix it: chown to yourself, chmod 700), or set DRAFTGRAPH_CACHE to a folder of yours")


def private_dir(path: str | os.PathLike[str]) -> Path:
    """``path`` as a private folder: created with mode 0700 when missing (its parent must exist),
    then checked (`check_private_dir`). Returns it; `UnsafeFolderError` when refused."""
    path = Path(path)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    check_private_dir(path)
    return path


def _refuse_non_regular(fd: int, path: Path, what: str) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafeFolderError(f"{what} {path} refused: not a regular file (mode {st.st_mode:o})")
    return st


def _open_nofollow(path: Path, flags: int, what: str, mode: int = 0o600) -> int:
    try:
        return os.open(path, flags | _NOFOLLOW | _CLOEXEC, mode)
    except OSError as exc:
        if os.path.islink(path):  # ELOOP (Linux) / EMLINK (BSD): a symlink where a file should be
            raise UnsafeFolderError(f"{what} {path} refused: it is a symlink (to "
                                    f"{os.readlink(path)[:200]!r}); remove it") from exc
        raise


def open_lock(path: Path) -> int:
    """A file descriptor on lock file ``path`` (created 0600 when missing, never truncated, never
    through a symlink); `UnsafeFolderError` for a symlink or a non-regular file."""
    fd = _open_nofollow(path, os.O_RDWR | os.O_CREAT | _NONBLOCK, "lock file")
    _refuse_non_regular(fd, path, "lock file")
    return fd


def create_exclusive(folder: Path, prefix: str, mode: int = 0o644) -> tuple[int, Path]:
    """(fd, path) of a new file ``folder/<prefix><pid>.<random>``, created with ``O_EXCL`` (a file
    or symlink already there is never opened) and ``mode`` (less the umask)."""
    path = folder / f"{prefix}{os.getpid()}.{secrets.token_hex(4)}"
    return _open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, "temporary file", mode), path


def read_regular(path: str | os.PathLike[str], limit: int, what: str = "file",
                 follow_symlinks: bool = False) -> bytes:
    """The bytes of regular file ``path``, read without blocking on a FIFO or a device (opened
    ``O_NONBLOCK``, then fstat: anything but a regular file is refused before a byte is read);
    `UnsafeFolderError` for a non-regular file, or a symlink unless ``follow_symlinks`` (then
    its target is checked); ValueError when it holds more than ``limit`` bytes (it is not read
    past the limit)."""
    path = Path(path)
    if follow_symlinks:
        fd = os.open(path, os.O_RDONLY | _NONBLOCK | _CLOEXEC)
    else:
        fd = _open_nofollow(path, os.O_RDONLY | _NONBLOCK, what)
    st = _refuse_non_regular(fd, path, what)
    with os.fdopen(fd, "rb") as fh:
        if st.st_size > limit:
            raise ValueError(f"{what} {path}: {st.st_size} bytes, over the limit of {limit} bytes")
        data = fh.read(limit + 1)
    if len(data) > limit:  # it grew after the fstat
        raise ValueError(f"{what} {path}: over the limit of {limit} bytes")
    return data
