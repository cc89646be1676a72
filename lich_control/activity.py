"""Activity: what the daemon is doing, for `GET /v1/status` and lich-mod-status.

Every thread reports here (the poller its polls, the worker and the ack
senders their commands); one lock guards it all, held only to copy a few
fields. Times are read from an injected monotonic clock, so tests can move
them; the document gives ages, not clock readings.

Every string from outside is cleaned once, as it enters (logs.Redactor,
built from the token): lich chooses ids, kinds and the texts of its
refusals, and none of them may bring the token, a terminal's escape, an
invisible or bidirectional character or a lone surrogate into the
document, nor make it grow. What leaves is shown as it is, by
lich-mod-status too. Sizes are bounded as well: `counts` names at most
`MAX_KINDS` kinds, `in_flight` lists the oldest `SHOWN_IN_FLIGHT`.
"""
from __future__ import annotations

import collections
import itertools
import os
import threading
import time
from typing import Callable, Dict, Optional

from . import CONTRACT_RELEASE, __version__
from .commands import KINDS
from .bridge import Overrides, Turns
from .logs import Redactor

RECENT = 20
ERRORS = 10
SHOWN_IN_FLIGHT = 50  # the oldest; `in_flight_more` counts the rest
# Kinds `counts` names, the contract's always among them; acks of further
# kinds lich made up are counted together under OTHER_KINDS.
MAX_KINDS = 16
OTHER_KINDS = "(other)"
ID_LIMIT = 200  # characters of an id or a kind shown
TEXT_LIMIT = 400  # characters of an error or a reason shown


