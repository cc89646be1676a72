"""Logging, and the one place that makes text from outside safe to show:
lich chooses every id, kind and reason it sends, and an error text may
quote a URL, and so the token. The log filter and the status document
(activity.py) both clean through one `Redactor`'s rules, so what one hides
the other hides too. stdout is the bridge's and never carries a log line.
"""
from __future__ import annotations

import bisect
import errno
import itertools
import logging
import logging.handlers
import os
import select
import sys
import threading
from typing import List, Optional, Tuple
from urllib.parse import quote, unquote, unquote_plus

from .run_folder import open_file
from .system import native

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
MAX_BYTES = 1024 * 1024
BACKUPS = 2
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# A message longer than this is cut: a 15 MB kind lich sent is not a 15 MB line.
MAX_MESSAGE = 4096
MAX_TRACEBACK = 64 * 1024  # its frames come first; only an exception's text runs long
CUT = "…"
REDACTED = "[token]"
# What a pipe takes whole or not at all (POSIX); Windows has no such size,
# and its non-waiting pipe takes what fits: a line cut there counts as dropped.
ONE_WRITE = getattr(select, "PIPE_BUF", 512)


class Redactor:
    """Takes the token (and the bridge's secret, where there is one) out of a
    text, in each form a URL gives it: as it is, quoted as the daemon quotes
    it (nothing safe), and as most clients would (`/` left)."""

    def __init__(self, token: str, *more: Optional[str]):
        self._raw = tuple(secret for secret in (token, *more) if secret)
        forms = []
        for secret in self._raw:
            raw = secret.encode("utf-8", "surrogatepass")
            forms += (secret, quote(raw, safe=""), quote(raw))
        self._forms: Tuple[str, ...] = tuple(dict.fromkeys(forms))

    def redact(self, text: str) -> str:
        for form in self._forms:
            if form in text:
                text = text.replace(form, REDACTED)
        if self._forms and ("%" in text or "+" in text):
            # Quoted some other way (lower-case hex, `+` for a space): found
            # in the text as decoded, which is then what is shown.
            for decode in (unquote, unquote_plus):
                decoded = decode(text)
                for secret in self._raw:
                    if secret in decoded:
                        text = decoded = decoded.replace(secret, REDACTED)
        return text

    def clean(self, text: str, limit: int) -> str:
        """Redacted before the cut, so no part of the token is left at it;
        escaped within the limit, so a 15 MB text is never escaped whole;
        redacted again, as an escape could spell a token holding a backslash."""
        return self.redact(escape(self.redact(text), limit))

    def filter(self, record: logging.LogRecord) -> bool:
        """As the log filter (on each handler, before it formats): the message,
        arguments included, cleaned; a traceback keeps its lines, each cleaned."""
        record.msg, record.args = self.clean(record.getMessage(), MAX_MESSAGE), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            lines = self.redact(record.exc_text)[:MAX_TRACEBACK].split("\n")
            record.exc_text = "\n".join(self.clean(line, MAX_MESSAGE) for line in lines)
        return True


def escape(text: str, limit: int) -> str:
    """`text` with every character `str.isprintable` refuses written as its
    Python escape (`\\n`, `\\x1b`, `\\u202e`, `\\udc80`), cut to `limit`
    characters between escapes, never inside one, `…` marking the cut. A
    newline forges a log line, an ESC drives the terminal lich-mod-status
    prints on, an invisible or bidirectional mark hides or reorders text,
    and no encoder takes a lone surrogate."""
    head = text[:limit]  # escaping only lengthens: nothing past it can show
    if head.isprintable():
        return head if len(text) <= limit else head[: limit - 1] + CUT
    pieces = [char if char.isprintable() else char.encode("unicode_escape").decode("ascii") for char in head]
    ends = list(itertools.accumulate(map(len, pieces)))
    if len(text) <= limit and ends[-1] <= limit:
        return "".join(pieces)
    # The pieces that end within the limit, with room left for the cut mark.
    return "".join(pieces[: bisect.bisect_right(ends, limit - len(CUT))]) + CUT


class StderrLines(logging.Handler):
    """Warnings on stderr, never waiting for room: a relay that stops reading
    it must not hold the thread that logs, nor the exit. The descriptor is
    non-blocking (native.nonblocking) and each line one write a pipe takes
    whole or not at all; a line that finds no room is dropped and counted
    (`dropped`): the log file has it. Nothing here logs: a handler that
    logged its own trouble would take another handler's lock inside its own."""

    def __init__(self, fd: int = 2):
        super().__init__(logging.WARNING)
        self._fd = fd
        self.dropped = 0  # written under the handler's lock (logging holds it around emit)
        native.nonblocking(fd)

    def emit(self, record: logging.LogRecord) -> None:
        if not self.put(self.format(record)):
            self.dropped += 1

    def put(self, line: str) -> bool:
        """One line out at once, or False. Any thread, no lock: see above."""
        data = one_write(line)
        try:
            return os.write(self._fd, data) == len(data)
        except OSError:  # full (BlockingIOError), or nobody reads it any more
            return False


