"""Lifeline: the daemon never outlives its session, and one session has one poller.

The session is gone when the process that started the daemon dies, or when
it closes its end of a pipe. Linux's parent-death signal covers the first
with no thread at all; a watcher thread blocks in poll() on the pipes for the
second, and only where the platform has no such signal does it also wake
once a second to compare the parent's pid.
"""
from __future__ import annotations

import ctypes
import fcntl
import logging
import os
import select
import signal
import stat
import sys
import threading
import time
from typing import Callable, Optional

from .runfiles import open_own

log = logging.getLogger("lich_control.lifeline")

PR_SET_PDEATHSIG = 1
PARENT_CHECK_SECONDS = 1.0
LOCK_WAIT_SECONDS = 5.0  # LICH_CONTROL_LOCK_WAIT overrides


def set_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send `sig` when our parent dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        # The interpreter's own symbols include libc's: no library search
        # (find_library runs ldconfig, ~5 ms of the daemon's start).
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class ParentWatch:
    """Calls `on_gone` once when the parent dies or closes our stdin or stdout."""

    def __init__(self, parent_pid: int, on_gone: Callable[[str], None], has_death_signal: bool):
        self._parent_pid = parent_pid
        self._on_gone = on_gone
        self._timeout_ms = None if has_death_signal else int(PARENT_CHECK_SECONDS * 1000)
        self._thread = threading.Thread(target=self._run, name="lich-lifeline", daemon=True)

    def start(self) -> None:
        if os.getppid() != self._parent_pid:
            self._on_gone("the process that started the daemon is gone")
            return
        self._thread.start()

    def _run(self) -> None:
        poller = select.poll()
        watched = {}
        for fd, events in ((0, select.POLLIN), (1, 0)):
            if fd == 0 and _is_pipe(0) and _at_end(0):
                # A stdin closed from the start (a spawn given no input) says
                # nothing about the parent; only one closed later does.
                continue
            if _is_pipe(fd):
                poller.register(fd, events)  # POLLHUP and POLLERR are always reported
                watched[fd] = events
        if not watched and self._timeout_ms is None:
            return  # nothing to watch; the death signal covers the parent
        while True:
            try:
                ready = poller.poll(self._timeout_ms)
            except InterruptedError:
                continue
            if os.getppid() != self._parent_pid:
                return self._on_gone("the process that started the daemon is gone")
            for fd, event in ready:
                if fd == 0 and event & select.POLLIN and not event & select.POLLHUP:
                    if os.read(0, 65536):
                        continue  # the relay sends nothing on stdin; ignore what comes
                if fd == 0:
                    return self._on_gone("the parent closed the daemon's stdin")
                return self._on_gone("the parent closed its end of the daemon's stdout")


def _at_end(fd: int) -> bool:
    """True when fd is already at its end: hung up, or readable with nothing to read."""
    probe = select.poll()
    probe.register(fd, select.POLLIN)
    ready = probe.poll(0)
    if not ready:
        return False
    if ready[0][1] & select.POLLHUP and not ready[0][1] & select.POLLIN:
        return True
    return os.read(fd, 65536) == b"" if ready[0][1] & select.POLLIN else False


def _is_pipe(fd: int) -> bool:
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


class SessionLock:
    """An exclusive lock on `<session>.lock`: one poller per session.

    A reload can start a new daemon while the old one is still exiting; the
    new one waits a bounded time for the old one's lock, which the kernel
    releases however the old one ends. Anything at the lock's name that is
    not a plain file of ours raises runfiles.NotOurs: it is never truncated.
    """

    def __init__(self, path: str):
        self.path = path
        self._fd: Optional[int] = None

    def acquire(self, timeout: float = LOCK_WAIT_SECONDS) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            fd = open_own(self.path, os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not _wait_for_lock(fd, deadline - time.monotonic()):
                    # The helper thread may still hold fd in flock(): leave fd
                    # open rather than let a reused number be locked by mistake.
                    return False
            if _same_file(fd, self.path):
                break
            # The holder removed the file as it exited: lock the new one.
            os.close(fd)
        self._fd = fd
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return True

    def release(self) -> None:
        """Remove the file, then unlock: a waiter on the old file sees it gone and retries."""
        if self._fd is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            os.close(self._fd)
            self._fd = None


def _same_file(fd: int, path: str) -> bool:
    try:
        held, named = os.fstat(fd), os.lstat(path)
    except FileNotFoundError:
        return False
    return (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)


def _wait_for_lock(fd: int, timeout: float) -> bool:
    # flock has no timeout: a helper thread blocks in it, and we wait on the
    # thread. If time runs out the caller exits, which ends the helper too.
    got = threading.Event()

    def block() -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            got.set()
        except OSError:
            pass

    threading.Thread(target=block, name="lich-lock-wait", daemon=True).start()
    return got.wait(timeout)
