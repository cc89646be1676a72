"""Activity: what the daemon is doing, for `GET /v1/status` (docs/status.md).

Every thread reports here; one lock guards it all, held only to copy a few
fields. Every string from outside is cleaned once, as it enters, by
logs.Redactor, so what leaves is shown as it is, by lich-mod-status too.
"""
from __future__ import annotations

import collections
import itertools
import os
import threading
import time
from typing import Callable, Dict, Optional

from . import CONTRACT_RELEASE, __version__
from .bridge import Overrides, Turns
from .logs import Redactor

RECENT = 20
ERRORS = 10
# A burst of asks may keep a thousand in flight: `in_flight_more` counts past the oldest 50.
SHOWN_IN_FLIGHT = 50
ID_LIMIT = 200  # characters of an id or a kind shown
TEXT_LIMIT = 400  # characters of an error or a reason shown


class Activity:
    def __init__(
        self,
        session_id: str,
        engine: str,
        turns: Turns,
        files: Optional[Dict[str, str]] = None,
        host: Optional[str] = None,
        redactor: Optional[Redactor] = None,
        stderr_dropped: Callable[[], int] = lambda: 0,
    ):
        self._lock = threading.Lock()
        self._redactor = redactor or Redactor("")  # without a token: escaped and cut only
        self._stderr_dropped = stderr_dropped
        self._turns = turns
        self._started = time.monotonic()
        self._ident = {
            "pid": os.getpid(),
            "version": __version__,
            "contract_release": CONTRACT_RELEASE,
            "session_id": self._clean(session_id, ID_LIMIT),
            "engine": engine,
            "host": host,
            "started_at": time.time(),
            **{name: self._clean(path) for name, path in (files or {}).items()},
        }
        self._poll = _poll_state("starting")
        self._last_sent: Optional[float] = None
        self._last_answer: Optional[float] = None
        self._polls = self._poll_failures = 0
        self._overrides = {"model": None, "effort": None}
        self._in_flight: Dict[str, dict] = {}  # by the id as lich gave it
        self._counts: Dict[str, Dict[str, int]] = {}
        self._recent: "collections.deque[dict]" = collections.deque(maxlen=RECENT)
        self._errors: "collections.deque[dict]" = collections.deque(maxlen=ERRORS)

    def poll_sent(self) -> None:
        with self._lock:
            self._last_sent = time.monotonic()
            # A retry after failures is still backing off until lich answers.
            if self._poll["state"] == "starting":
                self._poll = _poll_state("polling")
            else:
                self._poll["retry_at"] = None

    def poll_answered(self) -> None:
        with self._lock:
            self._polls += 1
            self._last_answer = time.monotonic()
            self._poll = _poll_state("polling")

    def poll_failed(self, reason: str, backoff: float) -> None:
        reason = self._clean(reason)
        now = time.monotonic()
        with self._lock:
            self._polls += 1
            self._poll_failures += 1
            self._poll = _poll_state("backing off", reason, backoff, retry_at=now + backoff)
            self._note_error(now, f"poll failed: {reason}")

    def poll_stopped(self, reason: str) -> None:
        reason = self._clean(reason)
        with self._lock:
            self._poll = _poll_state("stopped", reason)

    def received(self, cid: str, kind: str) -> None:
        entry = {"id": self._clean(cid, ID_LIMIT), "kind": self._clean(kind, ID_LIMIT), "at": time.monotonic(), "waiting_on": "worker"}
        with self._lock:
            self._in_flight[cid] = entry

    def waiting(self, cid: str, on: str) -> None:
        on = self._clean(on)
        with self._lock:
            entry = self._in_flight.get(cid)
            if entry is not None:
                entry["waiting_on"] = on

    def acked(self, cid: str, kind: str, ok: bool, error: Optional[str], sent: Optional[str]) -> None:
        """An ack was sent (`sent` None) or dropped (`sent` says why)."""
        shown, kind = self._clean(cid, ID_LIMIT), self._clean(kind, ID_LIMIT)
        error, sent = self._clean(error), self._clean(sent)
        now = time.monotonic()
        with self._lock:
            entry = self._in_flight.pop(cid, None)
            counts = self._counts.setdefault(kind, {"ok": 0, "failed": 0, "unsent": 0})
            counts["ok" if ok else "failed"] += 1
            if sent is not None:
                counts["unsent"] += 1
                self._note_error(now, f"ack for {shown} ({kind}) not delivered: {sent}")
            took_ms = None if entry is None else round((now - entry["at"]) * 1000, 1)
            ack = "sent" if sent is None else "dropped"
            self._recent.append({"id": shown, "kind": kind, "ok": ok, "error": error, "at": now, "took_ms": took_ms, "ack": ack})

    def error(self, what: str) -> None:
        what = self._clean(what)
        with self._lock:
            self._note_error(time.monotonic(), what)

    def set_overrides(self, overrides: Overrides) -> None:
        shown = {"model": self._clean(overrides.model), "effort": self._clean(overrides.effort)}
        with self._lock:
            self._overrides = shown

    def snapshot(self) -> dict:
        now = time.monotonic()
        turn = self._clean(self._turns.current)  # the relay's turn id
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
                "in_flight": [_aged(e, now) for e in itertools.islice(self._in_flight.values(), SHOWN_IN_FLIGHT)],
                "in_flight_more": max(0, len(self._in_flight) - SHOWN_IN_FLIGHT),
                "counts": {kind: dict(c) for kind, c in self._counts.items()},
                "recent": [_aged(r, now) for r in self._recent],
                "errors": [_aged(e, now) for e in self._errors],
            }

    def _note_error(self, now: float, what: str) -> None:
        self._errors.append({"what": what, "at": now})

    def _clean(self, text: Optional[str], limit: int = TEXT_LIMIT) -> Optional[str]:
        return None if text is None else self._redactor.clean(text, limit)


def _poll_state(state: str, reason: Optional[str] = None, backoff: float = 0.0, retry_at: Optional[float] = None) -> dict:
    return {"state": state, "reason": reason, "backoff": backoff, "retry_at": retry_at}


def _aged(entry: dict, now: float) -> dict:
    out = dict(entry)
    out["age_s"] = round(now - out.pop("at"), 1)
    return out
