"""The run folder: made private, a file opened in it, and the session lock.

Once `ensure` has passed the folder, only our own uid can put anything among
our files: what is left is that a name holds what the daemon expects (a
plain file of ours, never a link; a socket before one is replaced). The
checks are the platform's (docs/architecture.md, "Files").
"""
from __future__ import annotations

import contextlib
import os
import stat
import time
from typing import Iterator

from .config import BadConfig
from .system import native

LOCK_RETRY_SECONDS = 0.05


class NotOurs(BadConfig):
    """Something at one of the daemon's names is not what the daemon made there."""


def ensure(path: str) -> None:
    """Create the run folder 0700, or check an existing one (`check`), whose
    mode is never changed: a shared folder given by mistake (a sticky 1777
    one, /tmp) is refused, not closed to everyone else."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.mkdir(path, 0o700)
        created = True
    except FileExistsError:
        created = False  # judged below, as it is
    except OSError as exc:
        raise BadConfig(f"cannot create the run folder {path}: {exc.strerror}; set LICH_CONTROL_RUN_DIR to a folder you can write") from exc
    check(path, created)


def check(path: str, created: bool = False) -> None:
    """BadConfig unless the run folder is a real folder (not a link), ours,
    and writable by no one else; one just `created` is made 0700. The status
    tool reads no folder the daemon would refuse."""
    try:
        native.check_folder(path, created)
    except native.Refused as exc:
        raise BadConfig(f"the run folder {path} {exc}; set LICH_CONTROL_RUN_DIR to a private folder") from exc


def open_file(path: str, flags: int) -> int:
    """A descriptor on the plain file of ours at `path` (native.open_private)."""
    try:
        return native.open_private(path, flags)
    except native.Refused as exc:
        raise NotOurs(f"{path} {exc}, not a file the daemon made: it will not write through it; remove it") from exc


def check_socket(path: str) -> None:
    """NotOurs unless `path` holds nothing or a socket (an earlier daemon's, to be replaced)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise NotOurs(f"{path} is not a socket, not a file the daemon made: it will not write through it; remove it")


class LockHeld(Exception):
    """Another daemon holds the session's lock: a passing state (a
    predecessor on its way out), met by starting the daemon again."""


@contextlib.contextmanager
def session_lock(path: str, session_id: str, wait: float) -> Iterator[None]:
    """An exclusive lock on `<session>.lock`, held while in the block: one
    poller per session. A reload can start a new daemon while the old one is
    still exiting, so the new one tries for `wait` seconds before LockHeld;
    the system releases the lock however the old one ends. The file stays, so
    every daemon locks the same file."""
    fd = open_file(path, os.O_RDWR | os.O_CREAT)
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                if native.try_lock(fd):
                    break
            except OSError as exc:
                raise BadConfig(f"cannot lock {path}: {exc.strerror}") from exc
            if time.monotonic() >= deadline:
                raise LockHeld(f"another daemon is still polling for session {session_id}; exiting, to be started again once it is gone")
            time.sleep(LOCK_RETRY_SECONDS)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)
