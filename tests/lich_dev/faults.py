"""Faults a test scripts into the development lich: what a real lich, a network
or a dying process might do to the mod, on purpose and in order.

    lich.faults.script(Answer(status=503, body="busy"))     # the next poll's whole answer
    lich.faults.script(Answer(drop=True), session_id="s1")  # only a poll for s1 takes it
    lich.faults.deliver({"id": "m3", "kind": "model"}, "junk")  # items as they are, no rule checked
    lich.faults.script_acks(AckAnswer(status=400), AckAnswer(drop=True))  # the next acks' answers
    lich.faults.hold_acks(); ...; lich.faults.release_acks()  # acks taken but left unanswered
    lich.faults.script(Answer(drip=2.0))                     # the answer one byte every 2 s
    lich.faults.script(Answer(wire=b"", endless=b"HTTP/1.1 100 Continue\r\n\r\n", drip=0.1))

A scripted poll answer goes to the next poll that may take it, a held one
included, before anything queued. A scripted ack answer is used by the next
ack, whatever it says. Nothing here reads a clock: `delay` is real time
spent by the connection thread, as a slow lich would spend it.

Faults holds no lock of its own: it shares the lich's condition, so a held
poll wakes when an answer is scripted for it.
"""
from __future__ import annotations

import collections
import threading
from typing import Any, Deque, Optional, Tuple

import attrs

from .rules import encode_answer


@attrs.frozen
class Answer:
    """One poll's answer, in place of the commands queued for it."""

    status: int = 200
    body: Any = attrs.field(factory=list)  # sent as JSON
    raw: Optional[bytes] = None  # sent as it is, instead of `body`
    drop: bool = False  # close the connection without a word
    delay: float = 0.0  # seconds before answering
    chunked: Optional[bool] = None  # None: framed as lich's Go server frames it (chunked past 2 KiB)
    # A lich that never finishes answering. `wire` goes out as it is in place
    # of the whole answer, status line included; `endless` follows the answer
    # again and again until the mod hangs up or lich closes; `drip` is the
    # pause between writes, each byte of the answer then written on its own.
    wire: Optional[bytes] = None
    endless: Optional[bytes] = None
    drip: float = 0.0

    def __attrs_post_init__(self) -> None:
        if self.delay < 0 or self.drip < 0:
            raise ValueError("a delay or a drip is a number of seconds, 0 or more")
        if self.endless is not None and not (self.endless and self.drip > 0):
            raise ValueError("an endless answer needs bytes to repeat and a drip between them")

    def payload(self) -> bytes:
        """The body: `raw` as it is, else `body` encoded as lich encodes a poll's answer."""
        return self.raw if self.raw is not None else encode_answer(self.body)

    @property
    def trickles(self) -> bool:
        return self.drip > 0 or self.wire is not None or self.endless is not None


@attrs.frozen
class AckAnswer:
    """One ack's answer, in place of lich's own. Only a 2xx lets the ack
    count (settle its command's wait); any other status leaves it untaken."""

    status: int = 204
    reason: str = "refused: a test scripted it"  # the body of a status other than 204
    drop: bool = False  # close the connection without answering
    phrase: Optional[str] = None  # the status line's reason phrase, in place of the usual one
    drip: float = 0.0  # seconds between the answer's bytes, each written on its own

    def __attrs_post_init__(self) -> None:
        if self.drip < 0:
            raise ValueError("a drip is a number of seconds, 0 or more")

    @property
    def takes(self) -> bool:
        return not self.drop and 200 <= self.status < 300


class Faults:
    """The faults scripted for one lich, consulted by its connection threads."""

    def __init__(self, cond: threading.Condition):
        self._cond = cond
        self._answers: Deque[Tuple[Optional[str], Answer]] = collections.deque()
        self._ack_answers: Deque[AckAnswer] = collections.deque()
        self._acks_open = threading.Event()  # cleared while acks are held
        self._acks_open.set()
        self._closed = False

    # -- the test's side ----------------------------------------------------

    def script(self, *answers: Answer, session_id: Optional[str] = None) -> None:
        """Answer the next polls (of `session_id`, or of any session) with these, in order."""
        for answer in answers:
            if not isinstance(answer, Answer):
                raise TypeError(f"script takes Answer values, not {type(answer).__name__}")
        with self._cond:
            self._answers.extend((session_id, answer) for answer in answers)
            self._cond.notify_all()

    def deliver(self, *items: Any, session_id: Optional[str] = None) -> None:
        """Hand these items to the next poll as they are, in one answer:
        no rule of lich's is checked, no id given, no wait kept for them."""
        self.script(Answer(body=list(items)), session_id=session_id)

    def script_acks(self, *answers: AckAnswer) -> None:
        """Answer the next acks with these, in order, whatever they say."""
        for answer in answers:
            if not isinstance(answer, AckAnswer):
                raise TypeError(f"script_acks takes AckAnswer values, not {type(answer).__name__}")
        with self._cond:
            self._ack_answers.extend(answers)

    def hold_acks(self) -> None:
        """Take each ack that arrives from now on, but answer none until `release_acks`."""
        with self._cond:
            if not self._closed:  # a closing lich holds nothing back
                self._acks_open.clear()

    def release_acks(self) -> None:
        self._acks_open.set()

    def left(self) -> Tuple[int, int]:
        """Scripted (poll answers, ack answers) nothing has used yet."""
        with self._cond:
            return len(self._answers), len(self._ack_answers)

    # -- the lich's side ----------------------------------------------------

    def take_answer(self, session_id: str) -> Optional[Answer]:
        """The first answer scripted for this poll, if any. Called under the lich's condition."""
        for index, (only, answer) in enumerate(self._answers):
            if only is None or only == session_id:
                del self._answers[index]
                return answer
        return None

    def take_ack_answer(self) -> Optional[AckAnswer]:
        with self._cond:
            return self._ack_answers.popleft() if self._ack_answers else None

    def wait_acks_open(self) -> None:
        """Block an ack's connection thread while acks are held."""
        self._acks_open.wait()

    def close(self) -> None:
        """A closing lich holds nothing back."""
        with self._cond:
            self._closed = True
        self._acks_open.set()
