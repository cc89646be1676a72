"""The daemon's own files in the run folder, opened without following a link.

The run folder is private (config.ensure_run_dir), yet what sits at a name
the daemon uses is still checked before a byte goes into it: a symbolic link,
a FIFO, a file of another user or a file with a second hard link would have
the daemon write somewhere it never meant to. Each is refused with one line
that names the file, never written through.
"""
from __future__ import annotations

import os
import stat

from .config import BadConfig

PRIVATE = 0o600


class NotOurs(BadConfig):
    """Something at one of the daemon's names is not a plain file of ours."""


def open_own(path: str, flags: int) -> int:
    """A descriptor on the plain file of ours at `path` (created 0600 if
    `flags` say so), made 0600 through the descriptor itself. What the open
    refuses (a link, a FIFO without a reader, a folder, another user's file)
    is looked at only then, to say which it is; what it takes is judged by
    the descriptor."""
    try:
        # O_NONBLOCK: a FIFO must not hang the open; it is refused below like
        # anything else.
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, PRIVATE)
    except OSError as exc:
        refuse_foreign(path, stat.S_ISREG)
        raise NotOurs(f"cannot open {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        problem = _problem(info, stat.S_ISREG)
        if problem:
            raise NotOurs(_refusal(path, problem))
        os.set_blocking(fd, True)
        if stat.S_IMODE(info.st_mode) != PRIVATE:
            os.fchmod(fd, PRIVATE)  # a file left by an older daemon
    except BaseException:
        os.close(fd)
        raise
    return fd


def refuse_foreign(path: str, is_kind) -> None:
    """Raise NotOurs if something is at `path` that is not ours of the kind
    `is_kind` accepts (stat.S_ISREG, stat.S_ISSOCK); nothing there is fine."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    problem = _problem(info, is_kind)
    if problem:
        raise NotOurs(_refusal(path, problem))


def _problem(info: os.stat_result, is_kind) -> str:
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link"
    if not is_kind(info.st_mode):
        return "is not a plain file" if is_kind is stat.S_ISREG else "is not a socket"
    if info.st_uid != os.geteuid():
        return "belongs to another user"
    if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
        return "has another hard link"
    return ""


def _refusal(path: str, problem: str) -> str:
    return f"{path} {problem}, not a file the daemon made: it will not write through it; remove it"
