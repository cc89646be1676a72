"""Bridge: the session as the relay in Claude Code reaches it (bridge.md, protocol 1).

Calls go out as JSON lines on stdout; results and events come back over the
daemon's Unix socket (see `unix_socket`). The bridge matches results to calls
and nothing more: what a result means for lich is the worker's business.
Any thread may call. One lock guards the pending calls, held only to touch
them; another the stdout stream, held while a line is written: a relay
that stops reading stdout blocks that writer, never `close` or a result.
A caller that gives up on a call cancels its Future, and the call is
forgotten: its late result, if one comes, is ignored.
"""
from __future__ import annotations

import itertools
import json
import logging
import os
import threading
from concurrent.futures import Future, InvalidStateError
from typing import Any, BinaryIO, Callable, Dict, Optional

from . import __version__
from .engine import CallResult, Overrides, Turns, resolved

log = logging.getLogger("lich_control.bridge")

PROTOCOL = 1


class BadMessage(Exception):
    """A relay message that is not of bridge.md's shape: answered 400 with this text."""


class Bridge:
    name = "relay"

    def __init__(self, out: BinaryIO, turns: Turns, on_broken: Callable[[str], None]):
        self._out = out
        self._turns = turns
        self._on_broken = on_broken
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._pending: Dict[str, Future] = {}
        self._closed: Optional[str] = None

    # -- daemon -> relay -------------------------------------------------

    def hello(self, socket_path: str) -> None:
        self._write({"op": "hello", "protocol": PROTOCOL, "pid": os.getpid(), "socket": socket_path, "version": __version__})

    def submit_prompt(self, text: str, as_user: bool = False) -> "Future[CallResult]":
        return self.call("prompt.submit", {"text": text, "asUser": True} if as_user else {"text": text})

    def abort_turn(self, turn_id: str) -> "Future[CallResult]":
        return self.call("turn.abort", {"turnId": turn_id})

    def run_command(self, name: str, args: Optional[str]) -> "Future[CallResult]":
        return self.call("command.run", {"command": name} if args is None else {"command": name, "args": args})

    def fork(self, prompt: str) -> "Future[CallResult]":
        return self.call("model.fork", {"prompt": prompt})

    def set_overrides(self, overrides: Overrides) -> "Future[CallResult]":
        return self.call("overrides.set", {"model": overrides.model, "effort": overrides.effort})

    def call(self, method: str, args: dict) -> "Future[CallResult]":
        with self._lock:
            if self._closed is not None:
                return resolved(CallResult.failed(self._closed))
            call_id = f"c{next(self._ids)}"
            future: "Future[CallResult]" = Future()
            self._pending[call_id] = future
        future.add_done_callback(lambda done: self._given_up(call_id, done))
        self._write({"op": "call", "id": call_id, "method": method, "args": args})
        log.debug("call %s: %s", call_id, method)
        return future

    def close(self, reason: str) -> None:
        """Fail every call still waiting; later calls fail at once with `reason`."""
        with self._lock:
            if self._closed is None:
                self._closed = reason
            pending, self._pending = self._pending, {}
        for future in pending.values():
            _settle(future, CallResult.failed(reason))

    def _given_up(self, call_id: str, done: Future) -> None:
        if done.cancelled():
            with self._lock:
                self._pending.pop(call_id, None)

    def _write(self, message: dict) -> None:
        with self._write_lock:
            ok = self._write_locked(message)
        if not ok:
            self.close("the relay is gone (its end of the pipe closed)")

    def _write_locked(self, message: dict) -> bool:
        line = json.dumps(message, ensure_ascii=False, separators=(",", ":")) + "\n"
        try:
            self._out.write(line.encode("utf-8", "backslashreplace"))
            self._out.flush()
            return True
        except (OSError, ValueError) as exc:  # ValueError: the stream was closed
            log.warning("writing to stdout failed (%s): the relay is gone", type(exc).__name__)
            self._on_broken("writing to stdout failed")
            return False

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
        with self._lock:
            future = self._pending.pop(call_id, None)
        if future is None or not _settle(future, outcome):
            log.info("a result for %s, which is no call waiting here; ignored", call_id[:40])

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
            log.info("an event this daemon does not know (%s); ignored", name[:40])


def _settle(future: Future, result: CallResult) -> bool:
    """Settle a call unless its caller gave it up meanwhile (cancelled it)."""
    try:
        future.set_result(result)
    except InvalidStateError:
        return False
    return True
