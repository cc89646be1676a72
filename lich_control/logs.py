"""Logging: a private rotating file per session, warnings also on stderr.

stdout is the bridge's and never carries a log line. Every record of the
package passes the token filter before it is formatted, so not even an
exception text that quotes a URL reaches a file or a terminal with the token.
"""
from __future__ import annotations

import errno
import io
import logging
import logging.handlers
import os
import sys
from typing import Callable, Optional

from .runfiles import NotOurs, open_own
from .safe_text import Scrub, cut
from .stderr_lines import StderrLines

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
MAX_BYTES = 1024 * 1024
BACKUPS = 2
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# A message longer than this is cut: a 15 MB kind lich sent is not a 15 MB line.
MAX_MESSAGE = 4096
MAX_TRACEBACK = 64 * 1024  # its frames come first; only an exception's text runs long


class Redact(logging.Filter):
    """Makes every record safe to write: the token replaced wherever it
    appears, its arguments included; the message cut to `MAX_MESSAGE` and its
    control characters and lone surrogates escaped, so an id lich chose can
    neither forge a line nor fill the disk. A traceback keeps its own lines,
    each cut alike."""

    def __init__(self, secret: str):
        super().__init__()
        self._scrub = Scrub.of(secret)

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        clean = self._scrub(text, MAX_MESSAGE)
        if clean != text or record.args:
            record.msg, record.args = clean, None
        if record.exc_text:
            lines = cut(self._scrub.redact(record.exc_text), MAX_TRACEBACK).split("\n")
            record.exc_text = "\n".join(self._scrub(line, MAX_MESSAGE) for line in lines)
        return True


def setup(token: str, level: Optional[str], log_path: Optional[str]) -> Callable[[], None]:
    """Route the package's logging; returns the function that flushes and stops it.

    Records are written where they are logged. A listener thread would take
    the write off the caller, but waking it costs the caller more than the
    write (a wake-up and the interpreter handed back and forth, per line).
    """
    chosen = (level or "INFO").upper()
    if chosen not in LEVELS:
        print(f"lich-control: LICH_CONTROL_LOG_LEVEL must be one of {', '.join(LEVELS)}; using INFO", file=sys.stderr)
        chosen = "INFO"
    root = logging.getLogger("lich_control")
    root.setLevel(chosen)
    root.propagate = False
    # urllib3 names URLs, and so the token, in some of its records: its
    # warnings come through the same redaction, and nothing of it below that.
    wire = logging.getLogger("urllib3")
    wire.setLevel(logging.WARNING)
    wire.propagate = False
    err = StderrLines()  # never blocks on a stderr nobody reads
    err.setLevel(logging.WARNING)
    err.setFormatter(logging.Formatter("lich-control: %(message)s"))
    handlers = [err]
    if log_path:
        # backslashreplace: a lone surrogate lich sent in an id is logged, not a logging error.
        handler = PrivateRotatingFile(log_path, maxBytes=MAX_BYTES, backupCount=BACKUPS, encoding="utf-8", errors="backslashreplace")
        handler.setFormatter(logging.Formatter(FORMAT))
        handlers.append(handler)
    redact = Redact(token)  # on each handler, before it formats the record
    for handler in handlers:
        handler.addFilter(redact)
        root.addHandler(handler)
        wire.addHandler(handler)

    def stop() -> None:
        for handler in handlers:
            root.removeHandler(handler)
            wire.removeHandler(handler)
            handler.close()

    return stop


class PrivateRotatingFile(logging.handlers.RotatingFileHandler):
    """A rotating log file that is 0600 from the first byte, every rotation
    included, and that checks its size without a stat and a second
    formatting of each record (the base class's cost per line).

    The file is opened only if it is a plain file of ours (runfiles.open_own):
    at the start anything else raises runfiles.NotOurs, and the daemon does
    not start; found at a rotation, the file is given up, said once, and the
    daemon goes on without it. A write that fails (a full disk, a file size
    limit) loses its line, said once per spell of failures: never with
    logging's own traceback on stderr, which a write to a pipe nobody reads
    would block on, and the logging thread (the worker) with it.

    Its state is guarded by the handler's own lock, which logging holds
    around `emit`; what is to be said is said once that lock is released.
    """

    given_up = False
    _failing = False  # a write failed and was said; cleared by one that works
    _wrote = True  # whether the record in hand was written
    _note: Optional[str] = None  # to be said once the lock is released

    def _open(self):
        fd = open_own(self.baseFilename, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        return open(fd, "a", encoding=self.encoding, errors=self.errors)

    def shouldRollover(self, record: logging.LogRecord) -> bool:
        # One line past the limit is allowed: the open stream's position is the size.
        if self.stream is None:
            self.stream = self._open()
        return self.maxBytes > 0 and self.stream.tell() >= self.maxBytes

    def doRollover(self) -> None:
        try:
            super().doRollover()
        except NotOurs as exc:
            self.given_up = True
            self.stream = _Nowhere()  # the record in hand goes nowhere; later ones stop at emit
            self._note = f"no more log file: {exc}"

    def handle(self, record: logging.LogRecord) -> bool:
        taken = super().handle(record)
        # Said outside this handler's lock: saying it takes the stderr
        # handler's, which that handler holds while it notes its own drops
        # here. Taken in both orders, two threads could wait on each other.
        with self.lock:
            note, self._note = self._note, None
        if note is not None:
            logging.getLogger("lich_control.logs").warning("%s", note)
        return taken

    def emit(self, record: logging.LogRecord) -> None:
        if self.given_up:
            return
        self._wrote = True
        super().emit(record)  # a failure comes to handleError, not here
        if self._wrote:
            self._failing = False

    def close(self) -> None:
        try:
            super().close()
        except OSError:
            pass  # its last lines could not be written either: said already, and the daemon is leaving

    def handleError(self, record: logging.LogRecord) -> None:
        self._wrote = False
        if self._failing:
            return
        self._failing = True
        exc = sys.exc_info()[1]
        why = errno.errorcode.get(getattr(exc, "errno", None) or 0, type(exc).__name__)
        self._note = f"writing the log file {self.baseFilename} failed ({why}): its lines are lost until a write works again"


class _Nowhere(io.TextIOBase):
    def write(self, text: str) -> int:
        return len(text)
