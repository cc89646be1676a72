"""Poller: holds the long poll open on lich and hands each command on at once,
the ordered ones to the worker and asks to their pool, never waiting on one.

Its backoff, its lich client and its stop flag are its own; `stop` may be
called from any thread and cuts a parked poll. An answer that is not a sound
JSON array is one failed poll. It keeps no ids between polls: lich numbers
them from `m1` again when it restarts, so old ids would skip new commands.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, List, Optional

import attrs

from .commands import Command
from .json_reader import TooMany, loads
from .lich import LichClient, LichGone, PollFailed
from .activity import Activity

log = logging.getLogger("lich_control.poller")

@attrs.frozen
class Backoff:
    """How long to wait before the next poll: 0 while lich answers, 1 s
    after the first failure, doubling, never over 10 s."""

    FIRST = 1.0
    MOST = 10.0

    delay: float = 0.0

    def failed(self) -> "Backoff":
        return Backoff(min(max(self.delay * 2, self.FIRST), self.MOST))


def read_answer(body: bytes) -> List[object]:
    """The items of a 200's body; PollFailed if it is not a sound JSON array."""
    try:
        items = loads(body)
    except (ValueError, RecursionError) as exc:
        log.debug("lich's answer was not read", exc_info=True)
        if isinstance(exc, TooMany):
            why = f"was not read: {exc}"
        elif isinstance(exc, RecursionError):
            why = "is nested deeper than Python reads"
        else:  # not JSON, or not in a Unicode encoding
            why = "is not JSON"
        raise PollFailed(f"lich's answer {why}") from exc
    if not isinstance(items, list):
        raise PollFailed("lich's answer is JSON but not an array")
    return items


class Poller:
    def __init__(
        self,
        client: LichClient,
        submit: Callable[[Command], None],
        submit_ask: Callable[[Command], None],
        activity: Activity,
        on_crash: Callable[[str], None] = lambda reason: None,
    ):
        self._client = client
        self._submit = submit
        self._submit_ask = submit_ask
        self._activity = activity
        self._on_crash = on_crash
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lich-poller", daemon=True)
        self.backoff = Backoff()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> bool:
        """Stop polling, cutting a parked poll; True once the thread has ended."""
        self._stop.set()
        self._client.abandon()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        delay: Optional[float] = 0.0
        try:
            # Waiting out a backoff is a wait on the stop flag: a stop ends it at once.
            while delay is not None and not self._stop.wait(delay):
                try:
                    delay = self.poll_once()
                except Exception:  # a bug: it costs this poll, never the polling
                    log.exception("handling a poll failed")
                    delay = self._failed("the daemon failed to handle lich's answer (see its log)")
        finally:
            self._client.close()
            if delay is not None and not self._stop.is_set():
                # Only a bug in counting a failed poll ends the loop unasked: the relay restarts the daemon.
                self._on_crash("the poller failed")

    def poll_once(self) -> Optional[float]:
        """One poll and the handing on of its commands: the seconds to wait
        before the next poll, or None once polling is over."""
        self._activity.poll_sent()
        try:
            items = read_answer(self._client.poll())
        except LichGone as exc:
            if not self._stop.is_set():
                log.warning("%s: lich predates the mod-control contract; polling stops for this session", exc)
                self._activity.poll_stopped(str(exc))
            return None
        except PollFailed as exc:
            return None if self._stop.is_set() else self._failed(str(exc))
        submitted = self._submit_all(items)
        if self._stop.is_set():
            return None
        self.backoff = Backoff()
        log.debug("lich answered a poll with %d items", len(items))
        self._activity.poll_answered()
        if submitted:
            time.sleep(0)  # yield to the worker before building the next poll (docs/performance.md)
        return 0.0

    def _failed(self, reason: str) -> float:
        self.backoff = self.backoff.failed()
        log.info("poll failed: %s; next poll in %g s", reason, self.backoff.delay)
        self._activity.poll_failed(reason, self.backoff.delay)
        return self.backoff.delay

    def _submit_all(self, items: List[object]) -> bool:
        """Hand every command on, in lich's order, a stop notwithstanding:
        a stopped queue acks what it meets as never applied, so each gets its
        ack. True if any went to the worker. The number is bounded by
        json_reader's bound on values; what is skipped is said in one line."""
        submitted = False
        unusable = 0
        for item in items:
            command = Command.from_json(item)
            if command is None:
                unusable += 1
                continue
            self._activity.received(command.id, command.kind)
            if command.kind == "ask" and command.problem is None:
                self._submit_ask(command)
            else:
                self._submit(command)  # a bad ask too: its refusal is acked in order
                submitted = True
        if unusable:
            what = f"{unusable:,} not an object with an id"
            log.warning("skipped items of lich's answer: %s", what)
            self._activity.error(f"skipped items of lich's answer: {what}")
        return submitted
