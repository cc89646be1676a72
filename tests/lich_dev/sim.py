"""SimEngine: a simulated Claude Code session, for the demo and for trying things by hand.

    python -m lich_dev.sim        the daemon, on this simulated session

It keeps the rules a real session keeps where the daemon can see them: a
prompt starts its turn only once the session is idle, a slash command runs
only once idle, a turn takes a while (several model requests, each sent with
the overrides in force), an abort names the running turn or is rejected, and
a fork answers beside the turn after a delay. Tell it what to do in the text:

  a prompt starting "drop:"          is dropped (the rest is the reason)
  a slash command named "fail"       is rejected
  an ask holding "fail:<reason>"     fails with that reason: nothing-to-fork,
                                     api-error, empty-reply or aborted

Timings come from LICH_SIM_TURN_SECONDS (default 2), LICH_SIM_STEPS (4) and
LICH_SIM_FORK_SECONDS (1). Its one thread owns the session's state; calls
from other threads reach it through the condition.
"""
from __future__ import annotations

import collections
import itertools
import os
import threading
import time
from concurrent.futures import Future
import sys
from typing import Callable, Deque, List, Optional, Tuple

from lich_control.engine import CallResult, Overrides, Turns, resolved

DEFAULT_MODEL = "sim-model"
DEFAULT_EFFORT = "medium"
FORK_FAILURES = {
    "nothing-to-fork": {"isAnswered": False, "reason": "nothing-to-fork"},
    "api-error": {"isAnswered": False, "reason": "api-error", "status": 529, "error": "overloaded", "usage": {}},
    "empty-reply": {"isAnswered": False, "reason": "empty-reply", "usage": {}},
    "aborted": {"isAnswered": False, "reason": "aborted", "usage": {}},
}


class _Turn:
    def __init__(self, turn_id: str, text: str, steps: int):
        self.id, self.text, self.steps = turn_id, text, steps
        self.step = 0
        self.next_at = 0.0
        self.aborts: List[Future] = []


