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
import os
import sys
import threading
import time
from typing import Callable, Deque, List, Optional, Tuple

from lich_control.bridge import CallResult, Overrides, PendingCalls, Turns

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
        self.aborts: List[str] = []  # the ids of the calls waiting for its end


class SimEngine:
    """The engine interface: each call's Future is `PendingCalls`', as the
    bridge's are, so it settles once, by its deadline at the latest."""

    def __init__(
        self,
        turns: Turns,
        report: Callable[[str], None] = lambda line: None,
        turn_seconds: Optional[float] = None,
        steps: Optional[int] = None,
        fork_seconds: Optional[float] = None,
    ):
        self._turns = turns
        self._report = report
        self._turn_seconds = _env_float("LICH_SIM_TURN_SECONDS", 2.0) if turn_seconds is None else turn_seconds
        self._steps = int(_env_float("LICH_SIM_STEPS", 4)) if steps is None else steps
        self._fork_seconds = _env_float("LICH_SIM_FORK_SECONDS", 1.0) if fork_seconds is None else fork_seconds
        self._calls = PendingCalls()
        self._cond = threading.Condition()
        self._waiting: Deque[Tuple[str, dict, str]] = collections.deque()
        self._turn: Optional[_Turn] = None
        self._turn_count = 0
        self._overrides = Overrides()
        self._closed = False
        self.steps_sent: List[dict] = []  # every model request, with what it was sent with
        self._thread = threading.Thread(target=self._run, name="lich-sim", daemon=True)
        self._thread.start()

    # -- the engine interface (any thread) --------------------------------

    def call(self, method: str, args: dict, timeout: Optional[float]):
        call_id, future = self._calls.add(method, timeout)
        if future.done():
            return future  # closed
        if method in ("prompt.submit", "command.run"):
            self._enqueue(method, args, call_id)
        elif method == "turn.abort":
            self._abort(args["turnId"], call_id)
        elif method == "overrides.set":
            with self._cond:
                self._overrides = Overrides(args["model"], args["effort"])
            self._report(f"overrides now model={args['model'] or '(session)'} effort={args['effort'] or '(session)'}")
            self._calls.settle(call_id, CallResult.answered(None))
        elif method == "model.fork":
            self._fork(args["prompt"], call_id)
        else:
            self._calls.settle(call_id, CallResult.failed(f"this session has no method {method}"))
        return future

    def close(self, reason: str) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._calls.close(reason)

    def _abort(self, turn_id: str, call_id: str) -> None:
        with self._cond:
            if self._turn is not None and self._turn.id == turn_id:
                self._turn.aborts.append(call_id)  # settled as the turn ends
                self._cond.notify()
                return
            running = self._turn.id if self._turn else "none"
        self._calls.settle(call_id, CallResult.failed(f"{turn_id} is not the running turn (running: {running})"))

    def _fork(self, prompt: str, call_id: str) -> None:
        failure = next((reason for reason in FORK_FAILURES if f"fail:{reason}" in prompt), None)
        question = prompt.rsplit("Question: ", 1)[-1]
        self._report(f"fork started for {_short(question)!r}")

        def answer() -> None:
            if failure is not None:
                self._report(f"fork for {_short(question)!r} failed: {failure}")
                self._calls.settle(call_id, CallResult.answered(FORK_FAILURES[failure]))
                return
            with self._cond:
                doing = f"turn {self._turn.id} ({_short(self._turn.text)!r})" if self._turn else "nothing: the session is idle"
            self._report(f"fork answered {_short(question)!r}")
            text = f"(simulated) Right now I am working on {doing}."
            self._calls.settle(call_id, CallResult.answered({"isAnswered": True, "text": text, "usage": {}}))

        timer = threading.Timer(self._fork_seconds, answer)
        timer.daemon = True
        timer.start()

    def _enqueue(self, method: str, args: dict, call_id: str) -> None:
        with self._cond:
            self._waiting.append((method, args, call_id))
            self._cond.notify()
            # Read under the lock: the session's thread may end the turn meanwhile.
            busy = self._turn.id if self._turn is not None else None
        if busy is not None:
            kind = "prompt" if method == "prompt.submit" else "command"
            self._report(f"{kind} waits for turn {busy} to end")

    # -- the session's own thread ----------------------------------------

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                if self._turn is not None:
                    self._advance(self._turn)
                elif self._waiting:
                    method, args, call_id = self._waiting.popleft()
                    (self._start_turn if method == "prompt.submit" else self._run_command)(args, call_id)
                else:
                    self._cond.wait()

    def _start_turn(self, args: dict, call_id: str) -> None:
        text = args["text"]
        if text.startswith("drop:"):
            reason = text[5:].strip() or "a plugin dropped it"
            self._report(f"prompt dropped: {reason}")
            self._calls.settle(call_id, CallResult.answered({"drop": reason}))
            return
        self._turn_count += 1
        turn = self._turn = _Turn(f"t{self._turn_count}", text, max(1, self._steps))
        turn.next_at = time.monotonic()
        self._turns.started(turn.id)
        who = "as the user, a task notification" if args.get("asUser") else "framed as the plugin's"
        self._report(f"turn {turn.id} started ({who}): {_short(text)!r}")
        self._calls.settle(call_id, CallResult.answered({"text": text}))

    def _advance(self, turn: _Turn) -> None:
        if turn.aborts:
            return self._end(turn, "aborted")
        wait = turn.next_at - time.monotonic()
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
        for call_id in turn.aborts:
            self._calls.settle(call_id, CallResult.answered(None))

    def _run_command(self, args: dict, call_id: str) -> None:
        name, rest = args["command"], args.get("args")
        line = f"/{name}" + (f" {rest}" if rest else "")
        if name == "fail":
            self._report(f"{line} rejected")
            self._calls.settle(call_id, CallResult.failed(f"unknown command /{name}"))
            return
        self._report(f"ran {line} (the session was idle)")
        self._calls.settle(call_id, CallResult.answered({"text": f"ran {line}"}))


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
