"""The session the worker drives, and the relay as that session (bridge.md, protocol 1).

An engine's `call` answers with a Future that always settles with a
`CallResult`, never an exception: the session's answer, a failure at the
deadline, or `close`'s reason. `Bridge` is the relay as that engine: calls
go out as JSON lines on stdout, results and events come back on the
daemon's socket (`bridge_server`).
"""
from __future__ import annotations

import heapq
import json
import logging
import os
import threading
import time
from concurrent.futures import Future
from typing import Any, BinaryIO, Callable, Dict, List, Optional, Protocol, Tuple

import attrs

from . import __version__

log = logging.getLogger("lich_control.bridge")

PROTOCOL = 1


@attrs.frozen
class CallResult:
    ok: bool
    value: Any = None
    error: Optional[str] = None

    @classmethod
    def answered(cls, value: Any = None) -> "CallResult":
        return cls(ok=True, value=value)

    @classmethod
    def failed(cls, error: str) -> "CallResult":
        return cls(ok=False, error=error)


@attrs.frozen
class Overrides:
    """The model and effort every model request is sent with; None = the session's own."""

    model: Optional[str] = None
    effort: Optional[str] = None


class Engine(Protocol):
    def call(self, method: str, args: dict, timeout: Optional[float]) -> "Future[CallResult]": ...

    def close(self, reason: str) -> None:
        """Fail every call still waiting with `reason`, and any made later."""


class Turns:
    """The main loop's running turn, as turn.start and turn.complete tell
    it: written by the socket's threads, read by the worker for an abort."""

    def __init__(self):
        self._lock = threading.Lock()
        self._current: Optional[str] = None

    @property
    def current(self) -> Optional[str]:
        with self._lock:
            return self._current

    def started(self, turn_id: str) -> None:
        with self._lock:
            self._current = turn_id

    def completed(self, turn_id: str) -> None:
        # A subagent's turn ends too; only the recorded turn's end clears it.
        with self._lock:
            if self._current == turn_id:
                self._current = None


class PendingCalls:
    """The calls waiting for an answer, each settled exactly once: the one
    guard against a second ack. Whichever comes first (the answer, the
    deadline, `close`) takes the call out of the table and settles it;
    whatever comes later finds nothing.

    One thread keeps every deadline, started with the first, asleep until
    the earliest falls; it is woken only when that one changes. The table,
    the deadlines and the thread are this object's; the condition guards them.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._cond = threading.Condition()
        self._count = 0
        self._pending: Dict[str, Future] = {}
        self._deadlines: List[Tuple[float, int, str, str]] = []  # a heap of (at, n, call id, error)
        self._thread: Optional[threading.Thread] = None
        self._closed: Optional[str] = None

    def add(self, method: str, timeout: Optional[float]) -> Tuple[str, "Future[CallResult]"]:
        """A new call's id and Future; settled already, failed, once closed."""
        future: "Future[CallResult]" = Future()
        with self._cond:
            if self._closed is not None:
                future.set_result(CallResult.failed(self._closed))
                return "", future
            self._count += 1
            call_id = f"c{self._count}"
            self._pending[call_id] = future
            if timeout is not None:
                error = f"{method} did not answer within {timeout:g} s"
                heapq.heappush(self._deadlines, (self._clock() + timeout, self._count, call_id, error))
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="lich-call-deadlines", daemon=True)
                    self._thread.start()
                elif self._deadlines[0][2] == call_id:
                    self._cond.notify()  # it sleeps until a later one
        return call_id, future

    def settle(self, call_id: str, result: CallResult) -> bool:
        """Settle the call, in this thread (its done-callbacks run here);
        False if it was settled already, or never was."""
        with self._cond:
            future = self._pending.pop(call_id, None)
            if future is None:
                return False
            if self._deadlines and self._deadlines[0][2] == call_id:
                self._cond.notify()
            # Under the condition, so that `close` returns only once a settle
            # under way has run its callbacks (they queue the call's ack):
            # the stop that follows it then finds every ack queued.
            future.set_result(result)
        return True

    def close(self, reason: str) -> None:
        """Fail every call still pending; once it returns, no call settles again."""
        with self._cond:
            if self._closed is None:
                self._closed = reason
            pending, self._pending = self._pending, {}
            self._deadlines.clear()
            self._cond.notify()
            for future in pending.values():
                future.set_result(CallResult.failed(reason))

    def _run(self) -> None:
        while True:
            with self._cond:
                due = self._next_due()
            if due is None:
                return  # closed
            call_id, error = due
            # No catch-all: a Future logs what its done-callbacks raise.
            if self.settle(call_id, CallResult.failed(error)):
                log.warning("%s: %s", call_id, error)

    def _next_due(self) -> Optional[Tuple[str, str]]:
        """Under the condition: the next call past its deadline; None once closed."""
        while self._closed is None:
            while self._deadlines and self._deadlines[0][2] not in self._pending:
                heapq.heappop(self._deadlines)  # answered in time
            if not self._deadlines:
                self._cond.wait()
                continue
            at, _, call_id, error = self._deadlines[0]
            left = at - self._clock()
            if left <= 0:
                heapq.heappop(self._deadlines)
                return call_id, error
            self._cond.wait(left)
        return None


