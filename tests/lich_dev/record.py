"""What the development lich saw: every poll and ack it took, with its headers.

    lich.record.wait_polls(2)                 # [PollRecord, ...] once two polls arrived
    lich.record.ack_for("m12")["error"]       # the body of the first ack for m12
    lich.record.answers                       # [AnswerRecord, ...]: each poll answer written whole
    lich.record.wait_for(lambda: len(lich.record.acks) == 1, what="the first ack")

A record is made when a request passed the token check, before it is
answered: a held poll is recorded as it parks, an ack before a held gate
lets it through. Times are `time.monotonic()` of arrival, real time for the
tests that measure a client's backoff. Waits end at a deadline and raise
`NotSeen`, whose message says what was seen instead; nothing sleeps.

Record shares the lich's condition: a waiter wakes on each new record.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import attrs

Headers = Tuple[Tuple[str, str], ...]


class NotSeen(AssertionError):
    """What a test waited for did not happen before its deadline."""


def _header(headers: Headers, name: str) -> Optional[str]:
    name = name.lower()
    return next((value for key, value in headers if key.lower() == name), None)


@attrs.frozen
class PollRecord:
    at: float  # time.monotonic() when it arrived
    session_id: str
    query: Dict[str, List[str]] = attrs.field(repr=False)  # as parse_qs reads it; the token is in it
    headers: Headers = attrs.field(repr=False)  # as sent, in order

    def header(self, name: str) -> Optional[str]:
        """The header's value, by a name in any case; None when absent."""
        return _header(self.headers, name)


@attrs.frozen
class AnswerRecord:
    """A 200 poll answer of JSON items, once written whole to its
    connection: what lich handed out, for a mod to ack."""

    at: float
    session_id: str
    body: Any


@attrs.frozen
class AckRecord:
    at: float
    body: Any  # the JSON it carried, or None when it did not parse
    raw: bytes = attrs.field(repr=False)
    query: Dict[str, List[str]] = attrs.field(repr=False)
    headers: Headers = attrs.field(repr=False)
    answer: Optional[int]  # the status lich answers it with; None: its connection is dropped unanswered

    @property
    def id(self) -> Optional[str]:
        return self.body.get("id") if isinstance(self.body, dict) else None

    def header(self, name: str) -> Optional[str]:
        return _header(self.headers, name)


class Record:
    def __init__(self, cond: threading.Condition):
        self._cond = cond
        self._polls: List[PollRecord] = []
        self._acks: List[AckRecord] = []
        self._answers: List[AnswerRecord] = []

    # -- the lich's side ----------------------------------------------------

    def add(self, record: Any) -> None:
        with self._cond:
            lists = {PollRecord: self._polls, AckRecord: self._acks, AnswerRecord: self._answers}
            lists[type(record)].append(record)
            self._cond.notify_all()

    # -- the test's side ----------------------------------------------------

    @property
    def polls(self) -> List[PollRecord]:
        with self._cond:
            return list(self._polls)

    @property
    def answers(self) -> List[AnswerRecord]:
        with self._cond:
            return list(self._answers)

    @property
    def acks(self) -> List[AckRecord]:
        """Every ack that arrived, a dropped or refused one included."""
        with self._cond:
            return list(self._acks)

    def ack_bodies(self, answered: bool = False) -> List[Any]:
        """The acks' bodies in arrival order; with `answered`, only those not dropped."""
        return [ack.body for ack in self.acks if not answered or ack.answer is not None]

    def clear(self) -> None:
        with self._cond:
            self._polls.clear()
            self._acks.clear()
            self._answers.clear()

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0, what: str = "the condition") -> None:
        """Return once `predicate()` holds; raise NotSeen at the deadline.
        The predicate runs under the lich's lock, so it sees a still picture."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise NotSeen(
                        f"waited {timeout:g} s for {what}; saw {len(self._polls)} polls and "
                        f"{len(self._acks)} acks: {[ack.body for ack in self._acks][-10:]}"
                    )
                self._cond.wait(left)

    def wait_polls(self, n: int, timeout: float = 10.0) -> List[PollRecord]:
        """Every poll so far, once there are at least `n`."""
        self.wait_for(lambda: len(self._polls) >= n, timeout, f"{n} polls")
        return self.polls

    def wait_acks(self, n: int, timeout: float = 10.0) -> List[AckRecord]:
        """Every ack so far, once at least `n` arrived."""
        self.wait_for(lambda: len(self._acks) >= n, timeout, f"{n} acks")
        return self.acks

    def ack_for(self, cid: str, timeout: float = 10.0) -> Any:
        """The body of the first ack for command `cid`, once it arrived."""
        found: List[AckRecord] = []

        def arrived() -> bool:
            found[:] = [ack for ack in self._acks if ack.id == cid][:1]
            return bool(found)

        self.wait_for(arrived, timeout, f"the ack for {cid}")
        return found[0].body
