"""Warnings on stderr that never hold up the thread that logs them.

The relay may stop reading the daemon's stderr, and a pipe nobody reads is
full at 64 KiB: a plain write would then block the worker (and every later
command with it) and the exit. Here a line waits at most `wait` seconds for
room, then goes out in one write of at most PIPE_BUF bytes, which a pipe
with room takes whole without blocking. A line that finds no room is
dropped and counted; while lines are being dropped none waits at all. The
count is said on stderr once it takes lines again, and in the log file
(which has every line anyway).
"""
from __future__ import annotations

import logging
import os
import select

WAIT = 0.1  # seconds a line waits for room on stderr, once per spell of drops
CUT = b"...\n"
# A record carrying this attribute is this handler's own note: for the log file only.
NOTE = "stderr_note"

log = logging.getLogger("lich_control.logs")


class StderrLines(logging.Handler):
    """A handler writing to fd 2 without ever blocking on it for long.

    Its count of dropped lines is touched only in `emit` and `close`, under
    the handler's own lock (logging holds it around `emit`)."""

    def __init__(self, fd: int = 2, wait: float = WAIT):
        super().__init__()
        self._fd = fd
        self._wait = wait
        self._poll = select.poll()
        self._poll.register(fd, select.POLLOUT)
        self.dropped = 0

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, NOTE, False):
            return
        try:
            line = one_write(self.format(record))
        except Exception:
            self.handleError(record)
            return
        if self.dropped:
            if not self._room(0.0) or not self._put(f"lich-control: {self._lost()}; the log file has them\n".encode()):
                self.dropped += 1
                return
            log.warning("%s", self._lost(), extra={NOTE: True})
            self.dropped = 0
        if self._room(self._wait) and self._put(line):
            return
        self.dropped = 1
        log.warning("stderr takes no more lines (nobody reads it?): warnings are dropped there until it does", extra={NOTE: True})

    def handleError(self, record: logging.LogRecord) -> None:
        # logging's own would print a traceback to this very stderr, with a
        # blocking write; the log file reports the same record's failure.
        pass

    def close(self) -> None:
        with self.lock:
            if self.dropped:
                log.warning("%s", self._lost(), extra={NOTE: True})
                self.dropped = 0
        super().close()

    def _lost(self) -> str:
        return f"{self.dropped} warning line{'s' if self.dropped != 1 else ''} could not be written to stderr (it was full)"

    def _room(self, wait: float) -> bool:
        try:
            events = self._poll.poll(wait * 1000)
        except OSError:
            return False
        return any(mask & select.POLLOUT and not mask & (select.POLLERR | select.POLLNVAL) for _, mask in events)

    def _put(self, data: bytes) -> bool:
        try:
            return os.write(self._fd, data) > 0
        except OSError:  # the reader is gone, or fd 2 with it
            return False


def one_write(text: str) -> bytes:
    """The line as UTF-8, cut to fit one write that a pipe takes whole."""
    data = text.encode("utf-8", "backslashreplace") + b"\n"
    if len(data) <= select.PIPE_BUF:
        return data
    kept = data[: select.PIPE_BUF - len(CUT)].decode("utf-8", "ignore").encode("utf-8")
    return kept + CUT