class BadMessage(Exception):
    """A relay message that is not of bridge.md's shape: answered 400 with this text."""


class Bridge:
    """The relay as the engine; any thread may call. A lock guards stdout
    alone: a relay that stops reading it blocks the writer, never `close`,
    a result, or a call's deadline."""

    def __init__(self, out: BinaryIO, turns: Turns, on_broken: Callable[[str], None]):
        self._out = out
        self._turns = turns
        self._on_broken = on_broken
        self._write_lock = threading.Lock()
        self._calls = PendingCalls()

    # -- daemon -> relay -------------------------------------------------

    def hello(self, address: dict) -> None:
        """`address`: {"socket": path}, or on Windows {"port": n, "secret": s} (bridge_server's listeners)."""
        self._write({"op": "hello", "protocol": PROTOCOL, "pid": os.getpid(), **address, "version": __version__})

    def call(self, method: str, args: dict, timeout: Optional[float]) -> "Future[CallResult]":
        call_id, future = self._calls.add(method, timeout)
        if not future.done():
            self._write({"op": "call", "id": call_id, "method": method, "args": args})
            log.debug("call %s: %s", call_id, method)
        return future

    def close(self, reason: str) -> None:
        self._calls.close(reason)

    def _write(self, message: dict) -> None:
        line = json.dumps(message, ensure_ascii=False, separators=(",", ":")) + "\n"
        try:
            with self._write_lock:
                self._out.write(line.encode("utf-8", "backslashreplace"))
                self._out.flush()
        except (OSError, ValueError) as exc:  # ValueError: the stream was closed
            log.warning("writing to stdout failed (%s): the relay is gone", type(exc).__name__)
            self._on_broken("writing to stdout failed")
            self.close("the relay is gone (its end of the pipe closed)")

    # -- relay -> daemon -------------------------------------------------

    def result(self, doc: Any) -> None:
        """POST /v1/result: settle the call it names."""
        if not isinstance(doc, dict):
            raise BadMessage("the body must be a JSON object")
        call_id, ok = doc.get("id"), doc.get("ok")
        if not isinstance(call_id, str):
            raise BadMessage("id must be a string")
        if not isinstance(ok, bool):
            raise BadMessage("ok must be a boolean")
        if ok:
            outcome = CallResult.answered(doc.get("value"))
        else:
            error = doc.get("error")
            if not isinstance(error, str):
                raise BadMessage("error must be a string when ok is false")
            outcome = CallResult.failed(error or "the session rejected the call without a message")
        if not self._calls.settle(call_id, outcome):
            log.info("a result for %s, which is no call waiting here; ignored", call_id)

    def event(self, doc: Any) -> None:
        """POST /v1/event: a turn started or completed."""
        if not isinstance(doc, dict):
            raise BadMessage("the body must be a JSON object")
        name, turn_id = doc.get("event"), doc.get("turnId")
        if not isinstance(name, str):
            raise BadMessage("event must be a string")
        if name == "turn.start" or name == "turn.complete":
            if not isinstance(turn_id, str) or not turn_id:
                raise BadMessage("turnId must be a non-empty string")
            (self._turns.started if name == "turn.start" else self._turns.completed)(turn_id)
            log.debug("%s %s", name, turn_id)
        else:
            log.info("an event this daemon does not know (%s); ignored", name)
