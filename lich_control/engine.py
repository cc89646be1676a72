"""What the worker needs from a session, whatever runs it.

The relay (through `Bridge`) and the simulated session (`SimEngine`) both
implement `Engine`. Each method starts its call and returns a Future that
always resolves with a `CallResult` and never raises, so the worker reads
one shape whether the call was answered, rejected, or the session is gone.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any, Optional, Protocol

import attrs


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
    name: str

    def submit_prompt(self, text: str, as_user: bool = False) -> "Future[CallResult]": ...

    def abort_turn(self, turn_id: str) -> "Future[CallResult]": ...

    def run_command(self, name: str, args: Optional[str]) -> "Future[CallResult]": ...

    def fork(self, prompt: str) -> "Future[CallResult]": ...

    def set_overrides(self, overrides: Overrides) -> "Future[CallResult]": ...

    def close(self, reason: str) -> None:
        """Fail every call still waiting with `reason`, and any made later."""


class Turns:
    """The main loop's running turn, as turn.start and turn.complete tell it.

    Written by whichever thread delivers the session's events, read by the
    worker when an abort comes; the lock keeps the pair consistent.
    """

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


def resolved(result: CallResult) -> "Future[CallResult]":
    """A Future settled already: a call answered or refused before it went anywhere."""
    future: "Future[CallResult]" = Future()
    future.set_result(result)
    return future
