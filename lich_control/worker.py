"""The Worker applies lich's commands one at a time, in the order they
arrived; Asks answer side questions beside it, outside that order.

A prompt or a slash command is started in its place and acked when the
session settles it; the next command runs at once. Every other command is
acked, and its ack awaited, before the next one: lich ends the turn it has
open when an abort's ack lands, so a late ack would end the turn the next
prompt opened. `Worker._apply` returns a command's result, or the Future of
the call it started, and never sends: `Acks` sends, from one place.
"""
from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import Optional, Union

import attrs

from .acks import Ack, Acks
from .bridge import CallResult, Engine, Overrides, Turns
from .commands import UNKNOWN_KIND, Command, ask_prompt, notification_text
from .activity import Activity
from .ordered import OrderedThread

log = logging.getLogger("lich_control.worker")

# turn.abort and overrides.set answer at once in a live session; past this
# the relay is stuck, and lich hears so instead of waiting on nothing.
QUICK_TIMEOUT = 10.0
FORK_TIMEOUT = 300.0  # well past the 109 s the seed saw a real fork take
# The ack of a command the daemon stopped before taking up: lich hears at
# once that it never ran, instead of waiting out its own wait.
NOT_APPLIED = "the daemon stopped before applying it"


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
        self._stopped = Stopped(acks, session_id)
        self.overrides = Overrides()

    def submit(self, command: Command) -> None:
        """Queue a command; never blocks, so the poller never waits here."""
        if not self._thread.submit(f"{command.id} ({command.kind})", self._take, command):
            self._stopped.ack(command)

    def stop(self, timeout: float, why: Optional[str] = None) -> bool:
        """OrderedThread.stop: each command still queued is acked as not
        applied, with `why` (the first given)."""
        self._stopped.why = self._stopped.why or why
        return self._thread.stop(timeout)

    def _take(self, command: Command) -> None:
        if self._thread.stopping:
            return self._stopped.ack(command)
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
        """The call's Future, settled by its deadline at the latest: an
        awaited one's `result()` is bounded by `timeout`."""
        self._activity.waiting(command.id, "session")
        return self._engine.call(method, args, timeout)

    def _ack(self, command: Command, result: CallResult) -> Ack:
        drop = result.value.get("drop") if command.kind == "prompt" and isinstance(result.value, dict) else None
        if result.ok and isinstance(drop, str):  # a prompt a hook dropped resolves, but started no turn
            return Ack(self._session_id, command.id, command.kind, ok=False, error=drop or "the prompt was dropped without a reason")
        return Ack(self._session_id, command.id, command.kind, ok=result.ok, error=result.error)


class Asks:
    """Side questions, each answered by a fork beside the turn.

    An ask starts the moment its poll returns, several at once, and is acked
    whenever its fork answers, or failed at its deadline; a fork in flight
    holds no thread, its ack goes from `Acks` once it settles. The ordered
    thread that writes the fork calls is this object's.
    """

    def __init__(self, engine: Engine, acks: Acks, activity: Activity, session_id: str):
        self._engine = engine
        self._acks = acks
        self._activity = activity
        self._session_id = session_id
        # It writes each fork's call on stdout, off the poller's thread,
        # which a relay slow to read stdout must never hold.
        self._thread = OrderedThread("lich-ask")
        self._stopped = Stopped(acks, session_id)

    def submit(self, command: Command) -> None:
        self._activity.waiting(command.id, "ask thread")
        if not self._thread.submit(f"the ask {command.id}", self._start, command):
            self._stopped.ack(command)

    def stop(self, timeout: float, why: Optional[str] = None) -> bool:
        """OrderedThread.stop: each ask still queued is acked as not asked,
        with `why` (the first given)."""
        self._stopped.why = self._stopped.why or why
        return self._thread.stop(timeout)

    def _start(self, command: Command) -> None:
        if self._thread.stopping:
            return self._stopped.ack(command)
        self._activity.waiting(command.id, "fork")
        fork = self._engine.call("model.fork", {"prompt": ask_prompt(command.question)}, FORK_TIMEOUT)
        self._acks.send_when_done(fork, lambda result: fork_ack(self._session_id, command, result))


@attrs.define
class Stopped:
    """The acks of the commands a stopping daemon will not take up, sent
    from the thread that finds one: queued, or refused by a stopped queue."""

    _acks: Acks
    _session_id: str
    why: Optional[str] = None  # set once, before the queue is stopped

    def ack(self, command: Command) -> None:
        error = NOT_APPLIED if self.why is None else f"{NOT_APPLIED} ({self.why})"
        self._acks.send(Ack(self._session_id, command.id, command.kind, ok=False, error=error))


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
