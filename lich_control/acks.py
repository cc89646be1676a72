"""Acks: the one answer lich gets for each command, encoded within its
limit, and `Acks`, the one place they are sent.

An ack is tried once; one that cannot be sent is logged, never retried: the
next command must not wait on it.
"""
from __future__ import annotations

import json
import logging
import threading
from concurrent.futures import Future
from typing import Callable, Optional

import attrs

from .bridge import CallResult
from .lich import AckFailed, LichClient
from .activity import Activity
from .ordered import OrderedThread

log = logging.getLogger("lich_control.acks")

# lich refuses (400) an ack body over 64 KiB.
MAX_BODY_BYTES = 64 * 1024
ANSWER_UNITS = 16_000  # UTF-16 code units, as JavaScript counts a string
TRUNCATED = "\n[truncated]"


class AckTooLarge(Exception):
    """Even with its free text cut, the ack would not fit lich's limit."""


@attrs.frozen
class Ack:
    session_id: str
    id: str
    kind: str
    ok: bool
    error: Optional[str] = None
    answer: Optional[str] = None

    def body(self) -> bytes:
        """The ack as UTF-8 JSON under lich's limit: the 16,000-unit cut
        alone does not bound the bytes (a control character encodes as six),
        so a body still too large has its free text cut further."""
        doc = {"session_id": self.session_id, "id": self.id, "kind": self.kind, "ok": self.ok}
        if self.error is not None:
            doc["error"] = self.error
        if self.answer is not None:
            doc["answer"] = cut_answer(self.answer)
        body = _encode(doc)
        if len(body) < MAX_BODY_BYTES:
            return body
        field = "answer" if self.answer is not None else "error"
        return _shrunk(doc, field, getattr(self, field) or "")


def cut_answer(text: str) -> str:
    """Cut at 16,000 UTF-16 units, never inside a surrogate pair."""
    if _utf16_units(text) <= ANSWER_UNITS:
        return text
    return _prefix(text, ANSWER_UNITS) + TRUNCATED


def _shrunk(doc: dict, field: str, text: str) -> bytes:
    """The body with `doc[field]` cut to the longest prefix that fits, by
    binary search over its UTF-16 units (about 15 encodings)."""
    low, high = 0, min(_utf16_units(text), ANSWER_UNITS)
    while low < high:
        mid = (low + high + 1) // 2
        doc[field] = _prefix(text, mid) + TRUNCATED
        if len(_encode(doc)) < MAX_BODY_BYTES:
            low = mid
        else:
            high = mid - 1
    doc[field] = _prefix(text, low) + TRUNCATED
    body = _encode(doc)
    if len(body) >= MAX_BODY_BYTES:
        raise AckTooLarge(f"the ack is over {MAX_BODY_BYTES} bytes even with its {field} cut")
    return body


def _utf16_units(text: str) -> int:
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _prefix(text: str, units: int) -> str:
    """The first `units` UTF-16 units of text, one fewer if that would split a pair."""
    raw = text.encode("utf-16-le", "surrogatepass")[: units * 2]
    if len(raw) >= 2 and 0xD8 <= raw[-1] <= 0xDB:  # a high surrogate left alone
        raw = raw[:-2]
    return raw.decode("utf-16-le", "surrogatepass")


def _encode(doc: dict) -> bytes:
    # A lone surrogate (JSON allows "\ud800") cannot be UTF-8: it goes out as
    # the same JSON escape, which backslashreplace spells exactly that way.
    text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
    return text.encode("utf-8", "backslashreplace")


class Acks:
    """Sends each ack once: `send` in the caller's thread (the worker's,
    which awaits it), `send_when_done` from the ack thread once a call's
    Future settles. That thread exists because a POST may take 10 s, and the
    thread that settled the call (the socket's, or the deadline thread) must
    not wait so long. The ordered thread and each sending thread's lich
    client are this object's."""

    def __init__(self, client_factory: Callable[[], LichClient], activity: Activity):
        self._client_factory = client_factory
        self._activity = activity
        self._thread = OrderedThread("lich-ack")
        self._local = threading.local()  # one lich client per sending thread

    def send(self, ack: Ack) -> bool:
        """Post one ack from this thread; True when lich took it."""
        self._activity.waiting(ack.id, "ack")
        try:
            self._client().ack(ack)
        except (AckFailed, AckTooLarge) as exc:
            said = "lich refused" if getattr(exc, "refused", False) else "dropped"
            log.warning("%s the ack for %s (%s): %s", said, ack.id, ack.kind, exc)
            failure: Optional[str] = str(exc)
        else:
            log.info("acked %s (%s): %s", ack.id, ack.kind, "ok" if ack.ok else f"failed: {ack.error}")
            failure = None
        self._activity.acked(ack.id, ack.kind, ack.ok, ack.error, sent=failure)
        return failure is None

    def send_when_done(self, future: "Future[CallResult]", ack_of: Callable[[CallResult], Ack]) -> None:
        """Once `future` settles, send `ack_of` its result from the ack thread."""
        future.add_done_callback(lambda done: self.send_later(lambda: ack_of(done.result())))

    def send_later(self, make: Callable[[], Ack]) -> None:
        """Queue the ack `make()` builds for the ack thread, and return."""
        self._thread.submit("an ack", lambda: self.send(make()), _too_late)

    def stop(self, timeout: float) -> bool:
        """OrderedThread.stop: the acks already queued still go."""
        return self._thread.stop(timeout)

    def _client(self) -> LichClient:
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = self._client_factory()
        return client


def _too_late(why: Optional[str]) -> None:
    log.info("the daemon is stopping: a call settled now is not acked")
