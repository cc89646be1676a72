"""Poller: holds the long poll open on lich and hands each command on at once.

It never waits on a command: the ordered ones go onto the worker's queue and
asks to their pool, then the poll goes out again. Its backoff, its lich client
and its stop flag are its own; `stop` may be called from any thread and cuts
a parked poll, whose commands would reach nobody.

Nothing lich sends ends it: an item that fails to be handed on costs that
item alone (acked failed, through the worker, when it has an id), and a poll
whose handling fails counts as a failed poll. It keeps no ids from one poll
to the next: lich hands each command out once, and numbers them from `m1`
again when it restarts, so a memory of old ids would skip new commands.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable, Iterable, Optional

import attrs

from .activity import Activity
from .backoff import Backoff
from .batch import Answer
from .commands import Command, Discarded, kind_named
from .lich import LichClient, LichGone, PollFailed

log = logging.getLogger("lich_control.poller")

HANDOFF_FAILED = "the daemon failed to take it (see its log)"
TWICE = "an id given twice in one answer (its first is applied)"
SHOWN_IDS = 3  # duplicated ids named in the summary line, each cut to ID_SHOWN characters
ID_SHOWN = 40


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
                try:
                    going = self.poll_once()
                except Exception:  # a bug: it costs this poll, never the polling
                    log.exception("handling a poll failed")
                    going = self._failed("the daemon failed to handle lich's answer (see its log)")
                if not going:
                    break
        except Exception:  # even counting a failed poll failed: stop, and let the relay restart the daemon
            log.exception("the poller failed")
            self._activity.poll_stopped("the poller failed (see the log)")
            self._on_crash("the poller failed")
        finally:
            self._client.close()

    def poll_once(self) -> bool:
        """One poll and what follows it; False once polling is over for good."""
        self._activity.poll_sent()
        try:
            answer = self._client.poll()
        except LichGone as exc:
            if self._stop.is_set():
                return False
            log.warning("%s: lich predates the mod-control contract; polling stops for this session", exc)
            self._activity.poll_stopped(str(exc))
            return False
        except PollFailed as exc:
            if self._stop.is_set():
                return False
            return self._failed(str(exc))
        if self._stop.is_set():
            return False  # the daemon is stopping: apply nothing new
        handed = self._dispatch(answer)
        if self._stop.is_set():
            return False
        if answer.broken:  # the items before the break were handed on all the same
            return self._failed(f"lich's answer {answer.ended}")
        self.backoff = self.backoff.succeeded()
        log.debug("lich answered a poll with %d items", answer.read)
        self._activity.poll_answered(answer.read)
        if handed:
            # Hand the interpreter to the worker now: building the next poll
            # holds it for ~0.2 ms, which then falls in the relay's round
            # trip, when the worker waits anyway.
            time.sleep(0)
        return True

    def _failed(self, reason: str) -> bool:
        self.backoff = self.backoff.failed()
        log.info("poll failed: %s; next poll in %g s", reason, self.backoff.delay)
        self._activity.poll_failed(reason, self.backoff.delay)
        return not self._wait(self.backoff.delay)

    def _dispatch(self, answer: Answer) -> bool:
        """Hand each command on, item by item as the answer is read; True if
        any went to the worker. A stop ends it between two items."""
        handed = False
        given = set()
        skipped: "collections.Counter[str]" = collections.Counter()
        twice = []
        for item in answer:
            try:
                parsed = Command.from_json(item)
            except Exception:  # a bug: the item still gets its ack if it has an id
                log.exception("reading an item of lich's answer failed")
                parsed = _unread(item)
            if isinstance(parsed, Discarded):
                skipped[parsed.reason] += 1
            elif parsed.id in given:
                skipped[TWICE] += 1
                twice.append(parsed.id)
            else:
                given.add(parsed.id)
                handed = self._hand_on(parsed) or handed
            if self._stop.is_set():
                break
        self._summarize(skipped + answer.skipped, twice, answer)
        return handed

    def _hand_on(self, command: Command) -> bool:
        """True if it went to the worker. Never raises: a failure costs this command only."""
        try:
            self._activity.received(command.id, command.kind)
            if command.kind == "ask" and command.problem is None:
                self._ask_submit(command)
                return False
            self._worker_submit(command)
            return True
        except Exception:
            log.exception("handing on %s (%s) failed", _shown(command.id), command.kind)
        try:
            self._worker_submit(attrs.evolve(command, problem=HANDOFF_FAILED))
            return True
        except Exception:
            log.exception("%s (%s) could not be queued for its ack either", _shown(command.id), command.kind)
            return False

    def _summarize(self, skipped: "collections.Counter[str]", twice: Iterable[str], answer: Answer) -> None:
        """One line for the skipped items, one for an answer cut short: never one per item."""
        if skipped:
            what = "; ".join(reason if n == 1 else f"{reason} ×{n}" for reason, n in sorted(skipped.items()))
            ids = list(twice)
            if ids:
                what += " [" + ", ".join(_shown(cid) for cid in ids[:SHOWN_IDS]) + (", …]" if len(ids) > SHOWN_IDS else "]")
            total = sum(skipped.values())
            log.warning("skipped %d item%s of lich's answer: %s", total, "" if total == 1 else "s", what)
            self._activity.error(f"skipped {what}")
        if answer.ended is not None and not answer.broken:
            log.warning("lich's answer %s", answer.ended)
            self._activity.error(f"lich's answer {answer.ended}")


def _unread(item: object):
    """What is left of an item parsing failed on: its id, if it has one."""
    cid = item.get("id") if isinstance(item, dict) else None
    if not isinstance(cid, str) or not cid:
        return Discarded("an item the daemon failed to read (see its log)")
    kind = item.get("kind")
    return Command(id=cid, kind=kind_named(kind), problem=HANDOFF_FAILED)


def _shown(cid: str) -> str:
    """An id for a log line: quoted, so a newline in it forges nothing, and cut."""
    return repr(cid[:ID_SHOWN]) + ("…" if len(cid) > ID_SHOWN else "")
