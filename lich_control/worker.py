"""Worker: applies lich's commands one at a time, in the order they arrived.

A prompt or a slash command is started in its place and acked later, when
the session settles it (through the Acker); the next command runs at once.
Every other command's ack is sent here, and awaited, before the next one:
lich ends the turn it has open when an abort's ack lands, so a late ack
would end the turn the next prompt opened.

The queue, the thread, its lich client, the command in hand's `OneAck` and
the overrides are this object's; the overrides are only ever replaced
whole, so readers need no lock. Nothing a command does ends the thread: a
failure costs that command (acked failed, unless its ack went out or was
promised already), is logged, and the next command runs.
"""
from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future, TimeoutError as FutureTimeout
from typing import Callable, Optional

import attrs

from .acker import Acker, OneAck, send_ack
from .ack import Ack
from .activity import Activity
from .commands import Command, notification_text
from .engine import CallResult, Engine, Overrides, Turns
from .lich import LichClient

log = logging.getLogger("lich_control.worker")

# turn.abort and overrides.set answer at once in a live session; past this
# the relay is stuck, and lich hears so instead of waiting on nothing.
QUICK_CALL_TIMEOUT = 10.0
NO_TURN = "no turn is running"

_STOP = object()


class Worker:
    def __init__(
        self,
        engine: Engine,
        turns: Turns,
        acker: Acker,
        client_factory: Callable[[], LichClient],
        activity: Activity,
        session_id: str,
        quick_timeout: float = QUICK_CALL_TIMEOUT,
    ):
        self._engine = engine
        self._turns = turns
        self._acker = acker
        self._client_factory = client_factory
        self._activity = activity
        self._session_id = session_id
        self._quick_timeout = quick_timeout
        self._queue: "queue.Queue" = queue.Queue()  # unbounded: put never blocks
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lich-worker", daemon=True)
        self._client: Optional[LichClient] = None
        self._owed = OneAck()  # the ack of the command in hand
        self.overrides = Overrides()

    def start(self) -> None:
        self._thread.start()

    def submit(self, command: Command) -> None:
        """Queue a command; never blocks, so the poller never waits here."""
        self._queue.put(command)

    def stop(self, timeout: float) -> bool:
        """Start nothing new; let the command being applied finish within
        `timeout` (its ack included). True if the thread ended."""
        self._stopping.set()
        self._queue.put(_STOP)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            self._client = self._client_factory()  # made here: the thread's own session
        except Exception:  # made again at the first ack; the thread goes on
            log.exception("making the worker's lich client failed")
        try:
            for command in iter(self._queue.get, _STOP):
                try:
                    self._take(command)
                except Exception:  # even the catch-all's own ack can fail: the next command still runs
                    log.exception("the worker lost %s (%s)", command.id, command.kind)
        finally:
            if self._client is not None:
                self._client.close()

    def _take(self, command: Command) -> None:
        self._owed = OneAck()
        if self._stopping.is_set():
            self._activity.abandoned(command.id, "the daemon is stopping")
            return
        try:
            self._apply(command)
        except Exception:  # a bug must cost one command, not the thread
            log.exception("applying %s (%s) failed", command.id, command.kind)
            if not self._owed.taken:  # an ack sent, tried or promised is never followed by another
                self._ack_now(command, False, "the daemon failed to apply it (see its log)")

    def _apply(self, command: Command) -> None:
        if command.problem is not None:
            self._ack_now(command, False, command.problem)
        elif command.kind == "prompt":
            self._prompt(command)
        elif command.kind == "command":
            self._slash_command(command)
        elif command.kind == "abort":
            self._abort(command)
        elif command.kind in ("model", "effort"):
            self._override(command)
        else:  # asks never reach the worker; anything else is a bug upstream
            self._ack_now(command, False, "unknown kind")

    # -- started here, acked when the session settles them ---------------

    def _prompt(self, command: Command) -> None:
        if command.notification is not None:
            future = self._engine.submit_prompt(notification_text(command.text, command.notification), as_user=True)
        else:
            future = self._engine.submit_prompt(command.text)
        self._ack_later(command, future, prompt_outcome)

    def _slash_command(self, command: Command) -> None:
        self._ack_later(command, self._engine.run_command(command.name, command.args), call_outcome)

    def _ack_later(self, command: Command, future: "Future[CallResult]", outcome) -> None:
        self._owed.take()  # promised to `settled`, which runs once, whatever comes after

        def settled(done: "Future[CallResult]") -> None:
            try:
                ok, error = outcome(done.result())
            except Exception:  # runs on the settling thread: a bug must still ack
                log.exception("reading the outcome of %s failed", command.id)
                ok, error = False, "the daemon could not read the session's answer (see its log)"
            self._acker.submit(Ack(self._session_id, command.id, command.kind, ok=ok, error=error))

        future.add_done_callback(settled)
        self._activity.waiting(command.id, "session")

    # -- applied and acked before the next command -----------------------

    def _abort(self, command: Command) -> None:
        turn = self._turns.current
        if turn is None:
            self._ack_now(command, False, NO_TURN)
            return
        result = self._quick(command, "turn.abort", self._engine.abort_turn(turn))
        self._ack_now(command, *call_outcome(result))

    def _override(self, command: Command) -> None:
        if command.kind == "model":
            wanted = attrs.evolve(self.overrides, model=command.model)
        else:
            wanted = attrs.evolve(self.overrides, effort=command.effort)
        result = self._quick(command, "overrides.set", self._engine.set_overrides(wanted))
        if result.ok:
            self.overrides = wanted
            self._activity.set_overrides(wanted)
        self._ack_now(command, *call_outcome(result))

    def _quick(self, command: Command, method: str, future: "Future[CallResult]") -> CallResult:
        self._activity.waiting(command.id, "session")
        try:
            return future.result(timeout=self._quick_timeout)
        except FutureTimeout:
            return CallResult.failed(f"{method} did not answer within {self._quick_timeout:g} s")

    def _ack_now(self, command: Command, ok: bool, error: Optional[str]) -> None:
        if not self._owed.take():
            log.error("a second ack for %s (%s) was not sent", command.id, command.kind)
            return
        try:
            self._activity.waiting(command.id, "ack")
        finally:  # the status is bookkeeping: the ack goes out whatever it did
            if self._client is None:
                self._client = self._client_factory()
            send_ack(self._client, self._activity, Ack(self._session_id, command.id, command.kind, ok=ok, error=error))


def call_outcome(result: CallResult):
    return (True, None) if result.ok else (False, result.error or "the session refused it without a reason")


def prompt_outcome(result: CallResult):
    """A prompt a hook or the engine dropped resolves, but did not start a turn."""
    if result.ok and isinstance(result.value, dict) and isinstance(result.value.get("drop"), str):
        return False, result.value["drop"] or "the prompt was dropped without a reason"
    return call_outcome(result)
