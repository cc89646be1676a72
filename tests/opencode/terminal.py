"""A program under a pseudo-terminal, standard library only.

The program leads a session of its own whose controlling terminal is the
pseudo-terminal, as in a real one; one reader thread (`pty-reader`, owned
here) drains it, so the program never blocks on a full buffer, and keeps
what it printed behind a condition. `close()` ends the program's whole
process group: SIGTERM, then SIGKILL.
"""
from __future__ import annotations

import errno
import fcntl
import os
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from typing import List, Mapping

ROWS, COLUMNS = 40, 140
# CSI and OSC sequences, lone escapes and control bytes: enough to read a TUI's words.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]|[\x00-\x08\x0b-\x1f\x7f]")
# Run by the child before the program: Popen made it a session leader, and
# this makes the terminal that session's controlling terminal.
_TAKE_TERMINAL = "import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); os.execv(sys.argv[1], sys.argv[1:])"


class NoTerminal(Exception):
    """No pseudo-terminal could be had: the live test fails on it, never skips."""


def words(raw: str) -> str:
    """The words a terminal stream shows, escapes removed and blanks squeezed."""
    return " ".join(_ESCAPES.sub(" ", raw).split())


class Terminal:
    def __init__(self, argv: List[str], env: Mapping[str, str], cwd: str):
        self.argv = list(argv)
        self._cond = threading.Condition()
        self._chunks: List[str] = []
        self._eof = False
        try:
            fd, child_end = os.openpty()
        except OSError as exc:
            raise NoTerminal(f"cannot open a pseudo-terminal: {exc}") from exc
        try:
            fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
            self._proc = subprocess.Popen([sys.executable, "-I", "-c", _TAKE_TERMINAL, *argv], env=dict(env), cwd=cwd,
                                          stdin=child_end, stdout=child_end, stderr=child_end, start_new_session=True)
        except BaseException:
            os.close(fd)
            raise
        finally:
            os.close(child_end)
        self.pid = self._proc.pid
        self._fd = fd
        self._reader = threading.Thread(target=self._read, name="pty-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self._fd, 65536)
            except OSError as exc:  # EIO: the program's side of the terminal is closed
                if exc.errno not in (errno.EIO, errno.EBADF):
                    raise
                data = b""
            with self._cond:
                if not data:
                    self._eof = True
                    self._cond.notify_all()
                    return
                self._chunks.append(data.decode("utf-8", "replace"))
                self._cond.notify_all()

    @property
    def text(self) -> str:
        with self._cond:
            return words("".join(self._chunks))

    def mark(self) -> int:
        """A place in the output, for `wait_for_text(since=...)`."""
        with self._cond:
            return sum(len(chunk) for chunk in self._chunks)

    def wait_for_text(self, wanted: str, timeout: float, since: int = 0) -> None:
        """Until `wanted` shows after `since` (a TUI moves its cursor between
        words, so blanks are compared squeezed, and also left out)."""
        wanted = " ".join(wanted.split())
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                seen = words("".join(self._chunks)[since:])
                if wanted in seen or wanted.replace(" ", "") in seen.replace(" ", ""):
                    return
                left = deadline - time.monotonic()
                if left <= 0 or self._eof:
                    why = "the program closed the terminal" if self._eof else f"not within {timeout:g} s"
                    raise AssertionError(f"{wanted!r} never showed ({why}); the screen's last words: {seen[-500:]!r}")
                self._cond.wait(left)

    def type(self, keys: str) -> None:
        os.write(self._fd, keys.encode())

    def poll(self):
        return self._proc.poll()

    def wait_exit(self, timeout: float) -> int:
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{os.path.basename(self.argv[0])} (pid {self.pid}) still runs {timeout:g} s later") from None

    def close(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self.poll() is not None:
                break
            _signal_group(self.pid, sig)
            try:
                self._proc.wait(3.0)
            except subprocess.TimeoutExpired:
                continue
        _signal_group(self.pid, signal.SIGKILL)  # whatever it left in its group
        self._reader.join(timeout=2)
        try:
            os.close(self._fd)
        except OSError:
            pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