class SimEngine:
    name = "sim"

    def __init__(
        self,
        turns: Turns,
        report: Callable[[str], None] = lambda line: None,
        turn_seconds: Optional[float] = None,
        steps: Optional[int] = None,
        fork_seconds: Optional[float] = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._turns = turns
        self._report = report
        self._turn_seconds = _env_float("LICH_SIM_TURN_SECONDS", 2.0) if turn_seconds is None else turn_seconds
        self._steps = int(_env_float("LICH_SIM_STEPS", 4)) if steps is None else steps
        self._fork_seconds = _env_float("LICH_SIM_FORK_SECONDS", 1.0) if fork_seconds is None else fork_seconds
        self._clock = clock
        self._cond = threading.Condition()
        self._waiting: Deque[Tuple[str, tuple, Future]] = collections.deque()
        self._turn: Optional[_Turn] = None
        self._ids = itertools.count(1)
        self._overrides = Overrides()
        self._closed: Optional[str] = None
        self.steps_sent: List[dict] = []  # every model request, with what it was sent with
        self._thread = threading.Thread(target=self._run, name="lich-sim", daemon=True)
        self._thread.start()

    # -- the Engine interface (any thread) --------------------------------

    def submit_prompt(self, text: str, as_user: bool = False) -> "Future[CallResult]":
        return self._enqueue("prompt", (text, as_user))

    def run_command(self, name: str, args: Optional[str]) -> "Future[CallResult]":
        return self._enqueue("command", (name, args))

    def abort_turn(self, turn_id: str) -> "Future[CallResult]":
        with self._cond:
            if self._closed is not None:
                return resolved(CallResult.failed(self._closed))
            if self._turn is None or self._turn.id != turn_id:
                running = self._turn.id if self._turn else "none"
                return resolved(CallResult.failed(f"{turn_id} is not the running turn (running: {running})"))
            future: "Future[CallResult]" = Future()
            self._turn.aborts.append(future)
            self._cond.notify()
        return future

    def set_overrides(self, overrides: Overrides) -> "Future[CallResult]":
        with self._cond:
            if self._closed is not None:
                return resolved(CallResult.failed(self._closed))
            self._overrides = overrides
        self._report(f"overrides now model={overrides.model or '(session)'} effort={overrides.effort or '(session)'}")
        return resolved(CallResult.answered(None))

    def fork(self, prompt: str) -> "Future[CallResult]":
        if self._closed is not None:
            return resolved(CallResult.failed(self._closed))
        future: "Future[CallResult]" = Future()
        failure = next((reason for reason in FORK_FAILURES if f"fail:{reason}" in prompt), None)
        question = prompt.rsplit("Question: ", 1)[-1]
        self._report(f"fork started for {_short(question)!r}")

        def answer() -> None:
            if self._closed is not None:
                future.set_result(CallResult.failed(self._closed))
                return
            if failure is not None:
                self._report(f"fork for {_short(question)!r} failed: {failure}")
                future.set_result(CallResult.answered(FORK_FAILURES[failure]))
                return
            with self._cond:
                doing = f"turn {self._turn.id} ({_short(self._turn.text)!r})" if self._turn else "nothing: the session is idle"
            self._report(f"fork answered {_short(question)!r}")
            text = f"(simulated) Right now I am working on {doing}."
            future.set_result(CallResult.answered({"isAnswered": True, "text": text, "usage": {}}))

        timer = threading.Timer(self._fork_seconds, answer)
        timer.daemon = True
        timer.start()
        return future

    def close(self, reason: str) -> None:
        with self._cond:
            self._closed = reason
            waiting, self._waiting = list(self._waiting), collections.deque()
            # The session's thread stops with the turn unfinished: an abort
            # waiting on its end would otherwise never settle.
            aborts = self._turn.aborts if self._turn is not None else []
            self._cond.notify()
        for future in [f for _, _, f in waiting] + aborts:
            future.set_result(CallResult.failed(reason))

    # -- the session's own thread ----------------------------------------

    def _enqueue(self, kind: str, payload: tuple) -> "Future[CallResult]":
        with self._cond:
            if self._closed is not None:
                return resolved(CallResult.failed(self._closed))
            future: "Future[CallResult]" = Future()
            self._waiting.append((kind, payload, future))
            self._cond.notify()
            # Read under the lock: the session's thread may end the turn meanwhile.
            busy = self._turn.id if self._turn is not None else None
        if busy is not None:
            self._report(f"{kind} waits for turn {busy} to end")
        return future

    def _run(self) -> None:
        with self._cond:
            while self._closed is None:
                if self._turn is not None:
                    self._advance(self._turn)
                elif self._waiting:
                    kind, payload, future = self._waiting.popleft()
                    (self._start_turn if kind == "prompt" else self._run_command)(payload, future)
                else:
                    self._cond.wait()

    def _start_turn(self, payload: tuple, future: Future) -> None:
        text, as_user = payload
        if text.startswith("drop:"):
            reason = text[5:].strip() or "a plugin dropped it"
            self._report(f"prompt dropped: {reason}")
            future.set_result(CallResult.answered({"drop": reason}))
            return
        turn = self._turn = _Turn(f"t{next(self._ids)}", text, max(1, self._steps))
        turn.next_at = self._clock()
        self._turns.started(turn.id)
        who = "as the user, a task notification" if as_user else "framed as the plugin's"
        self._report(f"turn {turn.id} started ({who}): {_short(text)!r}")
        future.set_result(CallResult.answered({"text": text}))

    def _advance(self, turn: _Turn) -> None:
        if turn.aborts:
            return self._end(turn, "aborted")
        wait = turn.next_at - self._clock()
        if wait > 0:
            self._cond.wait(wait)
            return
        if turn.step == turn.steps:
            return self._end(turn, "answered")
        model = self._overrides.model or DEFAULT_MODEL
        effort = self._overrides.effort or DEFAULT_EFFORT
        self.steps_sent.append({"turn": turn.id, "index": turn.step, "model": model, "effort": effort})
        self._report(f"turn {turn.id} request {turn.step + 1}/{turn.steps} sent with model={model} effort={effort}")
        turn.step += 1
        turn.next_at += self._turn_seconds / turn.steps

    def _end(self, turn: _Turn, how: str) -> None:
        self._turn = None
        self._turns.completed(turn.id)
        self._report(f"turn {turn.id} {how}")
        for future in turn.aborts:
            future.set_result(CallResult.answered(None))

    def _run_command(self, payload: tuple, future: Future) -> None:
        name, args = payload
        line = f"/{name}" + (f" {args}" if args else "")
        if name == "fail":
            self._report(f"{line} rejected")
            future.set_result(CallResult.failed(f"unknown command /{name}"))
            return
        self._report(f"ran {line} (the session was idle)")
        future.set_result(CallResult.answered({"text": f"ran {line}"}))


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


def _short(text: str, limit: int = 48) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _report(line: str) -> None:
    sys.stderr.write(f"session: {line}\n")
    sys.stderr.flush()


if __name__ == "__main__":
    from lich_control import daemon

    sys.exit(daemon.main(simulated=lambda turns: SimEngine(turns, report=_report)))
