"""Poller: holds the long poll open on lich and hands each command on at once.

It never waits on a command: the ordered ones go onto the worker's queue and
asks to their pool, then the poll goes out again. Its backoff, its lich client
and its stop flag are its own; `stop` may be called from any thread and cuts
a parked poll, whose commands would reach nobody.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable, List, Optional

from .status import Activity
from .backoff import Backoff
from .commands import Command, Discarded, parse_batch
from .lich import LichClient, LichGone, PollFailed

log = logging.getLogger("lich_control.poller")

# lich delivers at most once; this guards the session against one that does not.
SEEN_IDS = 4096


class Poller:
    def __init__(
        self,
        client: LichClient,
        worker_submit: Callable[[Command], None],
        ask_submit: Callable[[Command], None],
        activity: Activity,
        on_crash: Callable[[str], None] = lambda reason: None,
        wait: Optional[Callable[[float], bool]] = None,
    ):
        self._client = client
        self._worker_submit = worker_submit
        self._ask_submit = ask_submit
        self._activity = activity
        self._on_crash = on_crash
        self._seen = _RecentIds(SEEN_IDS)
        self._stop = threading.Event()
        # Waiting out a backoff is a wait on the stop flag, so a stop ends it
        # at once; tests hand in their own to read the schedule without waiting.
        self._wait = wait or self._stop.wait
        self._thread = threading.Thread(target=self._run, name="lich-poller", daemon=True)
        self.backoff = Backoff()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 1.0) -> bool:
        self._stop.set()
        self._client.abandon()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def stopped(self) -> bool:
        return not self._thread.is_alive()

    def join(self, timeout: Optional[float] = None) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if not self.poll_once():
                    break
        except Exception:  # a bug: say so, and let the daemon stop
            log.exception("the poller failed")
            self._activity.poll_stopped("the poller failed (see the log)")
            self._on_crash("the poller failed")
        finally:
            self._client.close()

    def poll_once(self) -> bool:
        """One poll and what follows it; False once polling is over for good."""
        self._activity.poll_sent()
        try:
            items = self._client.poll()
        except LichGone as exc:
            if self._stop.is_set():
                return False
            log.warning("%s: lich predates the mod-control contract; polling stops for this session", exc)
            self._activity.poll_stopped(str(exc))
            return False
        except PollFailed as exc:
            if self._stop.is_set():
                return False
            self.backoff = self.backoff.failed()
            log.info("poll failed: %s; next poll in %g s", exc, self.backoff.delay)
            self._activity.poll_failed(str(exc), self.backoff.delay)
            return not self._wait(self.backoff.delay)
        if self._stop.is_set():
            return False  # the daemon is stopping: apply nothing new
        self.backoff = self.backoff.succeeded()
        log.debug("lich answered a poll with %d items", len(items))
        self._activity.poll_answered(len(items))
        if self._dispatch(items):
            # Hand the interpreter to the worker now: building the next poll
            # holds it for ~0.2 ms, which then falls in the relay's round
            # trip, when the worker waits anyway.
            time.sleep(0)
        return True

    def _dispatch(self, items: List) -> bool:
        """Hand each command on; True if any went to the worker."""
        handed = False
        for parsed in parse_batch(items):
            if isinstance(parsed, Discarded):
                log.warning("lich sent %s; it cannot be acked and is skipped", parsed.reason)
                self._activity.error(f"skipped {parsed.reason}")
                continue
            if not self._seen.add(parsed.id):
                log.warning("lich sent %s again; it was applied once and is skipped", parsed.id)
                self._activity.error(f"skipped {parsed.id}: delivered twice")
                continue
            self._activity.received(parsed.id, parsed.kind)
            if parsed.kind == "ask" and parsed.problem is None:
                self._ask_submit(parsed)
            else:
                self._worker_submit(parsed)
                handed = True
        return handed


class _RecentIds:
    """The last `size` command ids, to apply none twice. Poller thread only."""

    def __init__(self, size: int):
        self._size = size
        self._order: "collections.deque[str]" = collections.deque()
        self._set = set()

    def add(self, cid: str) -> bool:
        if cid in self._set:
            return False
        self._order.append(cid)
        self._set.add(cid)
        if len(self._order) > self._size:
            self._set.discard(self._order.popleft())
        return True
