"""The Worker applies lich's commands one at a time, in order; Asks answer
side questions beside it, outside that order.

A prompt or a slash command is acked when the session settles it, and the
next command runs at once. Every other command is acked, its ack awaited,
before the next: lich ends its open turn when an abort's ack lands, so a
late one would end the turn the next prompt opened.
"""
from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Optional, Set, Union

import attrs

from .acks import Ack, Acks
from .bridge import CallResult, Engine, Overrides, Turns
from .commands import UNKNOWN_KIND, Command, ask_prompt, notification_text
from .activity import Activity
from .ordered import OrderedThread

log = logging.getLogger("lich_control.worker")

# turn.abort and overrides.set answer at once in a live session: past this the relay is stuck.
QUICK_TIMEOUT = 10.0
FORK_TIMEOUT = 300.0  # well past the 109 s the seed saw a real fork take
# The ack of a command the daemon stopped before taking up.
NOT_APPLIED = "the daemon stopped before applying it"
# An ask's job only writes the fork's call and returns (a fork in flight
# holds no thread), so a few threads start any number of asks at once.
ASK_THREADS = 4


class Worker:
    """The ordered thread and the overrides are this object's; the
    overrides are only ever replaced whole, so readers need no lock."""

    def __init__(self, engine: Engine, turns: Turns, acks: Acks, activity: Activity, session_id: str):
        self._engine = engine
        self._turns = turns
        self._acks = acks
        self._activity = activity
        self._session_id = session_id
        self._thread = OrderedThread("lich-worker")
        self.overrides = Overrides()

    def submit(self, command: Command) -> None:
        """Queue a command, never blocking the poller; once stopped, it is acked as never applied."""
        self._thread.submit(
            f"{command.id} ({command.kind})",
            lambda: self._take(command),
            lambda why: self._acks.send(not_applied(self._session_id, command, why)),
        )

    def stop(self, timeout: float, why: Optional[str] = None) -> bool:
        """OrderedThread.stop: each command still queued is acked as never applied, with `why`."""
        return self._thread.stop(timeout, why)

    def _take(self, command: Command) -> None:
        result = self._apply(command)
        if isinstance(result, Future):
            self._acks.send_when_done(result, lambda settled: self._ack(command, settled))
        else:
            self._acks.send(self._ack(command, result))

    def _apply(self, command: Command) -> Union[CallResult, "Future[CallResult]"]:
        if command.problem is not None:
            return CallResult.failed(command.problem)
        if command.kind == "prompt":
            if command.notification is None:
                return self._call(command, "prompt.submit", {"text": command.text})
            text = notification_text(command.text, command.notification)
            return self._call(command, "prompt.submit", {"text": text, "asUser": True})
        if command.kind == "command":
            args = {"command": command.name} if command.args is None else {"command": command.name, "args": command.args}
            return self._call(command, "command.run", args)
        if command.kind == "abort":
            turn = self._turns.current
            if turn is None:
                return CallResult.failed("no turn is running")
            return self._call(command, "turn.abort", {"turnId": turn}, QUICK_TIMEOUT).result()
        if command.kind in ("model", "effort"):
            wanted = attrs.evolve(self.overrides, **{command.kind: getattr(command, command.kind)})
            result = self._call(command, "overrides.set", {"model": wanted.model, "effort": wanted.effort}, QUICK_TIMEOUT).result()
            if result.ok:
                self.overrides = wanted
                self._activity.set_overrides(wanted)
            return result
        return CallResult.failed(UNKNOWN_KIND)  # asks never reach the worker; anything else is a bug upstream

    def _call(self, command: Command, method: str, args: dict, timeout: Optional[float] = None) -> "Future[CallResult]":
        """The call's Future, settled by `timeout` at the latest."""
        self._activity.waiting(command.id, "session")
        return self._engine.call(method, args, timeout)

    def _ack(self, command: Command, result: CallResult) -> Ack:
        drop = result.value.get("drop") if command.kind == "prompt" and isinstance(result.value, dict) else None
        if result.ok and isinstance(drop, str):  # a prompt a hook dropped resolves, but started no turn
            return Ack(self._session_id, command.id, command.kind, ok=False, error=drop or "the prompt was dropped without a reason")
        return Ack(self._session_id, command.id, command.kind, ok=result.ok, error=result.error)


class Asks:
    """Side questions, each answered by a fork beside the turn: started the
    moment its poll returns, on the pool, several at once, and acked
    whenever its fork settles (a fork in flight holds no thread). The pool,
    its jobs not yet done and the stop's reason are this object's; the
    lock guards the jobs."""

    def __init__(self, engine: Engine, acks: Acks, activity: Activity, session_id: str):
        self._engine = engine
        self._acks = acks
        self._activity = activity
        self._session_id = session_id
        # Its threads write each fork's call on stdout, off the poller's
        # thread, which a relay slow to read stdout must never hold.
        self._pool = ThreadPoolExecutor(max_workers=ASK_THREADS, thread_name_prefix="lich-ask")
        self._lock = threading.Lock()
        self._jobs: Set["Future[None]"] = set()
        self._why: Optional[str] = None

    def submit(self, command: Command) -> None:
        """Start the ask on the pool, never blocking; once stopped, it is acked as never asked."""
        self._activity.waiting(command.id, "ask thread")
        try:
            job = self._pool.submit(self._start, command)
        except RuntimeError:  # the pool is shut down: the daemon is stopping
            return self._refuse(command)
        with self._lock:
            self._jobs.add(job)
        job.add_done_callback(lambda done: self._done(command, done))

    def stop(self, timeout: float, why: Optional[str] = None) -> bool:
        """Start nothing new: each ask not yet started is acked as never
        asked, with `why`; those being started finish within `timeout`.
        True once none is left."""
        self._why = self._why or why
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            jobs = list(self._jobs)
        return not wait(jobs, timeout).not_done

    def _start(self, command: Command) -> None:
        self._activity.waiting(command.id, "fork")
        fork = self._engine.call("model.fork", {"prompt": ask_prompt(command.question)}, FORK_TIMEOUT)
        self._acks.send_when_done(fork, lambda result: fork_ack(self._session_id, command, result))

    def _done(self, command: Command, job: "Future[None]") -> None:
        """In the thread that ran or cancelled the job: a cancelled ask is
        acked, a failed one logged (a Future keeps its job's exception)."""
        with self._lock:
            self._jobs.discard(job)
        if job.cancelled():
            self._refuse(command)
        elif job.exception() is not None:
            log.error("the ask %s was lost", command.id, exc_info=job.exception())

    def _refuse(self, command: Command) -> None:
        # From the ack thread: a cancel runs this in the thread that stops the daemon.
        self._acks.send_later(lambda: not_applied(self._session_id, command, self._why))


def not_applied(session_id: str, command: Command, why: Optional[str]) -> Ack:
    """The ack of a command the stopping daemon did not take up."""
    error = NOT_APPLIED if why is None else f"{NOT_APPLIED} ({why})"
    return Ack(session_id, command.id, command.kind, ok=False, error=error)


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
