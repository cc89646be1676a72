"""Asks: side questions, answered by a fork beside the turn, outside the order.

An ask starts the moment its poll returns and is acked whenever its fork
answers, or fails once its fork has run past the deadline (the seed saw a
real fork take 109 s). A fork in flight holds no thread: a pool thread
writes its call and returns, and another sends its ack once it settles. So
forks that never answer cost a deadline each, never the asks after them.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Deque, Optional

from .acker import OneAck, send_ack
from .ack import Ack
from .activity import Activity
from .commands import Command, ask_prompt
from .engine import CallResult, Engine
from .lich import LichClient

log = logging.getLogger("lich_control.asks")

POOL_SIZE = 32
FORK_DEADLINE = 300.0  # seconds; well past the 109 s the seed measured


class Asks:
    """The asks in flight. The pool, its threads' lich clients and the
    deadlines are this object's; each ask's `OneAck` is shared by the thread
    that settles its fork and the deadline thread, whichever comes first."""

    def __init__(
        self,
        engine: Engine,
        client_factory: Callable[[], LichClient],
        activity: Activity,
        session_id: str,
        size: int = POOL_SIZE,
        deadline: float = FORK_DEADLINE,
    ):
        self._engine = engine
        self._client_factory = client_factory
        self._activity = activity
        self._session_id = session_id
        self._deadline = deadline
        self._deadlines = Deadlines(deadline)
        self._pool = ThreadPoolExecutor(max_workers=size, thread_name_prefix="lich-ask")
        self._local = threading.local()  # one lich client per pool thread

    def submit(self, command: Command) -> None:
        self._activity.waiting(command.id, "ask pool")
        self._hand(self._start, command, OneAck())

    def stop(self) -> None:
        """Start nothing new; forks that settle from now on are not acked."""
        self._deadlines.stop()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _start(self, command: Command, owed: OneAck) -> None:
        """Pool thread: write the fork's call, and return."""
        try:
            self._activity.waiting(command.id, "fork")
            fork = self._engine.fork(ask_prompt(command.question))
        except Exception:  # a bug, not the session: still one ack for lich
            log.exception("the fork for %s failed unexpectedly", command.id)
            if owed.take():
                self._send(command, CallResult.failed("the daemon could not run the fork (see its log)"))
            return
        due = self._deadlines.add(lambda: self._expired(command, owed, fork))
        fork.add_done_callback(lambda done: self._settled(command, owed, done, due))

    def _settled(self, command: Command, owed: OneAck, done: "Future[CallResult]", due: "Due") -> None:
        """Whatever thread settled the fork (the socket's): it only hands on."""
        due.cancel()
        if done.cancelled():
            return  # the deadline gave it up, and acks it
        if not owed.take():
            log.info("the fork for %s answered after its deadline; ignored", command.id)
            return
        try:
            result = done.result()
        except Exception:
            log.exception("the fork for %s failed unexpectedly", command.id)
            result = CallResult.failed("the daemon could not run the fork (see its log)")
        self._hand(self._send, command, result)

    def _expired(self, command: Command, owed: OneAck, fork: "Future[CallResult]") -> None:
        """The deadline thread: fail the ask, and have the engine forget its call."""
        if not owed.take():
            return
        log.warning("the fork for %s did not answer within %g s", command.id, self._deadline)
        fork.cancel()
        self._hand(self._send, command, CallResult.failed(f"the fork did not answer within {self._deadline:g} s"))

    def _send(self, command: Command, result: CallResult) -> None:
        send_ack(self._client(), self._activity, fork_ack(self._session_id, command, result))

    def _hand(self, job, *args) -> None:
        """Give a job to a pool thread; a stopped pool is the daemon stopping."""
        try:
            future = self._pool.submit(job, *args)
        except RuntimeError:
            log.info("the daemon is stopping: %s is not acked", args[0].id)
            return
        # A Future keeps its job's exception to itself: say it out loud.
        future.add_done_callback(_log_crash)

    def _client(self) -> LichClient:
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = self._client_factory()
        return client


class Due:
    """One deadline: when it falls, what to do then (None once cancelled),
    and whether that still stands."""

    __slots__ = ("at", "action", "cancelled")

    def __init__(self, at: float, action: Callable[[], None]):
        self.at = at
        self.action: Optional[Callable[[], None]] = action
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        # A cancelled deadline waits in line until those before it fall: its
        # action holds the ask and the fork's answer, which go now instead.
        self.action = None


class Deadlines:
    """Deadlines of one length, and the one thread that acts on them.

    Being of one length, they fall due in the order they were set: a deque,
    oldest first. The thread sleeps until the oldest falls due; one set
    meanwhile never wakes it (it falls later), and one cancelled is only
    marked, and dropped when the thread next looks. So the thread wakes once
    per deadline length at most while forks answer, not once per ask. The
    deque and the thread are this object's; the condition guards the deque.
    """

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
        self._seconds = seconds
        self._clock = clock
        self._cond = threading.Condition()
        self._due: Deque[Due] = collections.deque()
        self._thread: Optional[threading.Thread] = None
        self._stopped = False

    def add(self, action: Callable[[], None]) -> Due:
        due = Due(self._clock() + self._seconds, action)
        with self._cond:
            if self._stopped:
                return due
            self._due.append(due)
            if self._thread is None:  # started with the first ask: most sessions never ask
                self._thread = threading.Thread(target=self._run, name="lich-ask-deadlines", daemon=True)
                self._thread.start()
            elif len(self._due) == 1:
                self._cond.notify()  # it sleeps with nothing to wait for
        return due

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._due.clear()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                due = self._next()
            if due is None:
                return
            action = due.action  # read once: a cancel may come meanwhile
            if action is None:
                continue
            try:
                action()
            except Exception:  # one failed deadline must not end the others
                log.exception("acting on a fork's deadline failed")

    def _next(self) -> Optional[Due]:
        """Under the condition: the next deadline once it falls; None once stopped."""
        while not self._stopped:
            while self._due and self._due[0].cancelled:
                self._due.popleft()
            if not self._due:
                self._cond.wait()
                continue
            left = self._due[0].at - self._clock()
            if left <= 0:
                return self._due.popleft()
            self._cond.wait(left)
        return None


def fork_ack(session_id: str, command: Command, result: CallResult) -> Ack:
    """The ack of an ask from what `$.model.fork` resolved to."""
    if not result.ok:
        return Ack(session_id, command.id, "ask", ok=False, error=result.error)
    reply = result.value if isinstance(result.value, dict) else {}
    if reply.get("isAnswered") is True:
        text = reply.get("text")
        return Ack(session_id, command.id, "ask", ok=True, answer=text if isinstance(text, str) else "")
    reason = reply.get("reason")
    if reason == "api-error":
        status = reply.get("status")
        reason = f"api-error {'null' if status is None else status} {reply.get('error', 'unknown')}"
    elif not isinstance(reason, str) or not reason:
        reason = "the fork answered in a shape this daemon does not know"
    return Ack(session_id, command.id, "ask", ok=False, error=reason)


def _log_crash(future) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("an ask failed unexpectedly", exc_info=future.exception())
