"""Activity: what the daemon is doing, for `GET /v1/status` and lich-mod-status.

Every thread reports here (the poller its polls, the worker and the ack
senders their commands); one lock guards it all, held only to copy a few
fields. Times are read from an injected monotonic clock, so tests can move
them; the document gives ages, not clock readings.
"""
from __future__ import annotations

import collections
import os
import threading
import time
from typing import Callable, Dict, Optional

from . import CONTRACT_RELEASE, __version__
from .engine import Overrides, Turns

RECENT = 20
ERRORS = 10


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
    ):
        self._lock = threading.Lock()
        # Looked up at each call, so freezegun's clock is the one read.
        self._clock = clock or (lambda: time.monotonic())
        self._wall = wall or (lambda: time.time())
        self._turns = turns
        self._started = self._clock()
        self._ident = {
            "pid": os.getpid(),
            "version": __version__,
            "contract_release": CONTRACT_RELEASE,
            "session_id": session_id,
            "engine": engine,
            "host": host,
            "started_at": self._wall(),
            **(files or {}),
        }
        self._poll = {"state": "starting", "reason": None, "backoff": 0.0, "retry_at": None}
        self._last_sent: Optional[float] = None
        self._last_answer: Optional[float] = None
        self._polls = self._poll_failures = 0
        self._overrides = Overrides()
        self._in_flight: Dict[str, dict] = {}
        self._counts: Dict[str, Dict[str, int]] = {}
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
        now = self._clock()
        with self._lock:
            self._polls += 1
            self._poll_failures += 1
            self._poll = {"state": "backing off", "reason": reason, "backoff": backoff, "retry_at": now + backoff}
            self._note_error(now, f"poll failed: {reason}")

    def poll_stopped(self, reason: str) -> None:
        with self._lock:
            self._poll = {"state": "stopped", "reason": reason, "backoff": 0.0, "retry_at": None}

    # -- commands --------------------------------------------------------

    def received(self, cid: str, kind: str) -> None:
        with self._lock:
            self._in_flight[cid] = {"kind": kind, "since": self._clock(), "waiting_on": "worker"}

    def waiting(self, cid: str, on: str) -> None:
        with self._lock:
            entry = self._in_flight.get(cid)
            if entry is not None:
                entry["waiting_on"] = on

    def acked(self, cid: str, kind: str, ok: bool, error: Optional[str], sent: Optional[str]) -> None:
        """An ack was sent (`sent` None) or dropped (`sent` says why)."""
        now = self._clock()
        with self._lock:
            entry = self._in_flight.pop(cid, None)
            counts = self._counts.setdefault(kind, {"ok": 0, "failed": 0, "unsent": 0})
            counts["ok" if ok else "failed"] += 1
            if sent is not None:
                counts["unsent"] += 1
                self._note_error(now, f"ack for {cid} ({kind}) not delivered: {sent}")
            self._recent.append(
                {
                    "id": cid,
                    "kind": kind,
                    "ok": ok,
                    "error": error,
                    "at": now,
                    "took_ms": None if entry is None else round((now - entry["since"]) * 1000, 1),
                    "ack": "sent" if sent is None else "dropped",
                }
            )

    def abandoned(self, cid: str, why: str) -> None:
        with self._lock:
            self._in_flight.pop(cid, None)
            self._note_error(self._clock(), f"{cid} not applied: {why}")

    def error(self, what: str) -> None:
        with self._lock:
            self._note_error(self._clock(), what)

    def set_overrides(self, overrides: Overrides) -> None:
        with self._lock:
            self._overrides = overrides

    # -- the document ----------------------------------------------------

    def snapshot(self) -> dict:
        now = self._clock()
        turn = self._turns.current
        with self._lock:
            poll = dict(self._poll)
            retry_at = poll.pop("retry_at")
            poll["retry_in_s"] = None if retry_at is None else round(max(0.0, retry_at - now), 1)
            poll["last_poll_age_s"] = None if self._last_sent is None else round(now - self._last_sent, 1)
            poll["last_answer_age_s"] = None if self._last_answer is None else round(now - self._last_answer, 1)
            poll["polls"], poll["failures"] = self._polls, self._poll_failures
            return {
                "daemon": dict(self._ident, uptime_s=round(now - self._started, 1)),
                "poll": poll,
                "turn": turn,
                "overrides": {"model": self._overrides.model, "effort": self._overrides.effort},
                "in_flight": [
                    {"id": cid, "kind": e["kind"], "waiting_on": e["waiting_on"], "age_s": round(now - e["since"], 1)}
                    for cid, e in self._in_flight.items()
                ],
                "counts": {kind: dict(c) for kind, c in self._counts.items()},
                "recent": [_aged(r, now) for r in self._recent],
                "errors": [_aged(e, now) for e in self._errors],
            }

    def _note_error(self, now: float, what: str) -> None:
        self._errors.append({"what": what, "at": now})


def _aged(entry: dict, now: float) -> dict:
    out = dict(entry)
    out["age_s"] = round(now - out.pop("at"), 1)
    return out
