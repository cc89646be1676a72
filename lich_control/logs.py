"""Logging: a private rotating file per session, warnings also on stderr.

stdout is the bridge's and never carries a log line. Every handler runs the
token filter, so even a message some library builds with a URL in it (urllib3
logs request lines at debug level) reaches no file or terminal with the token.
"""
from __future__ import annotations

import logging
import logging.handlers
import os
import sys
from typing import Optional

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
MAX_BYTES = 1024 * 1024
BACKUPS = 2
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class Redact(logging.Filter):
    """Replaces the token wherever it appears in a record, its arguments included."""

    def __init__(self, secret: str):
        super().__init__()
        self._secret = secret
        self._quoted = _quoted(secret)

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        clean = self.clean(text)
        if clean != text or record.args:
            record.msg, record.args = clean, None
        if record.exc_text:
            record.exc_text = self.clean(record.exc_text)
        return True

    def clean(self, text: str) -> str:
        for secret in (self._secret, self._quoted):
            if secret and secret in text:
                text = text.replace(secret, "[token]")
        return text


def setup(token: str, level: Optional[str], log_path: Optional[str]) -> None:
    chosen = (level or "INFO").upper()
    if chosen not in LEVELS:
        print(f"lich-control: LICH_CONTROL_LOG_LEVEL must be one of {', '.join(LEVELS)}; using INFO", file=sys.stderr)
        chosen = "INFO"
    root = logging.getLogger("lich_control")
    root.setLevel(chosen)
    root.propagate = False
    redact = Redact(token)
    err = logging.StreamHandler(sys.stderr)
    err.setLevel(logging.WARNING)
    err.setFormatter(logging.Formatter("lich-control: %(message)s"))
    handlers = [err]
    if log_path:
        _create_private(log_path)
        handler = logging.handlers.RotatingFileHandler(log_path, maxBytes=MAX_BYTES, backupCount=BACKUPS, encoding="utf-8")
        handler.setFormatter(logging.Formatter(FORMAT))
        handlers.append(handler)
    for handler in handlers:
        handler.addFilter(redact)
        root.addHandler(handler)
    # urllib3 logs every request line, URL and token included, at debug level.
    logging.getLogger("urllib3").setLevel(logging.WARNING)


def _create_private(path: str) -> None:
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    os.chmod(path, 0o600)
    # Rotated files are renamed from this one and keep its mode.


def _quoted(secret: str) -> str:
    from urllib.parse import quote

    return quote(secret, safe="")
