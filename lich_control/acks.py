"""Acks: the one answer lich gets for each command, encoded within its
limit, and `Acks`, the one place they are sent.

An ack is tried once. One that cannot be sent is dropped and logged (with
lich's reason when lich refused it), never retried: lich resolves a wait
with the first ack it gets, and the next command must not wait on this one.
"""
from __future__ import annotations

import json
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Callable, Optional, Set

import attrs

from .bridge import CallResult
from .lich import AckFailed, LichClient
from .activity import Activity

log = logging.getLogger("lich_control.acks")

# lich refuses (400) an ack body over 64 KiB.
MAX_BODY_BYTES = 64 * 1024
ANSWER_UNITS = 16_000  # UTF-16 code units, as JavaScript counts a string
TRUNCATED = "\n[truncated]"
POOL_SIZE = 8


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
        """The ack as UTF-8 JSON, measured to stay under lich's limit.

        The 16,000-unit cut alone does not bound the bytes (an answer of
        control characters encodes at six bytes a unit), so a body that is
        still too large has its answer, or else its error, cut further.
        """
        answer = cut_answer(self.answer) if self.answer is not None else None
        body = _encode(self._doc(answer, self.error))
        if len(body) < MAX_BODY_BYTES:
            return body
        if answer is not None:
            return self._shrunk(lambda text: self._doc(text, self.error), self.answer)
        if self.error is not None:
            return self._shrunk(lambda text: self._doc(None, text), self.error)
        raise AckTooLarge(f"the ack for {self.id[:40]!r} is over {MAX_BODY_BYTES} bytes")

    def _doc(self, answer: Optional[str], error: Optional[str]) -> dict:
        doc = {"session_id": self.session_id, "id": self.id, "kind": self.kind, "ok": self.ok}
        if error is not None:
            doc["error"] = error
        if answer is not None:
            doc["answer"] = answer
        return doc

    def _shrunk(self, build, text: str) -> bytes:
        # The largest prefix (in UTF-16 units) whose body fits: bodies grow
        # with the prefix, so a binary search finds it in ~15 encodings.
        units = _utf16_units(text)
        low, high = 0, min(units, ANSWER_UNITS)
        while low < high:
            mid = (low + high + 1) // 2
            if len(_encode(build(_prefix(text, mid) + TRUNCATED))) < MAX_BODY_BYTES:
                low = mid
            else:
                high = mid - 1
        body = _encode(build(_prefix(text, low) + TRUNCATED))
        if len(body) >= MAX_BODY_BYTES:
            raise AckTooLarge(f"the ack for {self.id[:40]!r} is over {MAX_BODY_BYTES} bytes")
        return body


def cut_answer(text: str) -> str:
    """Cut at 16,000 UTF-16 units, never inside a surrogate pair."""
    if len(text) <= ANSWER_UNITS // 2:  # each code point is at most two units
        return text
    if _utf16_units(text) <= ANSWER_UNITS:
        return text
    return _prefix(text, ANSWER_UNITS) + TRUNCATED


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
    """Sends each ack once: `send` in the caller's thread, `send_when_done`
    from a pool thread once a call's Future settles.

    The worker sends its abort, model, effort and refusal acks itself, and
    waits for each, since every other ack is awaited before the next
    command (contract, Order). A prompt's, a slash command's or an ask's
    ack goes once its call settles, and not from the thread that settled
    it, where its done-callback runs: that is the socket's thread answering
    the relay's POST /v1/result, or the bridge's deadline thread, and an
    ack's POST may take 10 s. The relay's results must all be taken (bridge.md:
    "no result is refused", with the socket's connections bounded), and
    the deadline thread keeps the deadline of the abort the worker awaits,
    when nothing waits on an ask (contract, Order). So those acks go from
    this pool, each as soon as its call settles. The pool, the acks
    handed to it and each sending thread's lich client are this object's.
    """

    def __init__(self, client_factory: Callable[[], LichClient], activity: Activity, size: int = POOL_SIZE):
        self._client_factory = client_factory
        self._activity = activity
        self._pool = ThreadPoolExecutor(max_workers=size, thread_name_prefix="lich-ack")
        self._local = threading.local()  # one lich client per sending thread
        self._lock = threading.Lock()
        self._handed: Set[Future] = set()

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
        """Once `future` settles, send `ack_of` its result from the pool."""
        future.add_done_callback(lambda done: self._hand_on(done, ack_of))

    def stop(self, timeout: float) -> bool:
        """Take nothing new; let what was handed on go within `timeout`.
        True if it all went."""
        self._pool.shutdown(wait=False)
        with self._lock:
            handed = list(self._handed)
        return not wait(handed, timeout).not_done

    def _hand_on(self, done: "Future[CallResult]", ack_of: Callable[[CallResult], Ack]) -> None:
        """The settling thread: hands the ack to the pool and returns."""
        try:
            job = self._pool.submit(lambda: self.send(ack_of(done.result())))
        except RuntimeError:  # the pool is shut: the daemon is stopping
            log.info("the daemon is stopping: a call settled now is not acked")
            return
        with self._lock:
            self._handed.add(job)
        job.add_done_callback(self._sent)

    def _sent(self, job: Future) -> None:
        with self._lock:
            self._handed.discard(job)
        if job.exception() is not None:  # a Future keeps its job's exception to itself: say it
            log.error("an ack was lost", exc_info=job.exception())

    def _client(self) -> LichClient:
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = self._client_factory()
        return client