class Activity:
    def __init__(
        self,
        session_id: str,
        engine: str,
        turns: Turns,
        clock: Optional[Callable[[], float]] = None,
        wall: Optional[Callable[[], float]] = None,
        files: Optional[Dict[str, str]] = None,
        host: Optional[str] = None,
        redactor: Optional[Redactor] = None,
        stderr_dropped: Callable[[], int] = lambda: 0,
    ):
        self._lock = threading.Lock()
        self._clean = (redactor or Redactor("")).clean  # without a token: escaped and cut only
        self._stderr_dropped = stderr_dropped
        # Looked up at each call, so freezegun's clock is the one read.
        self._clock = clock or (lambda: time.monotonic())
        self._wall = wall or (lambda: time.time())
        self._turns = turns
        self._started = self._clock()
        self._ident = {
            "pid": os.getpid(),
            "version": __version__,
            "contract_release": CONTRACT_RELEASE,
            "session_id": self._id(session_id),
            "engine": engine,
            "host": host,
            "started_at": self._wall(),
            **{name: self._text(path) for name, path in (files or {}).items()},
        }
        self._poll = {"state": "starting", "reason": None, "backoff": 0.0, "retry_at": None}
        self._last_sent: Optional[float] = None
        self._last_answer: Optional[float] = None
        self._polls = self._poll_failures = 0
        self._overrides = {"model": None, "effort": None}
        # Keyed by the id as lich gave it: two long ids cut alike stay two.
        self._in_flight: Dict[str, dict] = {}
        self._counts: Dict[str, Dict[str, int]] = {}
        self._other_kinds_named = 0
        self._recent: "collections.deque[dict]" = collections.deque(maxlen=RECENT)
        self._errors: "collections.deque[dict]" = collections.deque(maxlen=ERRORS)

    # -- the poller ------------------------------------------------------

    def poll_sent(self) -> None:
        with self._lock:
            self._last_sent = self._clock()
            # A retry after failures is still backing off until lich answers.
            if self._poll["state"] == "starting":
                self._poll = {"state": "polling", "reason": None, "backoff": 0.0, "retry_at": None}
            else:
                self._poll["retry_at"] = None

    def poll_answered(self, count: int) -> None:
        with self._lock:
            self._polls += 1
            self._last_answer = self._clock()
            self._poll = {"state": "polling", "reason": None, "backoff": 0.0, "retry_at": None}

    def poll_failed(self, reason: str, backoff: float) -> None:
        reason = self._text(reason)
        now = self._clock()
        with self._lock:
            self._polls += 1
            self._poll_failures += 1
            self._poll = {"state": "backing off", "reason": reason, "backoff": backoff, "retry_at": now + backoff}
            self._note_error(now, f"poll failed: {reason}")

    def poll_stopped(self, reason: str) -> None:
        reason = self._text(reason)
        with self._lock:
            self._poll = {"state": "stopped", "reason": reason, "backoff": 0.0, "retry_at": None}

    # -- commands --------------------------------------------------------

    def received(self, cid: str, kind: str) -> None:
        entry = {"id": self._id(cid), "kind": self._id(kind), "since": self._clock(), "waiting_on": "worker"}
        with self._lock:
            self._in_flight[cid] = entry

    def waiting(self, cid: str, on: str) -> None:
        on = self._text(on)
        with self._lock:
            entry = self._in_flight.get(cid)
            if entry is not None:
                entry["waiting_on"] = on

    def acked(self, cid: str, kind: str, ok: bool, error: Optional[str], sent: Optional[str]) -> None:
        """An ack was sent (`sent` None) or dropped (`sent` says why)."""
        shown, kind = self._id(cid), self._id(kind)
        error, sent = self._text(error), self._text(sent)
        now = self._clock()
        with self._lock:
            entry = self._in_flight.pop(cid, None)
            counts = self._counts.setdefault(self._counted_as(kind), {"ok": 0, "failed": 0, "unsent": 0})
            counts["ok" if ok else "failed"] += 1
            if sent is not None:
                counts["unsent"] += 1
                self._note_error(now, f"ack for {shown} ({kind}) not delivered: {sent}")
            self._recent.append(
                {
                    "id": shown,
                    "kind": kind,
                    "ok": ok,
                    "error": error,
                    "at": now,
                    "took_ms": None if entry is None else round((now - entry["since"]) * 1000, 1),
                    "ack": "sent" if sent is None else "dropped",
                }
            )

    def abandoned(self, cid: str, why: str) -> None:
        what = f"{self._id(cid)} not applied: {self._text(why)}"
        with self._lock:
            self._in_flight.pop(cid, None)
            self._note_error(self._clock(), what)

    def error(self, what: str) -> None:
        what = self._text(what)
        with self._lock:
            self._note_error(self._clock(), what)

    def set_overrides(self, overrides: Overrides) -> None:
        shown = {"model": self._text(overrides.model), "effort": self._text(overrides.effort)}
        with self._lock:
            self._overrides = shown

    # -- the document ----------------------------------------------------

    def snapshot(self) -> dict:
        now = self._clock()
        turn = self._text(self._turns.current)  # the relay's turn id
        with self._lock:
            poll = dict(self._poll)
            retry_at = poll.pop("retry_at")
            poll["retry_in_s"] = None if retry_at is None else round(max(0.0, retry_at - now), 1)
            poll["last_poll_age_s"] = None if self._last_sent is None else round(now - self._last_sent, 1)
            poll["last_answer_age_s"] = None if self._last_answer is None else round(now - self._last_answer, 1)
            poll["polls"], poll["failures"] = self._polls, self._poll_failures
            return {
                "daemon": dict(self._ident, uptime_s=round(now - self._started, 1), stderr_dropped=self._stderr_dropped()),
                "poll": poll,
                "turn": turn,
                "overrides": dict(self._overrides),
                "in_flight": [
                    {"id": e["id"], "kind": e["kind"], "waiting_on": e["waiting_on"], "age_s": round(now - e["since"], 1)}
                    for e in itertools.islice(self._in_flight.values(), SHOWN_IN_FLIGHT)
                ],
                "in_flight_more": max(0, len(self._in_flight) - SHOWN_IN_FLIGHT),
                "counts": {kind: dict(c) for kind, c in self._counts.items()},
                "recent": [_aged(r, now) for r in self._recent],
                "errors": [_aged(e, now) for e in self._errors],
            }

    def _note_error(self, now: float, what: str) -> None:
        self._errors.append({"what": what, "at": now})

    def _counted_as(self, kind: str) -> str:
        """The key of `counts` this kind's acks go under. Under the lock."""
        if kind in self._counts or kind in KINDS:
            return kind
        if self._other_kinds_named < MAX_KINDS - len(KINDS):
            self._other_kinds_named += 1
            return kind
        return OTHER_KINDS

    def _id(self, text: str) -> str:
        return self._clean(text, ID_LIMIT)

    def _text(self, text: Optional[str]) -> Optional[str]:
        return None if text is None else self._clean(text, TEXT_LIMIT)


def _aged(entry: dict, now: float) -> dict:
    out = dict(entry)
    out["age_s"] = round(now - out.pop("at"), 1)
    return out
