"""The run folder: made private, a file opened in it, and the session lock.

`ensure` refuses a folder another user can write in, so once it has passed
only our own uid can put anything among our files. What is left to check is
that a name holds what the daemon expects: a plain file of ours, never a
link followed to somewhere else (`open_file`), and a socket before one is
replaced (`check_socket`).

On Windows the folder is in the user's profile, whose ACL keeps it theirs;
`os.stat` gives no owner or mode there (st_uid 0, mode 0777 for all), so
`check` and `open_file` skip those two checks, and the lock is msvcrt's.
"""
from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from typing import Iterator

from .config import WINDOWS, BadConfig

if WINDOWS:
    from .windows import try_lock
else:
    from .posix import try_lock

PRIVATE = 0o600
# Never follow a link; never pass a descriptor to a child (Windows: none is inherited unless asked).
NO_FOLLOW = 0 if WINDOWS else os.O_NOFOLLOW | os.O_CLOEXEC
LOCK_RETRY_SECONDS = 0.05


class NotOurs(BadConfig):
    """Something at one of the daemon's names is not what the daemon made there."""


def ensure(path: str) -> None:
    """Create the run folder 0700, or make sure an existing one is a real
    folder (not a link), ours, and writable by no one else. Its mode is never
    changed: a shared folder given by mistake (a sticky 1777 one, /tmp) is
    refused, not closed to everyone else."""
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
    tool reads no folder the daemon would refuse. On Windows only the first
    two: the profile's ACL is the rest."""
    if WINDOWS:
        if os.path.islink(path):
            raise BadConfig(f"the run folder {path} is a symbolic link; set LICH_CONTROL_RUN_DIR to a private folder")
        if not os.path.isdir(path):
            raise BadConfig(f"the run folder {path} is not a folder")
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if os.path.islink(path):
            raise BadConfig(f"the run folder {path} is a symbolic link; set LICH_CONTROL_RUN_DIR to a private folder") from exc
        if exc.errno == errno.ENOTDIR:
            raise BadConfig(f"the run folder {path} is not a folder") from exc
        raise BadConfig(f"cannot use the run folder {path}: {exc.strerror}") from exc
    try:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid():
            raise BadConfig(f"the run folder {path} belongs to another user; set LICH_CONTROL_RUN_DIR to a private folder")
        if created:
            os.fchmod(fd, 0o700)  # the umask may have taken more than group and others' bits, or fewer
        elif info.st_mode & 0o022:
            raise BadConfig(
                f"the run folder {path} is writable by other users (mode {stat.S_IMODE(info.st_mode):o}); "
                "set LICH_CONTROL_RUN_DIR to a private folder"
            )
    finally:
        os.close(fd)


def open_file(path: str, flags: int) -> int:
    """A descriptor on the plain file of ours at `path`, created 0600 if
    `flags` say so, and made 0600 through the descriptor if an older daemon
    left it otherwise (owner and mode: not on Windows, see above)."""
    if WINDOWS and os.path.islink(path):
        raise NotOurs(_refusal(path, "is a symbolic link"))
    try:
        fd = os.open(path, flags | NO_FOLLOW, PRIVATE)
    except OSError as exc:
        problem = "is a symbolic link" if os.path.islink(path) else f"cannot be opened ({exc.strerror})"
        raise NotOurs(_refusal(path, problem)) from exc
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or (not WINDOWS and info.st_uid != os.geteuid()):
        os.close(fd)
        raise NotOurs(_refusal(path, "is not a plain file of ours"))
    if not WINDOWS and stat.S_IMODE(info.st_mode) != PRIVATE:
        os.fchmod(fd, PRIVATE)
    return fd


def check_socket(path: str) -> None:
    """Raise NotOurs unless `path` holds nothing or a socket (an earlier
    daemon's, which the caller replaces)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise NotOurs(_refusal(path, "is not a socket"))


def _refusal(path: str, problem: str) -> str:
    return f"{path} {problem}, not a file the daemon made: it will not write through it; remove it"


class LockHeld(Exception):
    """Another daemon holds the session's lock: a passing state (a
    predecessor on its way out), which the relay meets by starting the
    daemon again, not a configuration to refuse."""


@contextlib.contextmanager
def session_lock(path: str, session_id: str, wait: float) -> Iterator[None]:
    """An exclusive lock on `<session>.lock`, held while in the block: one
    poller per session.

    A reload can start a new daemon while the old one is still exiting, so
    the new one tries for `wait` seconds before LockHeld; the kernel
    releases the lock however the old one ends. The file stays, so every
    daemon locks the same file."""
    fd = open_file(path, os.O_RDWR | os.O_CREAT)
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                if try_lock(fd):
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