def one_write(text: str) -> bytes:
    """The line as UTF-8, cut to fit one write that a pipe takes whole."""
    data = text.encode("utf-8", "backslashreplace") + b"\n"
    if len(data) <= ONE_WRITE:
        return data
    end = b"...\n"
    return data[: ONE_WRITE - len(end)].decode("utf-8", "ignore").encode("utf-8") + end


class PrivateRotatingFile(logging.handlers.RotatingFileHandler):
    """A rotating log file opened only as a plain file of ours
    (run_folder.open_file), and so 0600 from the first byte, every rotation
    included; anything else at its name at the start raises NotOurs. Later,
    a line that cannot be written (a full disk, something not ours found at
    a rotation) is lost, and said once until a write works again, with `say`
    (one write to stderr): never logging's own traceback, whose blocking
    write to a stderr nobody reads would hold the thread that logs."""

    _failure: Optional[BaseException] = None  # why the last write failed (under the handler's lock, held around emit)

    def __init__(self, path: str, say=lambda line: None, **kwargs):
        self._say = say
        super().__init__(path, **kwargs)

    def _open(self):
        fd = open_file(self.baseFilename, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        return open(fd, "a", encoding=self.encoding, errors=self.errors)

    def shouldRollover(self, record: logging.LogRecord) -> bool:
        # The stream's position is the size (docs/performance.md); one line past the limit is allowed.
        if self.stream is None:
            self.stream = self._open()
        return self.maxBytes > 0 and self.stream.tell() >= self.maxBytes

    def emit(self, record: logging.LogRecord) -> None:
        failing = self._failure is not None
        self._failure = None
        super().emit(record)  # a failure comes to handleError, which records it again
        if self._failure is not None and not failing:
            why = errno.errorcode.get(getattr(self._failure, "errno", None) or 0) or str(self._failure)
            self._say(f"lich-control: writing the log file {self.baseFilename} failed ({why}): its lines are lost until a write works again")

    def handleError(self, record: logging.LogRecord) -> None:
        self._failure = sys.exc_info()[1]

    def close(self) -> None:
        try:
            super().close()
        except OSError:
            pass  # its last lines could not be written either: said already, and the daemon is leaving


class Logs:
    """The package's logging, routed to stderr and the log file until
    `close`, which flushes and stops it. Records are written in the thread
    that logs them: no listener thread (docs/performance.md)."""

    def __init__(self, redactor: Redactor, level: Optional[str], log_path: str):
        chosen = (level or "INFO").upper()
        if chosen not in LEVELS:
            print(f"lich-control: LICH_CONTROL_LOG_LEVEL must be one of {', '.join(LEVELS)}; using INFO", file=sys.stderr)
            chosen = "INFO"
        self.stderr = StderrLines()
        self.stderr.setFormatter(logging.Formatter("lich-control: %(message)s"))
        file = PrivateRotatingFile(log_path, say=self.stderr.put, maxBytes=MAX_BYTES, backupCount=BACKUPS, encoding="utf-8")
        file.setFormatter(logging.Formatter(FORMAT))
        self._handlers: List[logging.Handler] = [self.stderr, file]
        self._root = logging.getLogger("lich_control")
        # urllib3 names URLs, and so the token, in some of its records: its
        # warnings come through the same filter, and nothing of it below that.
        self._wire = logging.getLogger("urllib3")
        self._before = [(logger, logger.level, logger.propagate) for logger in (self._root, self._wire)]  # for close
        self._root.setLevel(chosen)
        self._wire.setLevel(logging.WARNING)
        self._root.propagate = self._wire.propagate = False
        for handler in self._handlers:
            handler.addFilter(redactor)
            self._root.addHandler(handler)
            self._wire.addHandler(handler)
        # Python's own hooks write an uncaught exception to stderr as it is,
        # and a requests error names its URL, and so the token: through the filter instead.
        self._hooks = sys.excepthook, threading.excepthook
        sys.excepthook = lambda *exc_info: self._root.error("uncaught exception", exc_info=exc_info)
        threading.excepthook = self._uncaught_in_thread

    def _uncaught_in_thread(self, args) -> None:
        if args.exc_type is not SystemExit:  # as the default hook: a thread's sys.exit() is no fault
            name = args.thread.name if args.thread is not None else "?"
            self._root.error("uncaught exception in thread %s", name, exc_info=(args.exc_type, args.exc_value, args.exc_traceback))

    def close(self) -> None:
        """Undo everything the setup changed: hooks, levels, propagation, handlers."""
        sys.excepthook, threading.excepthook = self._hooks
        for logger, level, propagate in self._before:
            logger.setLevel(level)
            logger.propagate = propagate
        for handler in self._handlers:
            self._root.removeHandler(handler)
            self._wire.removeHandler(handler)
            handler.close()

