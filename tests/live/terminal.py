"""A program under a pseudo-terminal, from the standard library alone.

    with Terminal([program, *args], env=env, cwd=folder) as term:
        term.wait_for_text("some words", timeout=10)   # the screen's text, escapes stripped
        term.type("/exit\\r")
        term.wait_exit(timeout=10)                      # the exit status

The program runs in a session of its own whose controlling terminal the
pseudo-terminal is, as in a real one. `close()` ends whatever is left of
that session: SIGTERM to its process group, then SIGKILL.

Threads: `Terminal` owns one reader thread (`pty-reader`), which drains the
terminal so the program never blocks on a full buffer and keeps what it
printed behind a condition.
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
from typing import List, Mapping, Optional, Tuple, Union

ROWS, COLUMNS = 50, 160
# CSI and OSC sequences and lone escapes: enough to read a TUI's words.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]|[\x00-\x08\x0b-\x1f\x7f]")
ESC = "\x1b"


def plain(text: str) -> str:
    """The words of a terminal stream, its escape sequences removed."""
    return _ESCAPES.sub("", text)


class NoTerminal(Exception):
    """No pseudo-terminal could be had: the live test fails on it, never skips."""


# A launcher the child execs before the program: Popen made it a session
# leader, and the terminal becomes that session's controlling terminal, as a
# real one is. (pty.fork would do it by running Python in a fork of this
# threaded process, which risks a deadlock; Popen runs no Python there.)
_TAKE_TERMINAL = "import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); os.execv(sys.argv[1], sys.argv[1:])"


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

    def __enter__(self) -> "Terminal":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self._fd, 65536)
            except OSError as exc:  # EIO: every holder of the terminal's other end is gone
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
    def output(self) -> str:
        """Everything printed so far, raw."""
        with self._cond:
            return "".join(self._chunks)

    @property
    def text(self) -> str:
        return plain(self.output)

    def mark(self) -> int:
        """A place in the output, for `wait_for_text(since=...)`."""
        with self._cond:
            return len("".join(self._chunks))

    def wait_for_text(self, words: Union[str, Tuple[str, ...]], timeout: float, since: int = 0) -> None:
        """Wait until `words` (or any of a tuple of them) show in the output
        after `since`, escapes stripped and runs of blanks (a TUI moves its
        cursor between words) squeezed."""
        wanted = [" ".join(one.split()) for one in ((words,) if isinstance(words, str) else words)]
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                seen = " ".join(plain("".join(self._chunks)[since:]).split())
                if any(one in seen or one.replace(" ", "") in seen.replace(" ", "") for one in wanted):
                    return
                left = deadline - time.monotonic()
                if left <= 0 or self._eof:
                    tail = seen[-600:]
                    why = "the program closed the terminal" if self._eof else f"not within {timeout:g} s"
                    raise AssertionError(f"{words!r} never showed on the terminal ({why}); its last words: {tail!r}")
                self._cond.wait(left)

    def type(self, keys: str) -> None:
        os.write(self._fd, keys.encode())

    def poll(self) -> Optional[int]:
        """The exit status once the program has ended, else None."""
        return self._proc.poll()

    def wait_exit(self, timeout: float) -> int:
        """The program's exit status; fails when it still runs after `timeout` s."""
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{os.path.basename(self.argv[0])} (pid {self.pid}) still runs {timeout:g} s later") from None

    def close(self) -> None:
        """End the program's whole session, if anything of it is left."""
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
